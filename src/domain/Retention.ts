/**
 * Event retention: `sweeper_events` keeps every event younger than the retention
 * period (`SWEEPER_EVENT_RETENTION`, 90 days by default); older ones are pruned by the prune-events
 * batch and by `sweeper events prune`, except the few that batch state is folded from.
 *
 * What may never go: a batch's state (domain/BatchState.ts) is a fold of its `batch:<name>` stream,
 * so an old event the fold still depends on — the last pause of a batch paused a year ago, the last
 * success of a batch that has been failing since, a run killed before its RunFinished — is kept
 * whatever its age. `keptForState` names exactly those events; pruning everything else older than
 * the cutoff leaves `foldHistory` and `unfinishedRuns` of every batch as they were (tested).
 */
import * as Context from "effect/Context"
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import type { StoredEvent } from "./Events.ts"

/** The default retention: a quarter of repair history to answer "why was build 123 failed". */
export const EVENT_RETENTION = Duration.days(90)

/**
 * The shortest retention `SWEEPER_EVENT_RETENTION` accepts. The prune batch runs daily, so anything
 * shorter would not prune more often, only throw away the repairs of the incident an operator is
 * looking into today (`sweeper events --stream build:123`) and the dashboard's recent runs. Batch
 * state itself is safe at any retention: `keptForState` protects what it folds from.
 */
export const MIN_EVENT_RETENTION = Duration.days(1)

/** The retention the prune runs with; the composition root sets it from SWEEPER_EVENT_RETENTION. */
export const EventRetentionPeriod = Context.Reference<Duration.Duration>(
  "sweeper/domain/Retention/EventRetentionPeriod",
  {
    defaultValue: () => EVENT_RETENTION
  }
)

/**
 * Rows per DELETE. Each page is its own short transaction: row locks and WAL are bounded per commit,
 * and autovacuum can reclaim the space of earlier pages while later ones run. 10,000 rows of a few
 * hundred bytes is a few MB of WAL, well under a second on a modest server.
 */
export const PRUNE_PAGE_SIZE = 10_000

/** The page size the prune runs with (specs use small pages to see paging). */
export const PrunePageSize = Context.Reference<number>("sweeper/domain/Retention/PrunePageSize", {
  defaultValue: () => PRUNE_PAGE_SIZE
})

/**
 * Events strictly older than this go ("older than T" is `value < now − T`). `now` is the
 * earlier of the run's decision time and the clock: a `--now`/`--before` can only move the cutoff
 * back, never into the retention period, so the prune never deletes its own run's events.
 */
export const pruneCutoff = (decisionTime: DateTime.Utc, clockNow: DateTime.Utc, retention: Duration.Duration): Date =>
  new Date(
    Math.min(DateTime.toEpochMillis(decisionTime), DateTime.toEpochMillis(clockNow)) - Duration.toMillis(retention)
  )

/** Outcomes the breaker counts (BatchState.isFailure), as stored strings. */
const FAILURES: ReadonlySet<unknown> = new Set(["failed", "timed_out", "abandoned"])

const dateOf = (value: unknown): number | undefined =>
  typeof value === "string" && !Number.isNaN(Date.parse(value)) ? Date.parse(value) : undefined

/** The run a RunStarted belongs to, as `unfinishedRuns` reads it. */
const startedRunId = (event: StoredEvent): string | null =>
  typeof event.data.run_id === "string" ? event.data.run_id : event.runId

/**
 * The ids of the events of ONE batch stream (`batch:<name>`, any order) that its folded state depends
 * on. With these kept, `foldHistory` and `unfinishedRuns` over what remains equal those over all:
 *
 * - the newest RunStarted (lastStartedAt) and the newest non-dry one (openRun: a later run replaces
 *   an earlier open run in the fold, so the run that decides it must stay);
 * - the RunStarted or TickMissed with the latest covered tick (lastCoveredTick, the missed-run
 *   policy's memory; usually the newest, not always: missed ticks are written late after an outage);
 * - every RunStarted whose run has no RunFinished (open: running, or killed and not yet closed as
 *   abandoned), and the RunFinished of every kept RunStarted (a kept start must not look open);
 * - the newest non-dry RunFinished (lastRun), the newest succeeded one (lastSuccessAt) and every
 *   failed / timed_out / abandoned one after it (consecutiveFailures, the breaker). A batch that has
 *   failed since its last success thus keeps those failures until it succeeds again: at most one per
 *   tick, fewer once the breaker opens, and the alert on sweeper_last_success_age_seconds fires long
 *   before that is many;
 * - the newest BatchPaused and the newest BatchResumed (paused, by whom, since when).
 */
