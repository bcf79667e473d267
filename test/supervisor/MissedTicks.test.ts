/**
 * Ticks that cannot start because PostgreSQL is down are not lost: the run guard refuses to run
 * without its RunStarted, the scheduler counts the tick in sweeper_ticks_missed_total{batch,reason},
 * logs it, keeps TickMissed{database_unavailable} in memory and writes it once appends succeed again.
 */
import { assert, describe, it } from "@effect/vitest"
import { ConfigProvider, Context, Duration, Effect, Layer, Option, Ref } from "effect"
import { PrometheusMetrics } from "effect/observability"
import { TestClock } from "effect/testing"
import { randomUUID } from "node:crypto"
import { RedisError } from "../../src/domain/Errors.ts"
import { MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import type { RegisteredBatch } from "../../src/programs/index.ts"
import { EventLog } from "../../src/services/EventLog.ts"
import { Scheduler, schedulerLayer } from "../../src/supervisor/Scheduler.ts"
import { MemoryPlatform } from "../support/memory.ts"

const T0 = Date.parse("2026-05-01T00:01:00Z")
const at = (hhmmss: string) => `2026-05-01T${hhmmss}.000Z`

/** The memory event log behind a switch: while `down`, every append and query fails like a lost connection. */
class Outage extends Context.Service<Outage, { down: boolean }>()("test/Outage") {}
const FlakyEvents = Layer.effect(
  EventLog,
  Effect.gen(function*() {
    const inner = yield* EventLog
    const outage = yield* Outage
    const refuse = Effect.fail(
      new RedisError({ operation: "sql", cause: new Error("connect ECONNREFUSED 127.0.0.1:5432") }) as never
    )
    return EventLog.of({
      append: (event) => outage.down ? refuse : inner.append(event),
      appendAll: (events) => outage.down ? refuse : inner.appendAll(events),
      query: (filter) => outage.down ? refuse : inner.query(filter),
      transaction: inner.transaction
    })
  })
)
const platform = FlakyEvents.pipe(
  Layer.provideMerge(MemoryPlatform()),
  Layer.provideMerge(Layer.sync(Outage, () => ({ down: false })))
)

const missedTotal = (batch: string) =>
  Effect.map(PrometheusMetrics.format(), (text) => {
    const line = text.split("\n").find((l) =>
      l.startsWith("sweeper_ticks_missed_total{") && l.includes(`batch="${batch}"`) &&
      l.includes(`reason="database_unavailable"`)
    )
    return line === undefined ? 0 : Number(line.split(" ").at(-1))
  })

describe("ticks missed while the database is down", () => {
  it.effect("are counted, then written as TickMissed{database_unavailable} once appends succeed; not counted as failed runs", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const runs = yield* Ref.make(0)
      const batch: RegisteredBatch = {
        name: `test-${randomUUID().slice(0, 8)}`,
        worker: "TestWorker",
        description: "test",
        cron: "*/10 * * * *",
        budget: Duration.minutes(5),
        lease: Option.none(),
        run: Ref.updateAndGet(runs, (n) => n + 1)
      }
      const built = yield* Layer.build(schedulerLayer([batch])).pipe(
        Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromEnv({ env: {} }))
      )
      const scheduler = Context.get(built, Scheduler)
      const outage = yield* Outage
      const stored = Effect.map(MemoryEvents, (all) => all.filter((e) => e.stream === `batch:${batch.name}`))

      outage.down = true
      yield* TestClock.adjust("9 minutes") // 00:10
      yield* TestClock.adjust("10 minutes") // 00:20
      assert.strictEqual(yield* Ref.get(runs), 0, "no run starts without its RunStarted")
      assert.lengthOf(yield* stored, 0)
      assert.strictEqual(yield* missedTotal(batch.name), 2)
      const during = (yield* scheduler.snapshots)[0]!
      assert.strictEqual(during.history.consecutiveFailures, 0, "an outage is not the batch's failure")

      outage.down = false
      yield* TestClock.adjust("10 minutes") // 00:30: flushes first, then runs
      assert.strictEqual(yield* Ref.get(runs), 1)
      const events = (yield* stored).map((e) => [e.type, e.data.scheduled_at, e.data.reason ?? e.data.outcome])
      assert.deepStrictEqual(events, [
        ["TickMissed", at("00:10:00"), "database_unavailable"],
        ["TickMissed", at("00:20:00"), "database_unavailable"],
        ["RunStarted", at("00:30:00"), undefined],
        ["RunFinished", undefined, "succeeded"]
      ])
      // Written once.
      yield* TestClock.adjust("10 minutes")
      assert.lengthOf((yield* stored).filter((e) => e.type === "TickMissed"), 2)
    }).pipe(Effect.scoped, Effect.provide(platform)))
})
