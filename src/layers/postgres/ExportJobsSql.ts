/** ExportJobs on PostgreSQL (`project_export_jobs`, `project_relation_exports`). */
import { PgClient } from "@effect/sql-pg"
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import { ExportJobFailed } from "../../domain/Events.ts"
import { type EnqueuedExportJob, ExportJobStatus } from "../../domain/ExportJob.ts"
import { ExportJobs, type FailManyResult } from "../../services/ExportJobs.ts"
import { eventsForWrittenCte } from "./EventLogSql.ts"
import { fencedCte } from "./Fencing.ts"

interface RefRow {
  readonly id: string
  readonly jid: string
}

interface FailedRow {
  readonly id: number
  readonly jid: string
}

interface JobRow {
  readonly id: string
  readonly project_id: string
  readonly jid: string
  readonly status: number
  readonly created_at: Date
  readonly updated_at: Date
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
  updatedAt: DateTime.fromDateUnsafe(row.updated_at),
  relationExports: Number(row.relation_exports)
})

/** stuck-export-jobs' scan of unfinished jobs (exported so `sweeper doctor` EXPLAINs the exact text). */
export const enqueuedJobsQuery = (sql: PgClient.PgClient) =>
  sql<
    RefRow
  >`SELECT id, jid FROM project_export_jobs WHERE status IN (${ExportJobStatus.queued}, ${ExportJobStatus.started}) ORDER BY id`

/** The same scan, stopped after `limit` rows (the backlog's bounded read). */
const firstEnqueuedQuery = (sql: PgClient.PgClient, limit: number) =>
  sql<RefRow>`SELECT id, jid FROM project_export_jobs
    WHERE status IN (${ExportJobStatus.queued}, ${ExportJobStatus.started}) ORDER BY id LIMIT ${limit}`

export const ExportJobsSql = Layer.effect(
  ExportJobs,
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const { queued, started } = ExportJobStatus

    const listEnqueued = Effect.gen(function*() {
      const rows = yield* enqueuedJobsQuery(sql)
      return rows.map((row) => ({ id: Number(row.id), jid: row.jid }))
    }).pipe(Effect.withSpan("ExportJobs.listEnqueued"))

    const findEnqueued = Effect.fn("ExportJobs.findEnqueued")(function*(ids: ReadonlyArray<number>) {
      const found: Array<EnqueuedExportJob> = []
      for (let start = 0; start < ids.length; start += REREAD_SLICE) {
        const rows = yield* sql<JobRow>`
          SELECT j.id, j.project_id, j.jid, j.status, j.created_at, j.updated_at,
            (SELECT count(*) FROM project_relation_exports r WHERE r.project_export_job_id = j.id) AS relation_exports
          FROM project_export_jobs j
          WHERE ${sql.in("j.id", ids.slice(start, start + REREAD_SLICE))} AND j.status IN (${queued}, ${started})
          ORDER BY j.id`
        found.push(...rows.map(toJob))
      }
      return found
    })

    // The slice in ONE statement, so one round trip and one commit: the fence, the guarded UPDATE
    // (the slice as one jsonb parameter: id and jid read per row, so one statement whatever the
    // slice size, far from PostgreSQL's 65,535-parameter limit) and the INSERT of the events of
    // exactly the rows it changed, as data-modifying CTEs of a single autocommitted statement.
    // The rows are claimed FOR UPDATE SKIP LOCKED first and only claimed rows are updated, so a row
    // another open transaction holds is passed over rather than waited for; `locked`
    // names those that still match their guard in the statement's snapshot (read only when fewer
    // were claimed than the slice holds), as BuildsSql.dropMany does.
    const failMany = Effect.fn("ExportJobs.failMany")(
      function*(jobs: ReadonlyArray<EnqueuedExportJob>, now: DateTime.Utc) {
        if (jobs.length === 0) return { failed: [], locked: [] }
        const fence = yield* fencedCte(sql)
        const read = jobs.map((job) => ({ id: job.id, jid: job.jid }))
        const events = yield* eventsForWrittenCte(
          sql,
          [...jobs].sort((a, b) => a.id - b.id).map((job) => ({
            key: String(job.id),
            event: new ExportJobFailed({ id: job.id, jid: job.jid, project_id: job.projectId })
          })),
          "failed"
        )
        const rows = yield* sql<{
          readonly fenced: string | number
          readonly failed: ReadonlyArray<FailedRow>
          readonly locked: ReadonlyArray<number>
        }>`
        WITH ${fence.ctes},
        slice AS (SELECT * FROM jsonb_to_recordset(${sql.json(read)}) AS r(id bigint, jid text)),
        claimed AS (
          SELECT j.id, j.jid FROM project_export_jobs j JOIN slice r ON j.id = r.id
          WHERE j.jid = r.jid AND j.status IN (${queued}, ${started}) AND EXISTS (SELECT FROM fenced)
          FOR UPDATE OF j SKIP LOCKED),
        failed AS (
          UPDATE project_export_jobs j SET status = ${ExportJobStatus.failed}, updated_at = ${DateTime.toDateUtc(now)}
          FROM claimed r
          WHERE j.id = r.id AND j.jid = r.jid AND j.status IN (${queued}, ${started})
          RETURNING j.id, j.jid, j.id::text AS key),
        logged AS (${events}),
        locked AS (
          SELECT j.id FROM project_export_jobs j JOIN slice r ON j.id = r.id
          WHERE (SELECT count(*) FROM claimed) < (SELECT count(*) FROM slice) AND EXISTS (SELECT FROM fenced)
            AND j.jid = r.jid AND j.status IN (${queued}, ${started})
            AND NOT EXISTS (SELECT FROM claimed c WHERE c.id = j.id))
        SELECT (SELECT count(*) FROM fenced) AS fenced,
          (SELECT coalesce(jsonb_agg(jsonb_build_object('id', id, 'jid', jid) ORDER BY id), '[]') FROM failed) AS failed,
          (SELECT coalesce(jsonb_agg(id ORDER BY id), '[]') FROM locked) AS locked`
        if (Number(rows[0]!.fenced) === 0 && Option.isSome(fence.lost)) return yield* fence.lost.value
        return {
          failed: rows[0]!.failed.map((row) => row.jid),
          locked: rows[0]!.locked.map(Number)
        } satisfies FailManyResult
      }
    )

    const firstEnqueued = (limit: number) =>
      Effect.map(firstEnqueuedQuery(sql, limit), (rows) => rows.map((row) => ({ id: Number(row.id), jid: row.jid })))

    return ExportJobs.of({ listEnqueued, firstEnqueued, findEnqueued, failMany })
  })
)
