/**
 * concurrency-limit-resume under the real health gate (memory signals, TestClock): its worker
 * loops run concurrently and are held together, so the run's heldMs is the hold's wall-clock time,
 * not one copy per worker; and a dry run during the same hold neither waits nor writes a gate event.
 */
import { assert, describe, it } from "@effect/vitest"
import { DateTime, Duration, Effect, Fiber, Layer, Option, Schema } from "effect"
import { TestClock } from "effect/testing"
import { CurrentRun } from "../../src/domain/Batch.ts"
import { workerKeys, workerLeaseName } from "../../src/domain/ConcurrencyLimit.ts"
import { HealthJson } from "../../src/domain/HealthConfig.ts"
import { leaseKey } from "../../src/domain/Lease.ts"
import { HealthGateLive } from "../../src/layers/health/HealthGateLive.ts"
import { MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import { HealthSignalsMemory, MemorySignalValues } from "../../src/layers/memory/HealthSignalsMemory.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { ConcurrencyLimitResume } from "../../src/programs/ConcurrencyLimitResume.ts"
import { settled } from "../support/gate.ts"
import { MemoryPlatform } from "../support/memory.ts"

const NOW = DateTime.makeUnsafe("2026-03-01T12:00:00Z")
const NOW_S = DateTime.toEpochMillis(NOW) / 1000
const WORKERS = ["A::OneWorker", "B::TwoWorker", "C::ThreeWorker", "D::FourWorker"]

const Platform = Layer.unwrap(Effect.sync(() => {
  const limits = Object.fromEntries(WORKERS.map((w) => [w, { limit: 5, queue: "default" }]))
  return HealthGateLive({
    config: Schema.decodeUnknownSync(HealthJson)(JSON.stringify({ replicationLag: { stop: "8MB", resume: "2MB" } })),
    batches: [ConcurrencyLimitResume],
    concurrencyLimits: limits
  }).pipe(
    Layer.provideMerge(HealthSignalsMemory),
    Layer.provideMerge(MemorySignalValues.layer),
    Layer.provideMerge(MemoryPlatform({ concurrencyLimits: limits }))
  )
}))

/** The clock set before the gate starts sampling (its schedule would replay every second since 1970). */
const atNow = <A, E, R>(body: Effect.Effect<A, E, R>) =>
  Effect.andThen(TestClock.setTime(DateTime.toEpochMillis(NOW)), Effect.provide(body, Platform))

const seed = Effect.gen(function*() {
  const redis = yield* MemoryRedis
  for (const worker of WORKERS) {
    redis.rpush(
      workerKeys(worker).deferred,
      JSON.stringify({ args: [1], context: {}, buffered_at: NOW_S - 300 }),
      JSON.stringify({ args: [2], context: {}, buffered_at: NOW_S - 299 })
    )
  }
})

const gateEvents = Effect.map(
  MemoryEvents,
  (events) => events.filter((e) => e.type === "RepairHeld" || e.type === "RepairReleased").map((e) => e.type)
)

describe("concurrency-limit-resume under the health gate", () => {
  it.effect("four worker loops held together for 10 s: heldMs is 10 s, one event pair", () =>
    Effect.gen(function*() {
      yield* seed
      const values = yield* MemorySignalValues
      values.replicationLagBytes = 38_000_000
      yield* TestClock.adjust(Duration.seconds(1))
      const fiber = yield* ConcurrencyLimitResume.run.pipe(Effect.forkChild)
      yield* settled
      yield* TestClock.adjust(Duration.seconds(10))
      values.replicationLagBytes = 0
      yield* TestClock.adjust(Duration.minutes(2))
      const summary = yield* Fiber.join(fiber)
      assert.deepStrictEqual(summary.heldBy, ["replicationLag"])
      assert.isAtLeast(summary.heldMs, 10_000)
      assert.isAtMost(summary.heldMs, 11_000, `${summary.heldMs} ms: one copy of the hold, not one per worker`)
      assert.deepStrictEqual(yield* gateEvents, ["RepairHeld", "RepairReleased"])
    }).pipe(atNow))

  it.effect("after a shared hold every worker re-checks its own lease: leases taken by another process during it resume nothing", () =>
    Effect.gen(function*() {
      yield* seed
      const values = yield* MemorySignalValues
      values.replicationLagBytes = 38_000_000
      yield* TestClock.adjust(Duration.seconds(1))
      const fiber = yield* ConcurrencyLimitResume.run.pipe(Effect.forkChild)
      yield* settled
      // Held 3 s (under a third of the lease TTL: no background renewal sees it), while another
      // process takes over every worker's lease.
      const redis = yield* MemoryRedis
      for (const worker of WORKERS) redis.set(leaseKey(workerLeaseName(worker)), "another-process", { exSeconds: 60 })
      yield* TestClock.adjust(Duration.seconds(3))
      values.replicationLagBytes = 0
      yield* TestClock.adjust(Duration.minutes(2))
      const summary = yield* Fiber.join(fiber)
      assert.strictEqual(summary.resumedJobs, 0, "no worker resumed on a lease that is not its own")
      for (const worker of WORKERS) assert.strictEqual(redis.llen(workerKeys(worker).deferred), 2)
    }).pipe(atNow))

  it.effect("a dry run during the hold returns at once, writes no gate event, and names what would hold it", () =>
    Effect.gen(function*() {
      yield* seed
      const values = yield* MemorySignalValues
      values.replicationLagBytes = 38_000_000
      yield* TestClock.adjust(Duration.seconds(1))
      const fiber = yield* ConcurrencyLimitResume.run.pipe(
        Effect.provideService(CurrentRun, {
          runId: null,
          batch: null,
          dryRun: true,
          budget: Option.none(),
          fence: Option.none()
        }),
        Effect.forkChild
      )
      // Its one pass per worker needs no time: held, it would wait out its whole budget.
      yield* TestClock.adjust(Duration.millis(10))
      const summary = yield* Fiber.join(fiber)
      assert.deepStrictEqual([summary.heldMs, summary.heldBy], [0, ["replicationLag"]])
      assert.deepStrictEqual(yield* gateEvents, [])
    }).pipe(atNow))
})
