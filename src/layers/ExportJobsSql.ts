/** ExportJobs on PostgreSQL (`project_export_jobs`, `project_relation_exports`). */
import { PgClient } from "@effect/sql-pg"
import { DateTime, Effect, Layer } from "effect"
import { type EnqueuedExportJob, ExportJobStatus } from "../domain/ExportJob.ts"
import { ExportJobFailed } from "../domain/Events.ts"
import { EventLog } from "../services/EventLog.ts"
import { ExportJobs } from "../services/ExportJobs.ts"
import { fenceWrite } from "./Fencing.ts"

interface RefRow {
  readonly id: string
  readonly jid: string
}

interface FailedRow {
  readonly id: string
  readonly jid: string
  readonly project_id: string
}

interface JobRow {
  readonly id: string
  readonly project_id: string
  readonly jid: string
  readonly status: number
  readonly created_at: Date
  readonly relation_exports: string
}

/** Ids per re-read query: keeps the IN list well under PostgreSQL's parameter limit. */
const REREAD_SLICE = 1000

const toJob = (row: JobRow): EnqueuedExportJob => ({
  id: Number(row.id),
  projectId: Number(row.project_id),
  jid: row.jid,
  status: row.status,
  createdAt: DateTime.fromDateUnsafe(row.created_at),
  relationExports: Number(row.relation_exports)
})

/** stuck-export-jobs' scan of unfinished jobs (exported so `sweeper doctor` EXPLAINs the exact text). */
export const enqueuedJobsQuery = (sql: PgClient.PgClient) =>
  sql<RefRow>`SELECT id, jid FROM project_export_jobs WHERE status IN (${ExportJobStatus.queued}, ${ExportJobStatus.started}) ORDER BY id`

export const ExportJobsSql = Layer.effect(
  ExportJobs,
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const events = yield* EventLog
    const { queued, started } = ExportJobStatus

    const listEnqueued = Effect.gen(function*() {
      const rows = yield* enqueuedJobsQuery(sql)
      return rows.map((row) => ({ id: Number(row.id), jid: row.jid }))
    }).pipe(Effect.withSpan("ExportJobs.listEnqueued"))

    const findEnqueued = Effect.fn("ExportJobs.findEnqueued")(function*(ids: ReadonlyArray<number>) {
      const found: Array<EnqueuedExportJob> = []
      for (let start = 0; start < ids.length; start += REREAD_SLICE) {
        const rows = yield* sql<JobRow>`
          SELECT j.id, j.project_id, j.jid, j.status, j.created_at,
            (SELECT count(*) FROM project_relation_exports r WHERE r.project_export_job_id = j.id) AS relation_exports
          FROM project_export_jobs j
          WHERE ${sql.in("j.id", ids.slice(start, start + REREAD_SLICE))} AND j.status IN (${queued}, ${started})
          ORDER BY j.id`
        found.push(...rows.map(toJob))
      }
      return found
    })

    // The slice travels as one jsonb parameter (id and jid read per row), so the guarded UPDATE is a
    // single statement whatever the slice size, far from PostgreSQL's 65,535-parameter limit.
    const failMany = Effect.fn("ExportJobs.failMany")(function*(jobs: ReadonlyArray<EnqueuedExportJob>, now: DateTime.Utc) {
      if (jobs.length === 0) return []
      return yield* events.transaction(Effect.gen(function*() {
        yield* fenceWrite(sql)
        const read = jobs.map((job) => ({ id: job.id, jid: job.jid }))
        const updated = yield* sql<FailedRow>`
          UPDATE project_export_jobs j SET status = ${ExportJobStatus.failed}, updated_at = ${DateTime.toDateUtc(now)}
          FROM jsonb_to_recordset(${sql.json(read)}) AS r(id bigint, jid text)
          WHERE j.id = r.id AND j.jid = r.jid AND j.status IN (${queued}, ${started})
          RETURNING j.id, j.jid, j.project_id`
        const failed = updated.map((row) => ({ id: Number(row.id), jid: row.jid, project_id: Number(row.project_id) }))
          .sort((a, b) => a.id - b.id)
        yield* events.appendAll(failed.map((row) => new ExportJobFailed(row)))
        return failed.map((row) => row.jid)
      }))
    })

    return ExportJobs.of({ listEnqueued, findEnqueued, failMany })
  })
)
