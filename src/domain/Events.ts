/**
 * Every run and every repair is an event in `sweeper_events`. Each event class knows its
 * stream; `data` is the class's encoded fields.
 */
import * as Schema from "effect/Schema"

/**
 * A run's id as the run guard makes it (a UUID): a filter by anything else can match nothing, and
 * PostgreSQL would refuse it as a bad uuid, so the edges refuse it first, naming their own flag.
 */
export const isRunId = (text: string): boolean =>
  /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(text)

const Outcome = Schema.Literals(["succeeded", "failed", "timed_out", "skipped", "abandoned"])

export class RunStarted extends Schema.TaggedClass<RunStarted>()("RunStarted", {
  batch: Schema.String,
  run_id: Schema.String,
  scheduled_at: Schema.NullOr(Schema.String),
  node: Schema.String,
  trigger: Schema.Literals(["schedule", "manual", "startup"]),
  dryRun: Schema.Boolean,
  /** The run's budget: a later run may close this one as abandoned once budget + grace has passed. */
  budget_ms: Schema.optionalKey(Schema.Number),
  /** The fencing epoch of the exclusive lease the run holds: a newer epoch proves this run is over. */
  lease_epoch: Schema.optionalKey(Schema.Number)
}) {}

export class RunFinished extends Schema.TaggedClass<RunFinished>()("RunFinished", {
  batch: Schema.String,
  outcome: Outcome,
  summary: Schema.Unknown,
  duration_ms: Schema.Number,
  dryRun: Schema.Boolean,
  /** Items repaired (in a dry run: that would be), from the batch's `repairedCounts`; absent when unknown. */
  repaired: Schema.optionalKey(Schema.Number),
  reason: Schema.optionalKey(Schema.String),
  error: Schema.optionalKey(Schema.String),
  /** A dry run's would-be targets (first 100) and their total. */
  targets: Schema.optionalKey(Schema.Array(Schema.String)),
  targetsTotal: Schema.optionalKey(Schema.Number),
  /**
   * How many of the run's repair events were not yet in the ledger when it finished (a decomposed
   * GitLab's ci repairs, still in ci's outbox): the run's RunEventsRelayed follows once they all are.
   * Absent: every event of the run precedes this RunFinished.
   */
  eventsOwed: Schema.optionalKey(Schema.Number)
}) {}

/**
 * Closes a run whose RunFinished said events were owed: every repair event of the run is in the
 * ledger, before this one. Appended once, by the relay that finds the last of them delivered.
 */
export class RunEventsRelayed extends Schema.TaggedClass<RunEventsRelayed>()("RunEventsRelayed", {
  batch: Schema.String,
  /** What the run's RunFinished said was owed. */
  events: Schema.Number
}) {}

export class TickMissed extends Schema.TaggedClass<TickMissed>()("TickMissed", {
  batch: Schema.String,
  scheduled_at: Schema.String,
  reason: Schema.Literals([
    "downtime",
    "overlap",
    "lease_unavailable",
    "breaker_open",
    "disabled",
    "paused",
    "database_unavailable"
  ])
}) {}

export class BatchPaused extends Schema.TaggedClass<BatchPaused>()("BatchPaused", {
  batch: Schema.String,
  by: Schema.String
}) {}

export class BatchResumed extends Schema.TaggedClass<BatchResumed>()("BatchResumed", {
  batch: Schema.String,
  by: Schema.String
}) {}

export class LeaseLostEvent extends Schema.TaggedClass<LeaseLostEvent>()("LeaseLost", {
  batch: Schema.String,
  lease: Schema.String,
  epoch: Schema.Number
}) {}

export class BuildDropped extends Schema.TaggedClass<BuildDropped>()("BuildDropped", {
  id: Schema.Number,
  /** Present when builds live in GitLab's partitioned p_ci_builds (the stream stays build:<id>). */
  partition_id: Schema.optionalKey(Schema.Number),
  project_id: Schema.Number,
  runner_id: Schema.NullOr(Schema.Number),
  /** The build's pipeline (GitLab's commit_id), when it has one: the run page lists the pipelines touched. */
  pipeline_id: Schema.optionalKey(Schema.Number),
  /**
   * The reason the build was dropped with. Written to its row when it ends `failed`; a canceling
   * build GitLab's way ends `canceled` with its failure_reason left as it was.
   */
  failure_reason: Schema.Number,
  /** `canceled` when it ended canceled (GitLab's drop of a canceling build); absent: failed. */
  status: Schema.optionalKey(Schema.Literal("canceled")),
  /** The stuck-builds family's rule that dropped it (GitLab's build_stuck_type); absent for canceling. */
  stuck_type: Schema.optionalKey(Schema.Literals(["outdated", "stuck", "waiting_for_ack"])),
  /** Which batch's rule (pending_outdated, pending_stuck, running_outdated, scheduled_outdated). */
  rule: Schema.optionalKey(Schema.String)
}) {}

