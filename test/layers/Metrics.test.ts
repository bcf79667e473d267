/**
 * Metrics is a service like the others: programs reach it through `increment`/`setGauge`, so a spec
 * (or another backend) can stand in for it; MetricsPrometheus renders effect's registry as
 * Prometheus text with the process figures read at the scrape.
 */
import { assert, describe, it } from "@effect/vitest"
import { DateTime, Effect, Layer, type Metric } from "effect"
import { TestClock } from "effect/testing"
import { MemoryExportJobs } from "../../src/layers/memory/ExportJobsMemory.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { StuckExportJobs } from "../../src/programs/StuckExportJobs.ts"
import {
  directUploadsPending,
  increment,
  initialiseSeries,
  Metrics,
  prometheusText,
  runsTotal,
  setGauge,
  stuckExportJobsFailedTotal
} from "../../src/services/Metrics.ts"
import { MemoryPlatform } from "../support/memory.ts"

const NOW = DateTime.makeUnsafe("2026-03-01T12:30:00Z")

/** A Metrics that only records what it was asked to do. */
const recording = () => {
  const calls: Array<{ readonly metric: string; readonly value: number; readonly attributes: unknown }> = []
  const record = (metric: Metric.Metric<number, unknown>, value: number, attributes: unknown = {}) =>
    Effect.sync(() => void calls.push({ metric: metric.id, value, attributes }))
  const layer = Layer.succeed(
    Metrics,
    Metrics.of({
      increment: record,
      setGauge: record,
      observe: record,
      initialiseSeries: () => Effect.void,
      prometheusText: Effect.succeed("")
    })
  )
  return { calls, layer }
}

describe("Metrics", () => {
  it.effect("a program's counters go through the Metrics service the layers provide", () => {
    const { calls, layer } = recording()
    return Effect.gen(function*() {
      yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
      const jobs = yield* MemoryExportJobs
      // A started export whose Sidekiq job is gone (no status key): stuck, failed by the run.
      jobs.jobs.set(1, {
        id: 1,
        projectId: 101,
        jid: "jid-1",
        status: 1,
        createdAt: DateTime.subtractDuration(NOW, "1 hour"),
        updatedAt: DateTime.subtractDuration(NOW, "1 hour")
      })
      const summary = yield* StuckExportJobs.run
      assert.strictEqual(summary.failed, 1)
      assert.deepStrictEqual(calls, [{ metric: stuckExportJobsFailedTotal.id, value: 1, attributes: {} }])
    }).pipe(Effect.provide(Layer.provideMerge(layer, MemoryPlatform())))
  })

  it.effect("MetricsPrometheus: counters with their attributes, nothing for 0, series initialised at 0, process figures at each scrape", () =>
    Effect.gen(function*() {
      yield* increment(stuckExportJobsFailedTotal, 0)
      yield* increment(runsTotal, 3, { batch: "metrics-spec", outcome: "succeeded" })
      yield* initialiseSeries(["metrics-spec-idle"])
      const text = yield* prometheusText
      assert.include(text, `sweeper_runs_total{batch="metrics-spec",outcome="succeeded"} 3`)
      assert.include(text, `sweeper_runs_total{batch="metrics-spec-idle",outcome="failed"} 0`)
      assert.include(text, `sweeper_ticks_missed_total{batch="metrics-spec-idle",reason="downtime"} 0`)
      for (
        const name of [
          "process_resident_memory_bytes",
          "process_cpu_seconds_total",
          "process_start_time_seconds",
          "nodejs_heap_used_bytes",
          "nodejs_eventloop_lag_p99_seconds",
          "nodejs_active_resources"
        ]
      ) {
        assert.match(text, new RegExp(`^${name} \\d`, "m"), name)
      }
      assert.notInclude(text, "sweeper_stuck_export_jobs_failed_total ", "an increment of 0 writes no series")
      yield* setGauge(directUploadsPending, 7)
      assert.include(yield* prometheusText, "sweeper_direct_uploads_pending_entries 7")
    }).pipe(Effect.provide(MetricsPrometheus)))
})
