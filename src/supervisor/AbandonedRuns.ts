/**
 * Closing runs whose process died: a run killed mid-way (kill -9, OOM, lost machine) leaves a
 * RunStarted with no RunFinished. Whoever next runs the batch — any trigger, any replica — and the
 * supervisor at start-up append `RunFinished{outcome: "abandoned"}` for it, under the old run's id,
 * once `abandonedBecause` (domain/BatchState.ts) proves it can no longer be running — unless its
 * RunFinished waits in ci's outbox to be relayed (a decomposed GitLab whose main it could not reach).
 */
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { type Batch, CurrentRun, HARD_TIMEOUT_GRACE } from "../domain/Batch.ts"
import { abandonedBecause, type LastRun, unfinishedRuns } from "../domain/BatchState.ts"
import { RunFinished } from "../domain/Events.ts"
import { EventLog } from "../services/EventLog.ts"
import { increment, type Metrics, runsTotal } from "../services/Metrics.ts"
import { RunLedger } from "../services/RunLedger.ts"

/** How far back a batch's stream is searched for unfinished runs (every event type counts). */
export const ABANDONED_SEARCH_EVENTS = 200
/** Extra time past budget + grace before a run without a lease is declared dead (clock skew). */
export const ABANDON_SLACK = Duration.minutes(1)

/**
 * Closes the batch's unfinished runs that cannot still be running. `leaseEpoch` is the epoch of the
 * batch's exclusive lease the caller holds right now, if any. Returns the closed runs (for the
 * scheduler's live state). Never fails: a database it cannot read leaves the runs for next time.
 */
export const closeAbandonedRuns = (
  batch: Pick<Batch, "name" | "budget">,
  options: { readonly leaseEpoch: Option.Option<number>; readonly closedBy: string }
): Effect.Effect<ReadonlyArray<LastRun>, never, EventLog | Metrics> =>
  Effect.gen(function*() {
    const events = yield* EventLog
    const ledger = yield* RunLedger
    const recent = yield* events.query({
      stream: `batch:${batch.name}`,
      newestFirst: true,
      limit: ABANDONED_SEARCH_EVENTS
    })
    const open = unfinishedRuns(recent)
    if (open.length === 0) return []
    const now = DateTime.toDateUtc(yield* DateTime.now)
    const closed: Array<LastRun> = []
    for (const run of open) {
      const because = abandonedBecause(run, now, {
        leaseEpoch: Option.getOrUndefined(options.leaseEpoch),
        defaultBudgetMs: Duration.toMillis(batch.budget),
        graceMs: Duration.toMillis(HARD_TIMEOUT_GRACE),
        slackMs: Duration.toMillis(ABANDON_SLACK)
      })
      if (because === undefined) continue
      // Over, not abandoned: its RunFinished waits in ci's outbox, behind its events, for the relay.
      if (yield* ledger.finishDeferred(run.runId)) continue
      const durationMs = now.getTime() - run.startedAt.getTime()
      const reason = `no RunFinished; ${because}; closed by ${options.closedBy}`
      // Its repair events still on their way to the ledger, as a finished run's RunFinished says them.
      const eventsOwed = yield* ledger.eventsOwed(run.runId)
      const finished = new RunFinished({
        batch: batch.name,
        outcome: "abandoned",
        summary: null,
        duration_ms: durationMs,
        dryRun: run.dryRun,
        reason,
        ...(eventsOwed > 0 ? { eventsOwed } : {})
      })
      // Under the old run's id, so `sweeper events --run <id>` shows the run closed.
      yield* ledger.appendFinished(finished, run.runId, events.append(finished)).pipe(
        Effect.provideService(CurrentRun, {
          runId: run.runId,
          batch: batch.name,
          dryRun: run.dryRun,
          budget: Option.none(),
          fence: Option.none()
        })
      )
      yield* increment(runsTotal, 1, { batch: batch.name, outcome: "abandoned" })
      yield* Effect.logWarning("Closed an abandoned run").pipe(
        Effect.annotateLogs({ abandoned_run_id: run.runId, started_at: run.startedAt.toISOString(), reason })
      )
      if (!run.dryRun) {
        closed.push({ runId: run.runId, outcome: "abandoned", finishedAt: now, durationMs, summary: null })
      }
    }
    return closed
  }).pipe(
    Effect.catchCause((cause) => Effect.as(Effect.logWarning("Could not check for abandoned runs", cause), [])),
    Effect.annotateLogs({ batch: batch.name })
  )