export class BuildDoomed extends Schema.TaggedClass<BuildDoomed>()("BuildDoomed", {
  id: Schema.Number,
  /** Present when builds live in GitLab's partitioned p_ci_builds (the stream stays build:<id>). */
  partition_id: Schema.optionalKey(Schema.Number),
  project_id: Schema.Number,
  runner_id: Schema.NullOr(Schema.Number),
  pipeline_id: Schema.optionalKey(Schema.Number),
  failure_reason: Schema.Number
}) {}

export class ExportJobFailed extends Schema.TaggedClass<ExportJobFailed>()("ExportJobFailed", {
  id: Schema.Number,
  jid: Schema.String,
  project_id: Schema.Number
}) {}

export class StaleDirectUploadDeleted
  extends Schema.TaggedClass<StaleDirectUploadDeleted>()("StaleDirectUploadDeleted", {
    location: Schema.String,
    path: Schema.String,
    preparedAt: Schema.Number
  })
{}

/**
 * A stale upload whose location has no object store configured: nothing could be deleted, so only
 * its pending entry was removed (GitLab does the same); `reason` says so, where a
 * StaleDirectUploadDeleted would claim an object gone.
 */
export class StaleDirectUploadEntryRemoved
  extends Schema.TaggedClass<StaleDirectUploadEntryRemoved>()("StaleDirectUploadEntryRemoved", {
    location: Schema.String,
    path: Schema.String,
    preparedAt: Schema.Number,
    reason: Schema.Literal("no object store")
  })
{}

export class RebalanceRescheduled extends Schema.TaggedClass<RebalanceRescheduled>()("RebalanceRescheduled", {
  type: Schema.Literals([1, 2]),
  id: Schema.Number,
  jid: Schema.NullOr(Schema.String),
  duplicate: Schema.Boolean
}) {}

export class ConcurrencyLimitJobsResumed
  extends Schema.TaggedClass<ConcurrencyLimitJobsResumed>()("ConcurrencyLimitJobsResumed", {
    worker: Schema.String,
    queue: Schema.String,
    count: Schema.Number,
    /**
     * The worker's limit at the pass that wrote the event; null for a move recovered after the worker lost its limit.
     */
    limit: Schema.NullOr(Schema.Number),
    /** The resumed jobs, first buffered first. */
    jids: Schema.Array(Schema.String)
  })
{}

export class ConcurrencyLimitJobsDead
  extends Schema.TaggedClass<ConcurrencyLimitJobsDead>()("ConcurrencyLimitJobsDead", {
    worker: Schema.String,
    count: Schema.Number
  })
{}

/**
 * One page of a prune (prune-events, `sweeper events prune`): `count` events older than `before`
 * deleted, committed with this event in one transaction.
 */
export class EventsPruned extends Schema.TaggedClass<EventsPruned>()("EventsPruned", {
  before: Schema.String,
  count: Schema.Number
}) {}

/**
 * The health gate held the batch: `signal` (a configuration key, or a Prometheus rule's
 * name) read `value` (in its unit; null when unreadable and configured `onUnknown: "hold"`) past
 * its stop `threshold`. One pair per hold, not per check.
 */
export class RepairHeld extends Schema.TaggedClass<RepairHeld>()("RepairHeld", {
  batch: Schema.String,
  signal: Schema.String,
  value: Schema.NullOr(Schema.Number),
  threshold: Schema.NullOr(Schema.Number),
  /** The threshold as configured (`"8MB"`, `"3x"`, `"< 0.99"`). */
  stop: Schema.optionalKey(Schema.String),
  /** The unit of value and threshold (bytes, seconds, bytes/s, ratio, tables, value). */
  unit: Schema.optionalKey(Schema.String),
  /** Why the reading was unknown, when that is what held. */
  unknown: Schema.optionalKey(Schema.String),
  /** The database a PostgreSQL signal was read on (`main`, `ci`); absent for Redis, Sidekiq, Prometheus. */
  database: Schema.optionalKey(Schema.Literals(["main", "ci"]))
}) {}

