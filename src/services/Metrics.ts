/**
 * Every metric Sweeper exports, defined once (names and descriptions are what dashboards and alert
 * rules depend on: the contract), and the `Metrics` service that updates and renders them. Programs
 * and the run guard call `increment`, `setGauge` and `observe`; the HTTP server asks for
 * `prometheusText`. The implementation (layers/MetricsPrometheus.ts) keeps the series and samples
 * the process figures at each scrape, so a spec can swap it like any other service.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Metric from "effect/Metric"

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

export const directUploadsDeletedTotal = Metric.counter("sweeper_direct_uploads_deleted_total", {
  description: "Stale pending direct uploads whose object and Redis entry were deleted",
  incremental: true
})

export const directUploadsInvalidEntriesTotal = Metric.counter("sweeper_direct_uploads_invalid_entries_total", {
  description: "Malformed pending_direct_uploads entries seen (skipped, never deleted)",
  incremental: true
})

export const directUploadsFailedDeletesTotal = Metric.counter("sweeper_direct_uploads_failed_deletes_total", {
  description: "Stale direct uploads whose object could not be deleted (entry kept for the next run)",
  incremental: true
})

export const directUploadsSkippedNoStoreTotal = Metric.counter("sweeper_direct_uploads_skipped_no_store_total", {
  description: "Stale direct uploads of a location with no object store configured (entry removed, no object deleted)",
  incremental: true
})

export const directUploadsVanishedTotal = Metric.counter("sweeper_direct_uploads_vanished_total", {
  description:
    "Stale direct uploads whose entry vanished or changed value before the repair recorded it (neither removed nor recorded)",
  incremental: true
})

export const directUploadsPending = Metric.gauge("sweeper_direct_uploads_pending_entries", {
  description: "Entries in pending_direct_uploads when delete-stale-direct-uploads last started"
})

export const stuckExportJobsFailedTotal = Metric.counter("sweeper_stuck_export_jobs_failed_total", {
  description: "Project export jobs whose Sidekiq job completed without finishing them, marked failed",
  incremental: true
})

export const issueRebalancesRescheduledTotal = Metric.counter("sweeper_issue_rebalances_rescheduled_total", {
  description: "Issues::RebalancingWorker jobs enqueued for stuck rebalances, by container type",
  incremental: true
})

export const issueRebalancesDuplicatesTotal = Metric.counter("sweeper_issue_rebalances_duplicates_total", {
  description: "Rebalance reschedules dropped because the same job was still pending (until_executed)",
  incremental: true
})

export const issueRebalancesInvalidMembersTotal = Metric.counter("sweeper_issue_rebalances_invalid_members_total", {
  description: "Members of the running-rebalances set that are not \"1/<id>\" or \"2/<id>\"",
  incremental: true
})

export const concurrencyLimitQueueJobs = Metric.gauge("sidekiq_concurrency_limit_queue_jobs", {
  description: "Jobs deferred by the Sidekiq concurrency limit, per worker"
})

export const concurrencyLimitMaxConcurrentJobs = Metric.gauge("sidekiq_concurrency_limit_max_concurrent_jobs", {
  description: "Concurrency limit per worker (0 unlimited, negative: circuit breaker open)"
})

export const concurrencyLimitCurrentConcurrentJobs = Metric.gauge("sidekiq_concurrency_limit_current_concurrent_jobs", {
  description: "Running plus resumed-but-not-started jobs per worker"
})

export const concurrencyLimitResumedJobsTotal = Metric.counter("sweeper_concurrency_limit_resumed_jobs_total", {
  description: "Deferred jobs moved back to their Sidekiq queue, per worker",
  incremental: true
})

export const eventsPrunedTotal = Metric.counter("sweeper_events_pruned_total", {
  description: "Events older than SWEEPER_EVENT_RETENTION deleted from sweeper_events by prune-events",
  incremental: true
})

/**
 * A decomposed GitLab's ci repairs write their events into ci's outbox and relay them to main's
 * ledger; a relay that fails leaves them waiting there and is retried (layers/postgres/Outbox.ts).
 */
