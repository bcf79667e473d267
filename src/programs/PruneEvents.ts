/**
 * prune-events — Sweeper's own batch, not a GitLab worker: keeps `sweeper_events` from growing
 * forever. Deletes events older than now − SWEEPER_EVENT_RETENTION (90 days by default)
 * in pages of PRUNE_PAGE_SIZE rows, each page one short fenced transaction with its
 * EventsPruned{before, count}, until nothing older is left or the budget is spent (the next daily
 * run carries on). The events batch state is folded from are kept whatever their age
 * (domain/Retention.ts `keptForState`), so pausing, the breaker, the last success and abandoned-run
 * detection see the same history after a prune as before it.
 *
 * `sweeper events prune --before T` is this batch run once with its decision time set to
 * T + retention, so the cutoff is exactly T; the CLI refuses a T inside the retention period.
 */
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { type Batch, CurrentRun, decisionTime } from "../domain/Batch.ts"
import { EventRetentionPeriod, pruneCutoff, PrunePageSize } from "../domain/Retention.ts"
import { lockedRowTally } from "../repair/LockedRowTally.ts"
import { type Held, repeatUntilDone } from "../repair/RepairLoop.ts"
import { EventRetention } from "../services/EventRetention.ts"
import { eventsPrunedTotal, increment } from "../services/Metrics.ts"

export interface PruneEventsSummary extends Held {
  /** The cutoff: events strictly older than this instant were pruned (or would be, in a dry run). */
  readonly before: string
  /** Events deleted (a dry run: that would be deleted). */
  readonly pruned: number
  /** Events older than the cutoff kept because batch state is folded from them. */
  readonly keptForState: number
  readonly pages: number
  /** The budget ran out (or the health gate held past it) with events still to prune; the next run carries on. */
  readonly executionTimeout: boolean
  /** Prunable events passed over because another open transaction held their row; the next run retries them. */
  readonly skippedLocked: number
}

/** The run's default budget: a daily batch has all night, but never holds its lease for long. */
export const PRUNE_BUDGET = Duration.minutes(10)

const NAME = "prune-events"

const run = Effect.fn("PruneEvents.run")(function*() {
  const retention = yield* EventRetention
  const { dryRun } = yield* CurrentRun
  const period = yield* EventRetentionPeriod
  const pageSize = yield* PrunePageSize
  const cutoff = pruneCutoff(yield* decisionTime, yield* DateTime.now, period)
  const before = cutoff.toISOString()
  const kept = yield* retention.kept(cutoff)

  // A page at a time, each its own fenced transaction, until a short page or the budget (a page is
  // a second or so, so the run ends within a page of its budget; the next daily run carries on).
  // Held rows are met again by every later page (they are the oldest): the tally counts them once
  // per run. A page names only the rows it skipped; the rows it deleted are gone for good, and a
  // run that prunes to the end forgets every other count.
  const tally = yield* lockedRowTally(NAME, "event_ids", "Skipped events locked by another transaction")
  const { totals: { pruned, pages, skippedLocked }, stop, heldMs, heldBy } = yield* repeatUntilDone({
    batch: NAME,
    budget: PRUNE_BUDGET,
    initial: { pruned: 0, pages: 0, skippedLocked: 0 },
    fence: false,
    dry: Effect.map(retention.countPrunable(cutoff, kept), (count) => ({ pruned: count, pages: 0, skippedLocked: 0 })),
    write: (commit) =>
      Effect.gen(function*() {
        const { pruned: count, locked } = yield* retention.prunePage(cutoff, kept, pageSize)
        const firstSkipped = yield* tally.unit([], locked)
        if (count === 0) {
          if (firstSkipped > 0) yield* commit({ pruned: 0, pages: 0, skippedLocked: firstSkipped })
          return false
        }
        yield* commit({ pruned: count, pages: 1, skippedLocked: firstSkipped })
        yield* increment(eventsPrunedTotal, count)
        return count === pageSize
      })
  })
  if (stop === "done") yield* tally.complete
  const keptForState = kept.length
  const executionTimeout = stop !== "done"
  if (dryRun) {
    yield* Effect.logInfo("Would prune events").pipe(
      Effect.annotateLogs({ before, pruned, kept_for_state: keptForState })
    )
  } else {yield* Effect.logInfo("Pruned events").pipe(
      Effect.annotateLogs({
        before,
        pruned,
        pages,
        kept_for_state: keptForState,
        execution_timeout: executionTimeout,
        skipped_locked: skippedLocked
      })
    )}
  return {
    before,
    pruned,
    keptForState,
    pages,
    executionTimeout,
    skippedLocked,
    heldMs,
    heldBy
  } satisfies PruneEventsSummary
})

export const PruneEvents = {
  name: NAME,
  worker: "Sweeper (own batch)",
  description:
    "Deletes events older than SWEEPER_EVENT_RETENTION (90 days), keeping the events each batch's state is folded from",
  // Daily at 03:17: a quiet hour, off the minutes the other batches tick on (:00, :30, :45, */6, */15).
  cron: "17 3 * * *",
  budget: PRUNE_BUDGET,
  lease: Option.some({ name: "sweeper/prune_events", ttl: Duration.minutes(15) }),
  // A large prune is a WAL burst too.
  writes: { tables: ["sweeper_events"] },
  repairedCounts: ["pruned"],
  run: run()
} satisfies Batch<PruneEventsSummary, unknown, unknown>
