/**
 * The health gate layer under TestClock, over in-memory signals: a healthy gate answers
 * at once; a signal past stop holds the batch, re-checking every second, and releases only at
 * resume (one RepairHeld/RepairReleased pair per hold, the held gauge and seconds counter); a
 * deadline reached while held ends the call with proceed false; signals apply only to what the
 * batch writes; unknown readings are healthy unless `onUnknown: "hold"`; the sampler reads each
 * signal at most once a second however often batches ask; concurrency limits are throttled.
 */
import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect, Fiber, Layer, Option, Schema } from "effect"
import { TestClock } from "effect/testing"
import type { HealthConfig } from "../../src/domain/Health.ts"
import { HealthJson } from "../../src/domain/HealthConfig.ts"
import { type GatedBatch, HealthGateLive } from "../../src/layers/health/HealthGateLive.ts"
import { EventLogMemory, MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import { HealthSignalsMemory, MemorySignalValues } from "../../src/layers/memory/HealthSignalsMemory.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { HealthGate } from "../../src/services/HealthGate.ts"
import { HealthReport } from "../../src/services/HealthReport.ts"
import { prometheusText } from "../../src/services/Metrics.ts"
import { settled } from "../support/gate.ts"

const DROP: GatedBatch = { name: "drop-canceling-builds", writes: { tables: ["ci_builds", "sweeper_events"] } }
const UPLOADS: GatedBatch = {
  name: "delete-stale-direct-uploads",
  writes: { tables: ["sweeper_events"], redisStores: ["sharedState"] }
}
const RESUME: GatedBatch = {
  name: "concurrency-limit-resume",
  writes: { tables: ["sweeper_events"], redisStores: ["queues"], concurrencyLimitQueues: true }
}
const BARE: GatedBatch = { name: "writes-nothing" }

const health = (json: unknown): HealthConfig => Schema.decodeUnknownSync(HealthJson)(JSON.stringify(json))

const Gate = (json: unknown, batches: ReadonlyArray<GatedBatch> = [DROP, UPLOADS, RESUME, BARE]) =>
  HealthGateLive({
    config: health(json),
    batches,
    concurrencyLimits: { "Releases::CreateEvidenceWorker": { limit: 10, queue: "evidence" } }
  }).pipe(
    Layer.provideMerge(HealthSignalsMemory),
    Layer.provideMerge(MemorySignalValues.layer),
    Layer.provideMerge(EventLogMemory),
    Layer.provideMerge(MemoryEvents.layer),
    Layer.provideMerge(MetricsPrometheus)
  )

const LAG = { replicationLag: { stop: "8MB", resume: "2MB" } }

const second = TestClock.adjust(Duration.seconds(1))
const seconds = (n: number) => Effect.repeat(second, { times: n - 1 })

const gateEvents = Effect.gen(function*() {
  const events = yield* MemoryEvents
  return events.filter((e) => e.type === "RepairHeld" || e.type === "RepairReleased").map((
    e
  ): Record<string, unknown> => ({ type: e.type, ...e.data }))
})

describe("HealthGate layer", () => {
  it.effect("healthy: proceeds at once, writes nothing", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const verdict = yield* gate.beforeUnit({ batch: DROP.name })
      assert.deepStrictEqual(verdict, { proceed: true, heldMs: 0, heldBy: [] })
      assert.deepStrictEqual(yield* gateEvents, [])
    }).pipe(Effect.provide(Gate(LAG))))

  it.effect("holds past stop, stays held between resume and stop, releases at resume: one event pair", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const values = yield* MemorySignalValues
      values.replicationLagBytes = 38_000_000
      yield* second
      const fiber = yield* gate.beforeUnit({ batch: DROP.name }).pipe(Effect.forkChild)
      yield* settled
      assert.deepStrictEqual(yield* gateEvents, [{
        type: "RepairHeld",
        batch: DROP.name,
        signal: "replicationLag",
        value: 38_000_000,
        threshold: 8_000_000,
        stop: "8MB",
        unit: "bytes",
        // One database (ci not decomposed): main, as every PostgreSQL signal is read there.
        database: "main"
      }])
      const report = yield* (yield* HealthReport).snapshot
      assert.deepStrictEqual(report.holds.map((h) => h.text), [
        "drop-canceling-builds held by replicationLag on main: 38 MB > 8 MB since 00:00:01"
      ])
      assert.include(
        yield* prometheusText,
        `sweeper_repair_held{batch="drop-canceling-builds",signal="replicationLag",database="main"} 1`
      )

      // Under stop but over resume: still held (hysteresis), re-checked every second.
      values.replicationLagBytes = 5_000_000
      yield* seconds(3)
      assert.isUndefined(fiber.pollUnsafe())
      values.replicationLagBytes = 2_000_000
      yield* seconds(2)
      const verdict = yield* Fiber.join(fiber)
      assert.isTrue(verdict.proceed)
      assert.deepStrictEqual(verdict.heldBy, ["replicationLag"])
      assert.isAtLeast(verdict.heldMs, 4000)
      assert.isAtMost(verdict.heldMs, 6000)
      const events = yield* gateEvents
      assert.deepStrictEqual(events.map((e) => e.type), ["RepairHeld", "RepairReleased"])
      assert.strictEqual(events[1]!.heldMs, verdict.heldMs)
      assert.deepStrictEqual((yield* (yield* HealthReport).snapshot).holds, [])
      const text = yield* prometheusText
      assert.include(
        text,
        `sweeper_repair_held{batch="drop-canceling-builds",signal="replicationLag",database="main"} 0`
      )
      const counted = Number(
        /sweeper_repair_held_seconds_total\{batch="drop-canceling-builds",signal="replicationLag",database="main"\} ([\d.]+)/
          .exec(text)?.[1]
      )
      assert.isAtLeast(counted, 4)
      // The next unit: healthy again, no new events.
      assert.deepStrictEqual(yield* gate.beforeUnit({ batch: DROP.name }), { proceed: true, heldMs: 0, heldBy: [] })
      assert.strictEqual((yield* gateEvents).length, 2)
    }).pipe(Effect.provide(Gate(LAG))))

  it.effect("a deadline reached while held: proceed false, the hold closed with reason budget", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const values = yield* MemorySignalValues
      values.replicationLagBytes = 100_000_000
      yield* second
      const fiber = yield* gate.beforeUnit({ batch: DROP.name, deadlineMillis: 3_500 }).pipe(Effect.forkChild)
      yield* settled
      yield* seconds(3)
      const verdict = yield* Fiber.join(fiber)
      assert.deepStrictEqual(verdict, { proceed: false, heldMs: 2_500, heldBy: ["replicationLag"] })
      const events = yield* gateEvents
      assert.deepStrictEqual(events.map((e) => [e.type, e.reason]), [["RepairHeld", undefined], [
        "RepairReleased",
        "budget"
      ]])
    }).pipe(Effect.provide(Gate(LAG))))

  it.effect("signals apply to what the batch writes: autovacuum on its tables, memory of its stores, latency of its queues", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const values = yield* MemorySignalValues
      values.vacuuming = ["project_export_jobs"]
      values.redisMemory = { queuesMetadata: 0.99 }
      values.queueLatency = { default: 3600 }
      yield* second
      // None of those is written by drop-canceling-builds or delete-stale-direct-uploads.
      assert.isTrue((yield* gate.beforeUnit({ batch: DROP.name })).proceed)
      assert.isTrue((yield* gate.beforeUnit({ batch: UPLOADS.name })).proceed)
      assert.isTrue((yield* gate.beforeUnit({ batch: BARE.name })).proceed)
      assert.deepStrictEqual(yield* gateEvents, [])
      // Its own table, store and queue (the configured worker's queue "evidence") hold it.
      values.vacuuming = ["ci_builds"]
      values.redisMemory = { sharedState: 0.95 }
      values.queueLatency = { evidence: 900 }
      yield* second
      const held = yield* Effect.all([
        gate.beforeUnit({ batch: DROP.name, deadlineMillis: 1 }),
        gate.beforeUnit({ batch: UPLOADS.name, deadlineMillis: 1 }),
        gate.beforeUnit({ batch: RESUME.name, deadlineMillis: 1 })
      ])
      assert.deepStrictEqual(held.map((v) => [v.proceed, v.heldBy]), [
        [false, ["autovacuum"]],
        [false, ["redisMemory"]],
        [false, ["queueLatency"]]
      ])
    }).pipe(Effect.provide(Gate({
      autovacuum: { stop: true },
      redisMemory: { stop: 0.9, resume: 0.8 },
      queueLatency: { stop: "5m", resume: "1m" }
    }))))

  it.effect("unknown: healthy and counted by default; onUnknown hold holds until readable and healthy", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const values = yield* MemorySignalValues
      values.replicationLagBytes = "permission denied"
      values.oldestTransaction = "connection refused"
      yield* second
      const fiber = yield* gate.beforeUnit({ batch: DROP.name }).pipe(Effect.forkChild)
      yield* settled
      const events = yield* gateEvents
      assert.deepStrictEqual(events.map((e) => [e.signal, e.value, e.unknown]), [[
        "longTransactions",
        null,
        "pg_stat_activity: connection refused"
      ]])
      const text = yield* prometheusText
      assert.include(text, `sweeper_health_signal_unknown{signal="replicationLag",database="main"} 1`)
      assert.include(
        text,
        `sweeper_health_signal{signal="replicationLag",database="main"} NaN`,
        "unreadable is no reading, not 0"
      )
      assert.match(text, /sweeper_health_signal_unknown_total\{signal="replicationLag",database="main"\} [1-9]/)
      values.oldestTransaction = 30
      yield* second
      const verdict = yield* Fiber.join(fiber)
      assert.deepStrictEqual(verdict.heldBy, ["longTransactions"])
    }).pipe(Effect.provide(Gate({ ...LAG, longTransactions: { stop: "10m", onUnknown: "hold" } }))))

  it.effect("the sampler reads each signal at most once a second, however often batches ask; the WAL position once more per unit", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const values = yield* MemorySignalValues
      for (let s = 0; s < 10; s++) {
        for (let i = 0; i < 100; i++) yield* gate.beforeUnit({ batch: DROP.name })
        yield* second
      }
      assert.isAtMost(values.reads["pg_stat_activity"]!, 11)
      // The standbys' positions are read before every unit: one cheap query, so a unit never writes past stop.
      assert.isAtMost(values.reads["pg_stat_replication"]!, 1011)
      assert.isAtLeast(values.reads["pg_stat_replication"]!, 1000)
    }).pipe(Effect.provide(Gate({ ...LAG, longTransactions: { stop: "10m" } }))))

  it.effect("walRate relative to its own median: a burst past 3x holds, back under 1.5x releases", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const values = yield* MemorySignalValues
      let position = 0
      const at = (rate: number, n: number) =>
        Effect.gen(function*() {
          for (let i = 0; i < n; i++) {
            position += rate
            values.walPosition = position
            yield* second
          }
        })
      // Warm-up: an idle sampler's samples (one each IDLE_INTERVAL) over ten minutes.
      yield* at(10e6, 600)
      assert.isTrue((yield* gate.beforeUnit({ batch: DROP.name })).proceed)
      assert.deepStrictEqual(yield* gateEvents, [])
      // A batch runs: the sampler reads every second again.
      yield* at(10e6, 11)
      yield* at(50e6, 2)
      const fiber = yield* gate.beforeUnit({ batch: DROP.name }).pipe(Effect.forkChild)
      yield* settled
      assert.deepStrictEqual((yield* gateEvents).map((e) => [e.type, e.signal]), [["RepairHeld", "walRate"]])
      assert.match(
        (yield* (yield* HealthReport).snapshot).holds[0]!.text,
        /held by walRate on main: 50 MB\/s > 3x median \(30 MB\/s\)/
      )
      yield* at(20e6, 3)
      assert.isUndefined(fiber.pollUnsafe())
      yield* at(15e6, 2)
      assert.deepStrictEqual((yield* Fiber.join(fiber)).heldBy, ["walRate"])
    }).pipe(Effect.provide(Gate({ walRate: { stop: "3x", resume: "1.5x" } }))))

  it.effect("throttleLimits: PostgreSQL signals throttle concurrency-limit-resume's limit instead of holding it; queueLatency still holds", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const values = yield* MemorySignalValues
      const worker = "Releases::CreateEvidenceWorker"
      assert.include(yield* prometheusText, `sidekiq_concurrency_limit_effective_limit{worker="${worker}"} 10`)
      values.replicationLagBytes = 50_000_000
      yield* second
      assert.isTrue((yield* gate.beforeUnit({ batch: RESUME.name })).proceed, "not held: throttled")
      const limits: Array<number> = []
      for (let pass = 0; pass < 5; pass++) {
        limits.push(yield* gate.effectiveLimit({ batch: RESUME.name, worker, limit: 10 }))
        yield* second
      }
      assert.deepStrictEqual(limits, [8, 6, 4, 2, 1])
      assert.include(yield* prometheusText, `sidekiq_concurrency_limit_effective_limit{worker="${worker}"} 1`)
      // Hysteresis applies to throttling too: under stop but over resume is still unhealthy.
      values.replicationLagBytes = 5_000_000
      yield* second
      assert.strictEqual(yield* gate.effectiveLimit({ batch: RESUME.name, worker, limit: 10 }), 1)
      values.replicationLagBytes = 0
      yield* second
      const recovering: Array<number> = []
      for (let pass = 0; pass < 10; pass++) {
        recovering.push(yield* gate.effectiveLimit({ batch: RESUME.name, worker, limit: 10 }))
      }
      assert.deepStrictEqual(recovering, [2, 3, 4, 5, 6, 7, 8, 9, 10, 10])
      assert.deepStrictEqual((yield* (yield* HealthReport).snapshot).throttled, [{ worker, limit: 10, effective: 10 }])
      // Other batches are held by the same signal as usual.
      values.replicationLagBytes = 50_000_000
      yield* second
      assert.isFalse((yield* gate.beforeUnit({ batch: DROP.name, deadlineMillis: 1 })).proceed)
      // queueLatency always holds concurrency-limit-resume.
      values.queueLatency = { evidence: 600 }
      yield* second
      assert.deepStrictEqual((yield* gate.beforeUnit({ batch: RESUME.name, deadlineMillis: 1 })).heldBy, [
        "queueLatency"
      ])
    }).pipe(Effect.provide(Gate({ ...LAG, queueLatency: { stop: "5m", resume: "1m" }, throttleLimits: true }))))

  it.effect("without throttleLimits the limit is never touched", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const values = yield* MemorySignalValues
      values.replicationLagBytes = 50_000_000
      yield* second
      assert.strictEqual(yield* gate.effectiveLimit({ batch: RESUME.name, worker: "W", limit: 10 }), 10)
    }).pipe(Effect.provide(Gate(LAG))))

  it.effect("the report lists every signal on every subject with its reading, thresholds and state", () =>
    Effect.gen(function*() {
      const values = yield* MemorySignalValues
      values.replicationLagBytes = 9_000_000
      values.redisMemory = { sharedState: 0.5, queues: "maxmemory is 0 (no limit): used/max has no meaning" }
      yield* second
      const report = yield* (yield* HealthReport).snapshot
      assert.isTrue(report.configured)
      assert.deepStrictEqual(
        report.signals.map((s) => [s.signal, s.subject, s.database, s.state, s.display, s.stop, s.resume]),
        [
          ["replicationLag", "main", "main", "over", "9 MB", "8 MB", "2 MB"],
          ["redisMemory", "sharedState", undefined, "ok", "0.5", "0.9", "0.8"],
          ["redisMemory", "queues", undefined, "unknown", "unknown", "0.9", "0.8"]
        ]
      )
      assert.isTrue(Option.isSome(Option.fromNullishOr(report.signals[0]!.readAt)))
    }).pipe(Effect.provide(Gate({ ...LAG, redisMemory: { stop: 0.9, resume: 0.8 } }))))
})