export const outboxRelayOwed = Metric.gauge("sweeper_outbox_relay_owed", {
  description:
    "1 while ci repairs' events wait in ci's outbox after a relay to main's ledger failed (retried every 5 s), else 0"
})

export const outboxRelayFailuresTotal = Metric.counter("sweeper_outbox_relay_failures_total", {
  description: "Relays of ci repairs' events to main's ledger that failed (the events stay in ci's outbox)",
  incremental: true
})

export const jobRelayOwed = Metric.gauge("sweeper_job_relay_owed", {
  description:
    "1 while dropped builds' after-transition jobs wait in sweeper_job_outbox_batches after a relay to Sidekiq failed (retried every 5 s), else 0"
})

export const jobRelayFailuresTotal = Metric.counter("sweeper_job_relay_failures_total", {
  description: "Relays of dropped builds' after-transition jobs to Sidekiq that failed (the jobs stay in the outbox)",
  incremental: true
})

export const jobsRelayedTotal = Metric.counter("sweeper_jobs_relayed_total", {
  description:
    "After-transition jobs of dropped builds pushed to Sidekiq (PipelineProcessWorker, Ci::BuildFinishedWorker, …)",
  incremental: true
})

/**
 * Health gate: 1 while `signal` holds `batch`. The gate's series are labelled by signal (and batch);
 * a PostgreSQL signal's also by `database` (main, ci): which of GitLab's databases it was read on.
 */
export const repairHeld = Metric.gauge("sweeper_repair_held", {
  description: "1 while the health gate holds the batch on the signal (of the database, for PostgreSQL signals), else 0"
})

export const repairHeldSecondsTotal = Metric.counter("sweeper_repair_held_seconds_total", {
  description: "Seconds the health gate has held the batch on the signal",
  incremental: true
})

export const healthSignal = Metric.gauge("sweeper_health_signal", {
  description:
    "The health signal's last reading in its unit (bytes, seconds, bytes/s, used/max ratio, tables under vacuum, a rule's value); the worst over its stores, queues or tables; PostgreSQL signals per database"
})

export const healthSignalUnknown = Metric.gauge("sweeper_health_signal_unknown", {
  description: "1 while the health signal cannot be read (no privilege, server down, bad answer), else 0"
})

export const healthSignalUnknownTotal = Metric.counter("sweeper_health_signal_unknown_total", {
  description: "Samples of the health signal that could not be read",
  incremental: true
})

export const concurrencyLimitEffectiveLimit = Metric.gauge("sidekiq_concurrency_limit_effective_limit", {
  description:
    "The concurrency limit in force per worker: the configured one, or lower while the health gate throttles it"
})

export const shadowOutcomesTotal = Metric.counter("sweeper_shadow_outcomes_total", {
  description:
    "Shadow mode's verdicts on what a batch proposed or GitLab repaired (matched, mismatched, sweeperOnly, gitlabOnly, ignored)",
  incremental: true
})

export const ticksMissedTotal = Metric.counter("sweeper_ticks_missed_total", {
  description:
    "Scheduled ticks that did not run, by batch and reason (downtime, overlap, lease_unavailable, breaker_open, disabled, paused, …)",
  incremental: true
})

export const buildInfo = Metric.gauge("sweeper_build_info", {
  description: "Always 1; the labels say which Sweeper and Node.js this process runs"
})

export const batchPaused = Metric.gauge("sweeper_batch_paused", {
  description: "1 while the batch is paused (BatchPaused without a later BatchResumed), else 0"
})

export const batchDisabled = Metric.gauge("sweeper_batch_disabled", {
  description: "1 when the batch is listed in SWEEPER_DISABLED_BATCHES, else 0"
})

/**
 * The batch's configured period (its cron, SWEEPER_CRON_<BATCH> applied), so one alert rule can say
 * "no success for two periods" for every batch and follow the configuration without being edited.
 */
