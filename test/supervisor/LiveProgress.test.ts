/**
 * A running batch's progress as the console shows it: while the run guard runs a
 * program, `liveRun` has the units it reported and what they add up to; once the run ends it is gone.
 */
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Fiber, Option } from "effect"
import { TestClock } from "effect/testing"
import { randomUUID } from "node:crypto"
import { type Batch, reportProgress } from "../../src/domain/Batch.ts"
import { liveRun } from "../../src/supervisor/LiveProgress.ts"
import { runBatch } from "../../src/supervisor/RunGuard.ts"
import { MemoryPlatform } from "../support/memory.ts"

describe("live progress", () => {
  it.effect("units and repairs so far while the run runs, nothing after", () =>
    Effect.gen(function*() {
      const reported = yield* Deferred.make<void>()
      const release = yield* Deferred.make<void>()
      const batch: Batch<{ dropped: number }, never, never> = {
        name: `live-${randomUUID().slice(0, 8)}`,
        worker: "FakeWorker",
        description: "reports three pages, then waits",
        cron: "* * * * *",
        budget: Duration.minutes(1),
        lease: Option.none(),
        run: Effect.gen(function*() {
          for (const dropped of [100, 100, 37]) yield* reportProgress({ dropped })
          yield* Deferred.succeed(reported, undefined)
          yield* Deferred.await(release)
          return { dropped: 237 }
        })
      }
      assert.isNull(liveRun(batch.name))
      const fiber = yield* Effect.forkChild(runBatch(batch, { trigger: "manual" }))
      yield* Deferred.await(reported)
      const live = liveRun(batch.name)
      assert.isNotNull(live)
      assert.strictEqual(live!.units, 3)
      assert.deepStrictEqual(live!.counts, { dropped: 237 })
      yield* Deferred.succeed(release, undefined)
      yield* TestClock.adjust(0)
      const result = yield* Fiber.join(fiber)
      assert.strictEqual(result.outcome, "succeeded")
      assert.strictEqual(live!.runId, result.runId)
      assert.isNull(liveRun(batch.name))
    }).pipe(Effect.provide(MemoryPlatform())))
})
