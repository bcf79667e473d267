/**
 * The health gate on a decomposed GitLab, under TestClock over in-memory signals for each database:
 * a batch is judged on the database it writes (the drop-* batches ci, the others main), so ci's
 * standby lagging holds drop-canceling-builds and not stuck-export-jobs, and main's the reverse;
 * autovacuum counts on the database that keeps the table (a vacuum of the write-locked copy in main
 * holds nothing); the fresh per-unit read asks only the batch's database; events, report and
 * metrics name the database. Without a ci database of its own, one database (main) is read once.
 */
import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect, Fiber, Layer, Schema } from "effect"
import { TestClock } from "effect/testing"
import type { HealthConfig } from "../../src/domain/Health.ts"
import { HealthJson } from "../../src/domain/HealthConfig.ts"
import { type GatedBatch, HealthGateLive } from "../../src/layers/health/HealthGateLive.ts"
import { EventLogMemory, MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import {
  DatabaseSignalsMemory,
  HealthSignalsMemory,
  MemoryCiSignalValues,
  MemorySignalValues
} from "../../src/layers/memory/HealthSignalsMemory.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { batches } from "../../src/programs/index.ts"
import { HealthGate } from "../../src/services/HealthGate.ts"
import { HealthReport } from "../../src/services/HealthReport.ts"
import { prometheusText } from "../../src/services/Metrics.ts"
import { settled } from "../support/gate.ts"

/** The registry's own batches, with what they really write. */
const registered = (name: string): GatedBatch => {
  const batch = batches.find((b) => b.name === name)!
  return { name: batch.name, writes: batch.writes }
}
const DROP = registered("drop-canceling-builds")
const EXPORTS = registered("stuck-export-jobs")

const health = (json: unknown): HealthConfig => Schema.decodeUnknownSync(HealthJson)(JSON.stringify(json))

const Gate = (json: unknown, decomposed: boolean) =>
  HealthGateLive({ config: health(json), batches: [DROP, EXPORTS], concurrencyLimits: {} }).pipe(
    Layer.provide(decomposed ? DatabaseSignalsMemory : Layer.empty),
    Layer.provideMerge(HealthSignalsMemory),
    Layer.provideMerge(Layer.merge(MemorySignalValues.layer, MemoryCiSignalValues.layer)),
    Layer.provideMerge(EventLogMemory),
    Layer.provideMerge(MemoryEvents.layer),
    Layer.provideMerge(MetricsPrometheus)
  )

const LAG = { replicationLag: { stop: "8MB", resume: "2MB" } }
const second = TestClock.adjust(Duration.seconds(1))

const held = Effect.map(
  MemoryEvents,
  (events) =>
    events.filter((e) => e.type === "RepairHeld").map((e) => ({
      batch: e.data.batch,
      signal: e.data.signal,
      database: e.data.database
    }))
)

/** The batch asks once with a deadline one second on: whether it proceeded, and what held it. */
const ask = (batch: GatedBatch) =>
  Effect.gen(function*() {
    const gate = yield* HealthGate
    const now = yield* Effect.clockWith((clock) => clock.currentTimeMillis)
    const fiber = yield* gate.beforeUnit({ batch: batch.name, deadlineMillis: now + 1000 }).pipe(Effect.forkChild)
    yield* second
    const verdict = yield* Fiber.join(fiber)
    return [verdict.proceed, verdict.heldBy] as const
  })

describe("HealthGate per database (decomposed GitLab)", () => {
  it.effect("ci's standby lagging holds the ci batch, not the main one; the event, report and metrics say ci", () =>
    Effect.gen(function*() {
      const ci = yield* MemoryCiSignalValues
      ci.replicationLagBytes = 38_000_000
      yield* second
      assert.deepStrictEqual(yield* ask(EXPORTS), [true, []])
      assert.deepStrictEqual(yield* ask(DROP), [false, ["replicationLag"]])
      assert.deepStrictEqual(yield* held, [{ batch: DROP.name, signal: "replicationLag", database: "ci" }])

      const report = yield* (yield* HealthReport).snapshot
      assert.deepStrictEqual(
        report.signals.map((s) => [s.signal, s.subject, s.database, s.state]),
        [["replicationLag", "ci", "ci", "over"], ["replicationLag", "main", "main", "ok"]]
      )
      const text = yield* prometheusText
      assert.include(text, `sweeper_health_signal{signal="replicationLag",database="ci"} 38000000`)
      assert.include(text, `sweeper_health_signal{signal="replicationLag",database="main"} 0`)
      assert.include(text, `sweeper_repair_held{batch="drop-canceling-builds",signal="replicationLag",database="ci"} 0`)
      assert.include(text, `sweeper_repair_held{batch="stuck-export-jobs",signal="replicationLag",database="main"} 0`)
    }).pipe(Effect.provide(Gate(LAG, true))))

  it.effect("main's standby lagging holds the main batch, not the ci one", () =>
    Effect.gen(function*() {
      const main = yield* MemorySignalValues
      main.replicationLagBytes = 38_000_000
      yield* second
      assert.deepStrictEqual(yield* ask(DROP), [true, []])
      assert.deepStrictEqual(yield* ask(EXPORTS), [false, ["replicationLag"]])
      assert.deepStrictEqual(yield* held, [{ batch: EXPORTS.name, signal: "replicationLag", database: "main" }])
      const report = yield* (yield* HealthReport).snapshot
      assert.deepStrictEqual(report.holds, [])
    }).pipe(Effect.provide(Gate(LAG, true))))

  it.effect("a hold in progress says its database in the report's line", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const ci = yield* MemoryCiSignalValues
      ci.replicationLagBytes = 38_000_000
      yield* second
      const fiber = yield* gate.beforeUnit({ batch: DROP.name }).pipe(Effect.forkChild)
      yield* settled
      const report = yield* (yield* HealthReport).snapshot
      assert.deepStrictEqual(report.holds.map((h) => [h.database, h.text]), [
        ["ci", "drop-canceling-builds held by replicationLag on ci: 38 MB > 8 MB since 00:00:01"]
      ])
      ci.replicationLagBytes = 0
      yield* second
      assert.isTrue((yield* Fiber.join(fiber)).proceed)
      const events = yield* MemoryEvents
      assert.deepStrictEqual(
        events.filter((e) => e.type === "RepairReleased").map((e) => e.data.database),
        ["ci"]
      )
    }).pipe(Effect.provide(Gate(LAG, true))))

  it.effect("the fresh read before a unit asks the batch's own database", () =>
    Effect.gen(function*() {
      const main = yield* MemorySignalValues
      const ci = yield* MemoryCiSignalValues
      const gate = yield* HealthGate
      yield* second
      // The round's readings are in (the sampler's fiber applies what its reads bring back).
      yield* settled
      const before = { main: main.reads["pg_stat_replication"] ?? 0, ci: ci.reads["pg_stat_replication"] ?? 0 }
      // WAL written since the round (same instant): only ci's standby fell behind.
      ci.replicationLagBytes = 9_000_000
      const drop = yield* gate.beforeUnit({ batch: DROP.name, deadlineMillis: 0 })
      assert.deepStrictEqual([drop.proceed, drop.heldBy], [false, ["replicationLag"]])
      assert.strictEqual(main.reads["pg_stat_replication"], before.main, "main not read for a ci unit")
      assert.strictEqual(ci.reads["pg_stat_replication"], before.ci + 1)
      const exports = yield* gate.beforeUnit({ batch: EXPORTS.name, deadlineMillis: 0 })
      assert.isTrue(exports.proceed)
      assert.strictEqual(main.reads["pg_stat_replication"], before.main + 1)
    }).pipe(Effect.provide(Gate(LAG, true))))

  it.effect("autovacuum counts where the table is kept: the write-locked copy's vacuum in main holds nothing", () =>
    Effect.gen(function*() {
      const main = yield* MemorySignalValues
      const ci = yield* MemoryCiSignalValues
      main.vacuuming = ["ci_builds", "project_export_jobs"]
      yield* second
      assert.deepStrictEqual(yield* ask(DROP), [true, []])
      assert.deepStrictEqual(yield* ask(EXPORTS), [false, ["autovacuum"]])
      main.vacuuming = []
      ci.vacuuming = ["ci_builds"]
      yield* second
      assert.deepStrictEqual(yield* ask(DROP), [false, ["autovacuum"]])
      assert.deepStrictEqual((yield* held).map((h) => [h.batch, h.database]), [
        [EXPORTS.name, "main"],
        [DROP.name, "ci"]
      ])
    }).pipe(Effect.provide(Gate({ autovacuum: { stop: true } }, true))))

  it.effect("not decomposed: one database, main, read once per round for every batch", () =>
    Effect.gen(function*() {
      const main = yield* MemorySignalValues
      const ci = yield* MemoryCiSignalValues
      main.replicationLagBytes = 38_000_000
      for (let i = 0; i < 10; i++) yield* second
      assert.isAtMost(main.reads["pg_stat_replication"]!, 11)
      assert.isUndefined(ci.reads["pg_stat_replication"])
      assert.deepStrictEqual(yield* ask(DROP), [false, ["replicationLag"]])
      assert.deepStrictEqual(yield* ask(EXPORTS), [false, ["replicationLag"]])
      assert.deepStrictEqual((yield* held).map((h) => h.database), ["main", "main"])
      const report = yield* (yield* HealthReport).snapshot
      assert.deepStrictEqual(report.signals.map((s) => [s.signal, s.subject, s.database]), [
        ["replicationLag", "main", "main"]
      ])
    }).pipe(Effect.provide(Gate(LAG, false))))
})
