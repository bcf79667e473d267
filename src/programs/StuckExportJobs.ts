/**
 * stuck-export-jobs — port of GitLab's StuckExportJobsWorker (seed: stuck-export-jobs.ja.md,
 * SPEC §1). A project export whose Sidekiq job has completed (its `gitlab-sidekiq-status:<jid>` key
 * is gone: the worker crashed, was killed, or the status expired) while the export job row still
 * says queued/started will never progress: it is marked failed so the user sees the truth and can
 * retry.
 *
 * Why the second read: a job may finish normally between the status look-up and the write, so the
 * completed ids are read again and only rows still queued/started are considered; the UPDATE itself
 * is guarded by status and jid as well, so a job that finishes or is re-enqueued in the last
 * instant is never overwritten. Parallel exports (with relation exports) keep running in other
 * workers after the main worker completes, so they get EXPORT_JOBS_EXPIRATION (6 h) first.
 * A job whose row another open transaction holds is skipped rather than waited for (issue 18):
 * counted in `skippedLocked`, logged with its id, found again by the next run.
 */
import { DateTime, Duration, Effect, Option } from "effect"
import type { Batch } from "../domain/Batch.ts"
import { CurrentRun, decisionTime, reportProgress, wouldChange } from "../domain/Batch.ts"
import { decideStuckExport, type EnqueuedExportJob, FAIL_SLICE } from "../domain/ExportJob.ts"
import { capped } from "../domain/Summary.ts"
import { ExportJobs } from "../services/ExportJobs.ts"
import { JobStatus } from "../services/JobStatus.ts"
import { increment, stuckExportJobsFailedTotal } from "../services/Metrics.ts"

export interface StuckExportJobsSummary {
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

const run = Effect.fn("StuckExportJobs.run")(function*() {
  const exportJobs = yield* ExportJobs
  const jobStatus = yield* JobStatus
  const { dryRun } = yield* CurrentRun
  const now = yield* decisionTime

  const enqueued = yield* exportJobs.listEnqueued
  const completedJids = yield* jobStatus.completedJids(enqueued.map((job) => job.jid))
  let skippedParallel = 0
  let skippedRequeued = 0
  let skippedLocked = 0
  const failedJids: Array<string> = []
  const summary = () => ({
    checked: enqueued.length,
    completed: completedJids.length,
    failed: failedJids.length,
    skippedParallel,
    skippedRequeued,
    skippedLocked,
    failedJids: capped(failedJids)
  } satisfies StuckExportJobsSummary)
  if (completedJids.length === 0) return summary()

  const completed = new Set(completedJids)
  const completedIds = enqueued.filter((job) => completed.has(job.jid)).map((job) => job.id)
  const slices: Array<ReadonlyArray<number>> = []
  for (let start = 0; start < completedIds.length; start += FAIL_SLICE) slices.push(completedIds.slice(start, start + FAIL_SLICE))

  // Per slice of 1000: read again (jobs that finished while we looked up their status drop out
  // here), decide, then one statement: a guarded set-based UPDATE and the slice's events. Two
  // slices are in flight at once, on two pooled connections (the job status look-up holds no
  // lease and the slices share no row), so one slice's re-read and decoding overlap the other's
  // write and commit; a dry run goes one by one so its listed targets keep their order.
  const failSlice = (ids: ReadonlyArray<number>) =>
    Effect.gen(function*() {
      const toFail: Array<EnqueuedExportJob> = []
      for (const job of yield* exportJobs.findEnqueued(ids)) {
        const decision = decideStuckExport(job, now, completed)
        if (decision === "skippedParallel") skippedParallel++
        else if (decision === "skippedRequeued") skippedRequeued++
        else toFail.push(job)
      }
      if (toFail.length === 0) return []
      if (dryRun) {
        for (const job of toFail) yield* wouldChange(`export_job:${job.id}`)
        return toFail.map((job) => job.jid)
      }
      const { failed, locked } = yield* exportJobs.failMany(toFail, yield* DateTime.now)
      skippedLocked += locked.length
      yield* reportProgress({ failed: failed.length, failedJids: capped(failed), skippedLocked: locked.length })
      if (locked.length > 0) {
        yield* Effect.logInfo("Export jobs locked by another transaction, skipped").pipe(
          Effect.annotateLogs({ export_job_ids: capped(locked), count: locked.length })
        )
      }
      if (failed.length + locked.length < toFail.length) {
        const held = new Set(locked)
        const changed = toFail.filter((job) => !failed.includes(job.jid) && !held.has(job.id))
        yield* Effect.logInfo("Export jobs changed meanwhile, not failed").pipe(
          Effect.annotateLogs({ export_job_ids: capped(changed.map((job) => job.id)), count: changed.length })
        )
      }
      return failed
    })
  // In slice order whatever order they finish in.
  for (const failed of yield* Effect.forEach(slices, failSlice, { concurrency: dryRun ? 1 : 2 })) failedJids.push(...failed)

  yield* Effect.logInfo(dryRun ? "Would mark stuck export jobs as failed" : "Marked stuck export jobs as failed").pipe(
    Effect.annotateLogs({ jids: capped(failedJids), failed: failedJids.length })
  )
  if (!dryRun) yield* increment(stuckExportJobsFailedTotal, failedJids.length)
  return summary()
})

export const StuckExportJobs = {
  name: "stuck-export-jobs",
  worker: "StuckExportJobsWorker",
  description: "Fails project export jobs left queued/started after their Sidekiq job completed",
  cron: "30 * * * *",
  budget: Duration.minutes(10),
  lease: Option.none(),
  writes: { tables: ["project_export_jobs", "sweeper_events"] },
  run: run()
} satisfies Batch<StuckExportJobsSummary, unknown, unknown>