export const batchPeriodSeconds = Metric.gauge("sweeper_batch_period_seconds", {
  description: "Length of the batch's current cron period in seconds (latest tick to the next)"
})

export const batchBreakerOpen = Metric.gauge("sweeper_batch_breaker_open", {
  description: "1 while the scheduler's circuit breaker skips the batch's ticks, else 0"
})

/** Outcomes every `batch × outcome` series starts with, at 0, so `increase()` sees the first one. */
export const OUTCOMES = ["succeeded", "failed", "timed_out", "skipped", "abandoned"] as const
export const MISSED_REASONS = [
  "downtime",
  "overlap",
  "lease_unavailable",
  "breaker_open",
  "disabled",
  "paused",
  "database_unavailable"
] as const

export type Attributes = Readonly<Record<string, string>>

export class Metrics extends Context.Service<Metrics, {
  /** Adds `n` to a counter's series for `attributes` (nothing for 0). */
  increment(counter: Metric.Counter<number>, n: number, attributes?: Attributes): Effect.Effect<void>
  setGauge(gauge: Metric.Gauge<number>, value: number, attributes?: Attributes): Effect.Effect<void>
  /** One observation of a histogram (a run's duration). */
  observe(histogram: Metric.Histogram<number>, value: number, attributes?: Attributes): Effect.Effect<void>
  /**
   * Every run and missed-tick series of every batch, present from start-up at 0 (OUTCOMES ×
   * MISSED_REASONS), the pruned-events counter and the outbox relay's series, so `increase()` sees the
   * first event and "nothing pruned for days while the table grows" is an expression over a series
   * that exists.
   */
  initialiseSeries(batches: ReadonlyArray<string>): Effect.Effect<void>
  /** Every series as Prometheus text (0.0.4), with the process figures read now. */
  readonly prometheusText: Effect.Effect<string>
}>()("sweeper/services/Metrics") {}

// The call shapes programs and the runtime use, each a call to the service.

export const increment = (
  counter: Metric.Counter<number>,
  n: number,
  attributes: Attributes = {}
): Effect.Effect<void, never, Metrics> => Metrics.use((metrics) => metrics.increment(counter, n, attributes))

/** Several counters at once, in order (a run's closing figures). */
export const incrementEach = (
  counts: ReadonlyArray<readonly [Metric.Counter<number>, number]>,
  attributes: Attributes = {}
): Effect.Effect<void, never, Metrics> =>
  Metrics.use((metrics) =>
    Effect.forEach(counts, ([counter, n]) => metrics.increment(counter, n, attributes), { discard: true })
  )

export const setGauge = (
  gauge: Metric.Gauge<number>,
  value: number,
  attributes: Attributes = {}
): Effect.Effect<void, never, Metrics> => Metrics.use((metrics) => metrics.setGauge(gauge, value, attributes))

/** A worker's three concurrency-limit gauges, as GitLab's resume worker reports them on each pass. */
export const setConcurrencyLimitGauges = (
  worker: string,
  figures: { readonly queueSize: number; readonly limit: number; readonly current: number }
): Effect.Effect<void, never, Metrics> =>
  Effect.all([
    setGauge(concurrencyLimitQueueJobs, figures.queueSize, { worker }),
    setGauge(concurrencyLimitMaxConcurrentJobs, figures.limit, { worker }),
    setGauge(concurrencyLimitCurrentConcurrentJobs, figures.current, { worker })
  ], { discard: true })

export const observe = (
  histogram: Metric.Histogram<number>,
  value: number,
  attributes: Attributes = {}
): Effect.Effect<void, never, Metrics> => Metrics.use((metrics) => metrics.observe(histogram, value, attributes))

export const initialiseSeries = (batches: ReadonlyArray<string>): Effect.Effect<void, never, Metrics> =>
  Metrics.use((metrics) => metrics.initialiseSeries(batches))

export const prometheusText: Effect.Effect<string, never, Metrics> = Metrics.use((metrics) => metrics.prometheusText)