/** The hold ended: the signal is at or under its resume threshold (or the run's budget ran out while held). */
export class RepairReleased extends Schema.TaggedClass<RepairReleased>()("RepairReleased", {
  batch: Schema.String,
  signal: Schema.String,
  heldMs: Schema.Number,
  /**
   * `budget`: the run's budget ended while held (the next tick carries on); `run_ended`: written by a
   * later process for a hold whose run ended without releasing it (its process stopped; `heldMs` runs
   * to the run's RunFinished); absent: the signal recovered.
   */
  reason: Schema.optionalKey(Schema.Literals(["budget", "run_ended"])),
  /** As in its RepairHeld. */
  database: Schema.optionalKey(Schema.Literals(["main", "ci"]))
}) {}

/** The stream of EventsPruned: the event log's own history. */
export const RETENTION_STREAM = "retention:sweeper_events"

export const DomainEvent = Schema.Union([
  RunStarted,
  RunFinished,
  RunEventsRelayed,
  TickMissed,
  BatchPaused,
  BatchResumed,
  LeaseLostEvent,
  BuildDropped,
  BuildDoomed,
  ExportJobFailed,
  StaleDirectUploadDeleted,
  StaleDirectUploadEntryRemoved,
  RebalanceRescheduled,
  ConcurrencyLimitJobsResumed,
  ConcurrencyLimitJobsDead,
  EventsPruned,
  RepairHeld,
  RepairReleased
])
export type DomainEvent = typeof DomainEvent.Type
export type EventType = DomainEvent["_tag"]

/** The stream an event belongs to. */
/** Where a batch's health gate events go (`batch:<name>:health`): a batch stream for retention, not its state. */
export const healthStream = (batch: string): string => `batch:${batch}:health`

export const streamOf = (event: DomainEvent): string => {
  switch (event._tag) {
    case "RunStarted":
    case "RunFinished":
    case "RunEventsRelayed":
    case "TickMissed":
    case "BatchPaused":
    case "BatchResumed":
    case "LeaseLost":
      return `batch:${event.batch}`
    case "RepairHeld":
    case "RepairReleased":
      // Beside the batch's stream, not in it: its state is folded from its newest events, and
      // any number of holds must never push a RunStarted or a failure out of that window.
      return healthStream(event.batch)
    case "BuildDropped":
    case "BuildDoomed":
      return `build:${event.id}`
    case "ExportJobFailed":
      return `export_job:${event.id}`
    case "StaleDirectUploadDeleted":
    case "StaleDirectUploadEntryRemoved":
      return `direct_upload:${event.location}:${event.path}`
    case "RebalanceRescheduled":
      return `rebalance:${event.type}/${event.id}`
    case "ConcurrencyLimitJobsResumed":
    case "ConcurrencyLimitJobsDead":
      return `concurrency_limit:${event.worker}`
    case "EventsPruned":
      return RETENTION_STREAM
  }
}

/**
 * Each event class's own encoder, by tag. Why not the union's: it first searches the members for
 * the event's, and a repair page encodes a thousand events (measured: 1.9 against 1.1 µs an event).
 */
const encoderByTag = new Map<string, (event: DomainEvent) => unknown>(
  DomainEvent.members.map((member) => [member.identifier, Schema.encodeSync(member as Schema.Codec<DomainEvent>)])
)

/** The jsonb `data` of an event: its fields without the tag. */
export const dataOf = (event: DomainEvent): Record<string, unknown> => {
  const encode = encoderByTag.get(event._tag) ?? Schema.encodeSync(DomainEvent)
  const { _tag, ...data } = encode(event) as { _tag: string } & Record<string, unknown>
  return data
}

/** An event as stored, with its position and run. */
export interface StoredEvent {
  readonly id: number
  readonly stream: string
  readonly type: string
  readonly data: Record<string, unknown>
  readonly runId: string | null
  readonly occurredAt: Date
}
