/**
 * stuck-export-jobs — port of GitLab's StuckExportJobsWorker. A project export whose Sidekiq job has completed (its
 * `gitlab-sidekiq-status:<jid>` key
 * is gone: the worker crashed, was killed, or the status expired) while the export job row still
 * says queued/started will never progress: it is marked failed so the user sees the truth and can
 * retry.
 *
 * Why the second read: a job may finish normally between the status look-up and the write, so the
 * completed ids are read again and only rows still queued/started are considered; the UPDATE itself
 * is guarded by status and jid as well, so a job that finishes or is re-enqueued in the last
 * instant is never overwritten. Parallel exports (with relation exports) keep running in other
 * workers after the main worker completes, so they get EXPORT_JOBS_EXPIRATION (6 h) first.
 * A job whose row another open transaction holds is skipped rather than waited for:
 * counted once per run in `skippedLocked`, logged with its id, counted across runs
 * (`repair/LockedRowTally.ts`), found again by the next run.
 */
import * as Arr from "effect/Array"
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { type Batch, CurrentRun, decisionTime } from "../domain/Batch.ts"
import { decideStuckExport, type EnqueuedExportJob, FAIL_SLICE, type StuckExportDecision } from "../domain/ExportJob.ts"
import { exportJobProposal } from "../domain/Shadow.ts"
import { capped } from "../domain/Summary.ts"
import { lockedRowTally } from "../repair/LockedRowTally.ts"
import { each, type Held, logIds } from "../repair/RepairLoop.ts"
import { ExportJobs } from "../services/ExportJobs.ts"
import { JobStatus } from "../services/JobStatus.ts"
import { increment, stuckExportJobsFailedTotal } from "../services/Metrics.ts"
import { stuckExportJobsBacklog } from "./StuckExportJobsBacklog.ts"

export interface StuckExportJobsSummary extends Held {
  /** Queued/started jobs whose Sidekiq status was looked up. */
  readonly checked: number
  /** Of those, the ones whose Sidekiq job has completed. */
  readonly completed: number
  /** Marked failed (in a dry run: would be). */
  readonly failed: number
  /** Parallel exports younger than EXPORT_JOBS_EXPIRATION, left alone. */
  readonly skippedParallel: number
  /** Re-enqueued with a new jid since the look-up, left alone. */
  readonly skippedRequeued: number
  /** Passed over because another open transaction held their row; the next run retries them. */
  readonly skippedLocked: number
  /** The first 100 failed jids (`failed` counts them all; each has its ExportJobFailed event). */
  readonly failedJids: ReadonlyArray<string>
}

const NAME = "stuck-export-jobs"
const BUDGET = Duration.minutes(10)

const run = Effect.fn("StuckExportJobs.run")(function*() {
  const exportJobs = yield* ExportJobs
  const jobStatus = yield* JobStatus
  const { dryRun } = yield* CurrentRun
  const now = yield* decisionTime

  const enqueued = yield* exportJobs.listEnqueued
  const completedJids = yield* jobStatus.completedJids(enqueued.map((job) => job.jid))
  const counts = { checked: enqueued.length, completed: completedJids.length, skippedParallel: 0, skippedRequeued: 0 }
  const completed = new Set(completedJids)
  const toFail = (decision: StuckExportDecision) => {
    if (decision !== "fail") counts[decision]++
    return decision === "fail"
  }

  // Per slice of 1000: read again (jobs that finished while we looked up their status drop out
  // here), decide, then one statement: a guarded set-based UPDATE and the slice's events. Two
  // slices are in flight at once, on two pooled connections (they share no row), so one slice's
  // re-read overlaps the other's write; totals in slice order whatever order they finish in.
  // A job another open transaction holds is skipped, logged with its id.
  const tally = yield* lockedRowTally(NAME, "export_job_ids", "Export jobs locked by another transaction, skipped")
  const { totals: { failed, failedJids, skippedLocked }, stop, heldMs, heldBy } = yield* each({
    batch: NAME,
    budget: BUDGET,
    concurrency: 2,
    initial: { failed: 0, failedJids: [] as ReadonlyArray<string>, skippedLocked: 0 },
    inputs: Arr.chunksOf(enqueued.filter((job) => completed.has(job.jid)).map((job) => job.id), FAIL_SLICE),
    unit: {
      plan: (ids: ReadonlyArray<number>) =>
        Effect.map(
          exportJobs.findEnqueued(ids),
          (jobs) => jobs.filter((job) => toFail(decideStuckExport(job, now, completed)))
        ),
      target: (job: EnqueuedExportJob) => `export_job:${job.id}`,
      propose: exportJobProposal,
      dry: (jobs) => ({ failed: jobs.length, failedJids: jobs.map((job) => job.jid), skippedLocked: 0 }),
      fence: false, // failMany fences its own statement
      write: (jobs, commit) =>
        Effect.gen(function*() {
          const { failed: done, locked } = yield* exportJobs.failMany(jobs, yield* DateTime.now)
          const firstSkipped = yield* tally.unit(jobs.map((job) => job.id), locked)
          yield* commit({ failed: done.length, failedJids: capped(done), skippedLocked: firstSkipped })
          yield* logIds(
            "Export jobs changed meanwhile, not failed",
            "export_job_ids",
            jobs.filter((job) => !done.includes(job.jid) && !locked.includes(job.id)).map((job) => job.id)
          )
        })
    }
  })

  if (stop === "done") yield* tally.complete
  yield* Effect.logInfo(dryRun ? "Would mark stuck export jobs as failed" : "Marked stuck export jobs as failed").pipe(
    Effect.annotateLogs({ jids: failedJids, failed })
  )
  if (!dryRun) yield* increment(stuckExportJobsFailedTotal, failed)
  return { ...counts, failed, failedJids, skippedLocked, heldMs, heldBy } satisfies StuckExportJobsSummary
})

export const StuckExportJobs = {
  name: NAME,
  worker: "StuckExportJobsWorker",
  description: "Fails project export jobs left queued/started after their Sidekiq job completed",
  cron: "30 * * * *",
  budget: BUDGET,
  lease: Option.none(),
  writes: { tables: ["project_export_jobs", "sweeper_events"] },
  repairedCounts: ["failed"],
  run: run(),
  backlog: stuckExportJobsBacklog
} satisfies Batch<StuckExportJobsSummary, unknown, unknown>
