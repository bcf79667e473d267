/**
 * A manual run asked for while the batch is busy waits in its actor's mailbox. If the asker gives
 * up (the CLI's request is cancelled, the client disconnects), the run must not start later on its
 * own: nobody is there for its answer, and the operator who cancelled believes nothing will happen.
 */
import { assert, describe, it } from "@effect/vitest"
import { ConfigProvider, Context, Duration, Effect, Fiber, Layer, Option, Ref, Scope } from "effect"
import { TestClock } from "effect/testing"
import { MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import type { RegisteredBatch } from "../../src/programs/index.ts"
import { Scheduler, schedulerLayer } from "../../src/supervisor/Scheduler.ts"
import { MemoryPlatform } from "../support/memory.ts"

const T0 = Date.parse("2026-05-01T00:01:00Z")

describe("a cancelled manual run", () => {
  it.effect("is withdrawn from the mailbox: it never starts once the run ahead of it ends", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const runs = yield* Ref.make(0)
      // The scheduled run at 00:10 takes 20 minutes; the ones after it are instant.
      const batch: RegisteredBatch = {
        name: "test-batch",
        worker: "TestWorker",
        description: "test",
        cron: "0 */6 * * *",
        budget: Duration.hours(1),
        lease: Option.none(),
        run: Effect.flatMap(
          Ref.updateAndGet(runs, (n) => n + 1),
          (n) => n === 1 ? Effect.sleep("20 minutes") : Effect.void
        )
      }
      const scope = yield* Scope.make()
      const context = yield* Layer.buildWithScope(schedulerLayer([batch]), scope).pipe(
        Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromEnv({ env: {} }))
      )
      const scheduler = Context.get(context, Scheduler)
      const first = yield* Effect.forkChild(scheduler.runNow("test-batch"))
      yield* TestClock.adjust("1 second")
      assert.strictEqual(yield* Ref.get(runs), 1)
      // The second asker waits behind the first, then gives up.
      const second = yield* Effect.forkChild(scheduler.runNow("test-batch"))
      yield* TestClock.adjust("1 minute")
      yield* Fiber.interrupt(second)
      yield* TestClock.adjust("20 minutes")
      assert.strictEqual((yield* Fiber.join(first)).outcome, "succeeded")
      yield* TestClock.adjust("1 minute")
      assert.strictEqual(yield* Ref.get(runs), 1, "the withdrawn run never started")
      const started = (yield* MemoryEvents).filter((e) => e.type === "RunStarted")
      assert.lengthOf(started, 1)
      // A later request still runs: withdrawing one did not stop the actor.
      assert.strictEqual((yield* scheduler.runNow("test-batch")).outcome, "succeeded")
      assert.strictEqual(yield* Ref.get(runs), 2)
    }).pipe(Effect.provide(MemoryPlatform({}))))
})
