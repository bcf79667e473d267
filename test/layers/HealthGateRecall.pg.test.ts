/**
 * The gate's open holds are the fold of the event log's RepairHeld / RepairReleased: a gate that starts
 * (a restarted supervisor) reads each batch's gate events from a real PostgreSQL event log and closes
 * every hold whose run ended without releasing it — as of that run's RunFinished, under that run's id —
 * and reports, without closing, a hold whose run the log does not say finished (another process's run
 * may still hold it). A run of the batch entering later closes it once its run's RunFinished is in.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Option, Schema } from "effect"
import { randomUUID } from "node:crypto"
import { CurrentRun, type RunInfo } from "../../src/domain/Batch.ts"
import { type DomainEvent, RepairHeld, RunFinished, type StoredEvent } from "../../src/domain/Events.ts"
import { HealthJson } from "../../src/domain/HealthConfig.ts"
import { type GatedBatch, HealthGateLive } from "../../src/layers/health/HealthGateLive.ts"
import { HealthSignalsMemory, MemorySignalValues } from "../../src/layers/memory/HealthSignalsMemory.ts"
import { EventLogSql } from "../../src/layers/postgres/EventLogSql.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { EventLog } from "../../src/services/EventLog.ts"
import { HealthGate } from "../../src/services/HealthGate.ts"
import { HealthReport } from "../../src/services/HealthReport.ts"
import { PgTest } from "../support/postgres.ts"

const DROP: GatedBatch = { name: "drop-canceling-builds", writes: { tables: ["ci_builds", "sweeper_events"] } }
const EXPORTS: GatedBatch = { name: "stuck-export-jobs", writes: { tables: ["project_export_jobs", "sweeper_events"] } }

const config = Schema.decodeUnknownSync(HealthJson)(JSON.stringify({
  replicationLag: { stop: "8MB", resume: "2MB" },
  walRate: { stop: "48MB/s" }
}))

/** The stopped process's side: its events, in a log of their own (no gate running yet). */
const Ledger = EventLogSql.pipe(Layer.provideMerge(PgTest))

/** The restarted process's gate, over the same log. */
const restartedGate = HealthGateLive({ config, batches: [DROP, EXPORTS], concurrencyLimits: {} }).pipe(
  Layer.provideMerge(HealthSignalsMemory),
  Layer.provideMerge(MemorySignalValues.layer),
  Layer.provideMerge(MetricsPrometheus)
)

const runOf = (runId: string, batch: string): RunInfo => ({
  runId,
  batch,
  dryRun: false,
  budget: Option.none(),
  fence: Option.none()
})

const appendAs = (run: RunInfo, event: DomainEvent) =>
  Effect.flatMap(EventLog, (log) => log.append(event)).pipe(Effect.provideService(CurrentRun, run))

const held = (signal: string, value: number) =>
  new RepairHeld({
    batch: DROP.name,
    signal,
    value,
    threshold: 8e6,
    stop: "8MB",
    unit: signal === "walRate" ? "bytes/s" : "bytes",
    database: "main"
  })

const finished = new RunFinished({
  batch: DROP.name,
  outcome: "abandoned",
  summary: null,
  duration_ms: 60_000,
  dryRun: false
})

const eventsOf = (runId: string) => Effect.flatMap(EventLog, (log) => log.query({ runId }))
const one = (events: ReadonlyArray<StoredEvent>, type: string) => events.find((e) => e.type === type)!

/** A run of another batch asks the gate: by its answer the actor has handled every earlier request. */
const askedOnce = (batch: string) =>
  Effect.flatMap(HealthGate, (gate) => gate.beforeUnit({ batch })).pipe(
    Effect.provideService(CurrentRun, runOf(randomUUID(), batch))
  )

describe("the health gate after a restart (PostgreSQL event log)", () => {
  it.live("closes a hold whose run ended without releasing it, and reports one whose run may still hold it", () =>
    Effect.gen(function*() {
      const ended = runOf(randomUUID(), DROP.name)
      const elsewhere = runOf(randomUUID(), DROP.name)
      // The stopped process: run `ended` held on replication lag and died; its RunFinished (abandoned)
      // was written since. Run `elsewhere` holds on the WAL rate with no RunFinished yet.
      yield* appendAs(ended, held("replicationLag", 9e6))
      yield* Effect.sleep("20 millis")
      yield* appendAs(ended, finished)
      yield* appendAs(elsewhere, held("walRate", 60e6))

      yield* Effect.gen(function*() {
        yield* askedOnce(EXPORTS.name)
        const endedEvents = yield* eventsOf(ended.runId!)
        const released = one(endedEvents, "RepairReleased")
        assert.isDefined(released, "the ended run's hold is released")
        assert.deepStrictEqual(released.data, {
          batch: DROP.name,
          signal: "replicationLag",
          heldMs: one(endedEvents, "RunFinished").occurredAt.getTime() -
            one(endedEvents, "RepairHeld").occurredAt.getTime(),
          reason: "run_ended",
          database: "main"
        })
        // The other is reported as held, never released by a process that did not hold it.
        const holds = (yield* (yield* HealthReport).snapshot).holds
        assert.deepStrictEqual(holds.map((h) => [h.batch, h.signal, h.display]), [[DROP.name, "walRate", "60 MB/s"]])
        assert.isUndefined((yield* eventsOf(elsewhere.runId!)).find((e) => e.type === "RepairReleased"))

        // Its run ends (closed as abandoned); the next run of the batch closes the hold with it.
        yield* appendAs(elsewhere, finished)
        const verdict = yield* askedOnce(DROP.name)
        assert.deepStrictEqual(verdict, { proceed: true, heldMs: 0, heldBy: [] })
        const elsewhereEvents = yield* eventsOf(elsewhere.runId!)
        assert.strictEqual(one(elsewhereEvents, "RepairReleased").data.reason, "run_ended")
        assert.deepStrictEqual((yield* (yield* HealthReport).snapshot).holds, [])
      }).pipe(Effect.provide(restartedGate))
    }).pipe(Effect.provide(Ledger)))
})
