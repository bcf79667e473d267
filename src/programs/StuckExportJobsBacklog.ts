/**
 * stuck-export-jobs' backlog: the run's steps on the first BACKLOG_CAP + 1 queued/started jobs —
 * their Sidekiq status looked up, the completed ones re-read, and `decideStuckExport` asked — so a
 * parallel export in its grace period, which the run leaves alone, never counts as waiting.
 */
import * as Effect from "effect/Effect"
import { BACKLOG_CAP, backlogPart, type BacklogReading, earliest } from "../domain/Backlog.ts"
import { decisionTime } from "../domain/Batch.ts"
import { decideStuckExport, stuckExportDueAt } from "../domain/ExportJob.ts"
import { ExportJobs } from "../services/ExportJobs.ts"
import { JobStatus } from "../services/JobStatus.ts"

export const stuckExportJobsBacklog = Effect.gen(function*() {
  const exportJobs = yield* ExportJobs
  const now = yield* decisionTime
  const enqueued = yield* exportJobs.firstEnqueued(BACKLOG_CAP + 1)
  const sample = enqueued.slice(0, BACKLOG_CAP)
  const completed = new Set(yield* (yield* JobStatus).completedJids(sample.map((job) => job.jid)))
  const jobs = yield* exportJobs.findEnqueued(sample.filter((job) => completed.has(job.jid)).map((job) => job.id))
  const stuck = jobs.filter((job) => decideStuckExport(job, now, completed) === "fail")
  return {
    parts: [
      backlogPart("export jobs", stuck.length, enqueued.length > BACKLOG_CAP, earliest(stuck.map(stuckExportDueAt)))
    ]
  }
}) satisfies Effect.Effect<BacklogReading, unknown, ExportJobs | JobStatus>
