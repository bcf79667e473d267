/** Project export jobs (`project_export_jobs`) as stuck-export-jobs sees them. */
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"

/** ProjectExportJob's state machine values (smallint `status`). */
export const ExportJobStatus = {
  queued: 0,
  started: 1,
  finished: 2,
  failed: 3
} as const
export type ExportJobStatus = typeof ExportJobStatus[keyof typeof ExportJobStatus]

/** `with_status(:queued, :started)`: the jobs whose Sidekiq worker may still be running. */
export const ENQUEUED_STATUSES: ReadonlyArray<number> = [ExportJobStatus.queued, ExportJobStatus.started]

export const isEnqueued = (status: number): boolean => ENQUEUED_STATUSES.includes(status)

/**
 * A parallel export (one with relation exports) keeps running in other workers after the main
 * job's worker completed; it is left alone until it is this old (GitLab's EXPORT_JOBS_EXPIRATION).
 */
export const EXPORT_JOBS_EXPIRATION = Duration.hours(6)

/** Step 1's read: just enough to look up Sidekiq status. */
export interface ExportJobRef {
  readonly id: number
  readonly jid: string
}

/** Step 3's re-read: the job as it is now, with the number of its relation exports. */
export interface EnqueuedExportJob {
  readonly id: number
  readonly projectId: number
  readonly jid: string
  readonly status: number
  readonly createdAt: DateTime.Utc
  /** When the row last changed: a stuck job has waited for its repair since then at least. */
  readonly updatedAt: DateTime.Utc
  readonly relationExports: number
}

export type StuckExportDecision = "fail" | "skippedParallel" | "skippedRequeued"

/** Jobs created strictly after this instant are younger than EXPORT_JOBS_EXPIRATION. */
export const parallelExportCutoff = (now: DateTime.Utc): DateTime.Utc =>
  DateTime.subtractDuration(now, EXPORT_JOBS_EXPIRATION)

/** A parallel export still within its grace period: ≥ 1 relation export and created < 6 h ago. */
export const isParallelExportInProgress = (
  job: Pick<EnqueuedExportJob, "relationExports" | "createdAt">,
  now: DateTime.Utc
): boolean => job.relationExports > 0 && DateTime.isGreaterThan(job.createdAt, parallelExportCutoff(now))

/**
 * What to do with a job whose Sidekiq worker completed while the job stayed queued/started.
 * `completed` is the set of jids found completed; a job re-enqueued since then carries a new jid
 * that is not in it, so it is left to its new worker.
 */
export const decideStuckExport = (
  job: Pick<EnqueuedExportJob, "jid" | "relationExports" | "createdAt">,
  now: DateTime.Utc,
  completed: ReadonlySet<string>
): StuckExportDecision => {
  if (isParallelExportInProgress(job, now)) return "skippedParallel"
  if (!completed.has(job.jid)) return "skippedRequeued"
  return "fail"
}

/**
 * Since when a job `decideStuckExport` fails has been due for that repair: its last change (the
 * completed worker left it there), and for a parallel export not before its grace period ended.
 */
export const stuckExportDueAt = (job: Pick<EnqueuedExportJob, "relationExports" | "createdAt" | "updatedAt">) => {
  const graceEnd = DateTime.addDuration(job.createdAt, EXPORT_JOBS_EXPIRATION)
  return job.relationExports > 0 && DateTime.isGreaterThan(graceEnd, job.updatedAt) ? graceEnd : job.updatedAt
}

/** Jobs failed per transaction: one guarded UPDATE and one multi-row event INSERT each. */
export const FAIL_SLICE = 1000