export const keptForState = (events: Iterable<StoredEvent>): ReadonlySet<number> => {
  const all = [...events].sort((a, b) => a.id - b.id)
  const keep = new Set<number>()
  let lastStarted: StoredEvent | undefined
  let lastLiveStarted: StoredEvent | undefined
  let latestCover: { event: StoredEvent; at: number } | undefined
  let lastFinished: StoredEvent | undefined
  let lastSuccess: StoredEvent | undefined
  let lastPaused: StoredEvent | undefined
  let lastResumed: StoredEvent | undefined
  const finishedRuns = new Set<string>()
  for (const event of all) {
    const dry = event.data.dryRun === true
    switch (event.type) {
      case "RunStarted": {
        lastStarted = event
        // The fold opens a run only for a non-dry start with a run id.
        if (!dry && startedRunId(event) !== null) lastLiveStarted = event
        const at = dateOf(event.data.scheduled_at) ?? event.occurredAt.getTime()
        if (latestCover === undefined || at >= latestCover.at) latestCover = { event, at }
        break
      }
      case "TickMissed": {
        const at = dateOf(event.data.scheduled_at)
        if (at !== undefined && (latestCover === undefined || at >= latestCover.at)) latestCover = { event, at }
        break
      }
      case "RunFinished":
        if (event.runId !== null) finishedRuns.add(event.runId)
        if (dry) break
        lastFinished = event
        if (event.data.outcome === "succeeded") lastSuccess = event
        break
      case "BatchPaused":
        lastPaused = event
        break
      case "BatchResumed":
        lastResumed = event
        break
    }
  }
  const keptStarts = new Set<string>()
  for (
    const event of [
      lastStarted,
      lastLiveStarted,
      latestCover?.event,
      lastFinished,
      lastSuccess,
      lastPaused,
      lastResumed
    ]
  ) {
    if (event === undefined) continue
    keep.add(event.id)
    if (event.type === "RunStarted") {
      const runId = startedRunId(event)
      if (runId !== null) keptStarts.add(runId)
    }
  }
  for (const event of all) {
    if (event.type === "RunStarted") {
      const runId = startedRunId(event)
      if (runId !== null && !finishedRuns.has(runId)) keep.add(event.id)
    } else if (event.type === "RunFinished") {
      if (event.runId !== null && keptStarts.has(event.runId)) keep.add(event.id)
      const failureSinceSuccess = event.data.dryRun !== true && FAILURES.has(event.data.outcome) &&
        (lastSuccess === undefined || event.id > lastSuccess.id)
      if (failureSinceSuccess) keep.add(event.id)
    }
  }
  return keep
}

/** Streams whose events batch state is folded from; every other stream is pruned by age alone. */
export const isBatchStream = (stream: string): boolean => stream.startsWith("batch:")

/**
 * The events a prune at `before` deletes: strictly older than `before`, not kept for state. Over
 * the whole log (any order); the memory store uses it, the SQL store implements the same rule in SQL.
 */
export const prunable = (events: ReadonlyArray<StoredEvent>, before: Date): ReadonlyArray<StoredEvent> => {
  const byStream = new Map<string, Array<StoredEvent>>()
  for (const event of events) {
    if (!isBatchStream(event.stream)) continue
    const list = byStream.get(event.stream)
    if (list === undefined) byStream.set(event.stream, [event])
    else list.push(event)
  }
  const kept = new Set<number>()
  for (const list of byStream.values()) for (const id of keptForState(list)) kept.add(id)
  return events.filter((event) => event.occurredAt.getTime() < before.getTime() && !kept.has(event.id))
}
