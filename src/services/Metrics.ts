/**
 * Every metric Sweeper exports, defined once. Programs and the run guard update these; the HTTP
 * server renders them as Prometheus text (`prometheusText`).
 */
import { Effect, Metric } from "effect"
import { PrometheusMetrics } from "effect/observability"

export const runsTotal = Metric.counter("sweeper_runs_total", {
  description: "Batch runs by batch and outcome",
  incremental: true
})

export const runDurationSeconds = Metric.histogram("sweeper_run_duration_seconds", {
  description: "Wall time of batch runs",
  boundaries: [0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 1800]
})

export const lastSuccessTimestamp = Metric.gauge("sweeper_last_success_timestamp_seconds", {
  description: "Epoch seconds of each batch's last successful run"
})

export const leaseSkipsTotal = Metric.counter("sweeper_lease_skips_total", {
  description: "Runs skipped because another holder had the batch's exclusive lease",
  incremental: true
})

export const buildsDroppedTotal = Metric.counter("sweeper_drop_canceling_builds_dropped_total", {
  description: "Builds stuck in canceling that were failed with stuck_or_timeout_failure",
  incremental: true
})

export const buildsDoomedTotal = Metric.counter("sweeper_drop_canceling_builds_doomed_total", {
  description: "Builds that could not be dropped after optimistic-lock retries and were doomed",
  incremental: true
})

/** Adds `n` to a counter, with attributes. */
export const increment = (
  counter: Metric.Counter<number>,
  n: number,
  attributes: Record<string, string> = {}
): Effect.Effect<void> =>
  n === 0 ? Effect.void : Metric.update(Metric.withAttributes(counter, attributes), n)

export const setGauge = (
  gauge: Metric.Gauge<number>,
  value: number,
  attributes: Record<string, string> = {}
): Effect.Effect<void> => Metric.update(Metric.withAttributes(gauge, attributes), value)

export const prometheusText: Effect.Effect<string> = PrometheusMetrics.format()
