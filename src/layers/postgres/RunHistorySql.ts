/**
 * RunHistory on PostgreSQL. Every read is bounded by an index: a run's events by (run_id, id), a
 * batch's runs by sweeper_runs (batch, finished_at), never a scan of the ledger. A run's repairs
 * are the repaired items its RunFinished carries, not a count of its events.
 */
import { PgClient } from "@effect/sql-pg"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type { StoredEvent } from "../../domain/Events.ts"
import { redact } from "../../domain/Redaction.ts"
import {
  HISTORY_MAX_RUNS,
  type HistoryBucket,
  RUN_PIPELINES_MAX,
  type RunDetail,
  RunHistory,
  type RunPoint
} from "../../services/RunHistory.ts"
import { type EventRow, storedEvent as stored } from "./EventLogSql.ts"

const text = (value: unknown) => typeof value === "string" ? value : null
/** An error text as shown: redacted as read too, for a ledger written before a form was known. */
const redactedText = (value: unknown) => typeof value === "string" ? redact(value) : null

/** Shared by the SQL and memory layers: a run's header from its RunStarted / RunFinished. */
export const runDetailOf = (
  runId: string,
  started: StoredEvent | undefined,
  finished: StoredEvent | undefined,
  holds: ReadonlyArray<StoredEvent>,
  pipelines: ReadonlyArray<number> = []
): RunDetail | null => {
  if (started === undefined && finished === undefined) return null
  const any = (finished ?? started)!
  return {
    runId,
    batch: text(any.data.batch) ?? any.stream.replace(/^batch:/, ""),
    trigger: text(started?.data.trigger),
    node: text(started?.data.node),
    dryRun: (started?.data.dryRun ?? finished?.data.dryRun) === true,
    startedAt: started?.occurredAt ?? null,
    finishedAt: finished?.occurredAt ?? null,
    durationMs: typeof finished?.data.duration_ms === "number" ? finished.data.duration_ms : null,
    outcome: text(finished?.data.outcome),
    reason: text(finished?.data.reason),
    summary: finished?.data.summary ?? null,
    error: redactedText(finished?.data.error),
    holds,
    repairs: typeof finished?.data.repaired === "number" ? finished.data.repaired : 0,
    pipelines
  }
}

/**
 * The distinct pipelines of a run's dropped builds, smallest first, RUN_PIPELINES_MAX + 1 of them
 * (one more says the list was cut). Reads the run's events by (run_id, id).
 */
export const runPipelinesQuery = (sql: PgClient.PgClient, runId: string) =>
  sql<{ pipeline_id: string }>`SELECT DISTINCT (data->>'pipeline_id')::bigint AS pipeline_id FROM sweeper_events
    WHERE run_id = ${runId} AND type = 'BuildDropped' AND jsonb_typeof(data->'pipeline_id') = 'number'
    ORDER BY 1 LIMIT ${RUN_PIPELINES_MAX + 1}`

/** RunStarted (first event) and RunFinished (last) of a run: one step from each end of (run_id, id). */
export const runEndsQuery = (sql: PgClient.PgClient, runId: string) =>
  sql<EventRow>`
    (SELECT id, stream, type, data, run_id, occurred_at FROM sweeper_events
      WHERE run_id = ${runId} AND type = 'RunStarted' ORDER BY id LIMIT 1)
    UNION ALL
    (SELECT id, stream, type, data, run_id, occurred_at FROM sweeper_events
      WHERE run_id = ${runId} AND type = 'RunFinished' ORDER BY id DESC LIMIT 1)`

/** One keyset page of a run's repairs (every stream but `batch:…`), one row more than `limit`. */
export const repairsQuery = (
  sql: PgClient.PgClient,
  runId: string,
  options: { readonly after?: number | undefined; readonly type?: string | undefined; readonly limit: number }
) =>
  sql<EventRow>`SELECT id, stream, type, data, run_id, occurred_at FROM sweeper_events
    WHERE run_id = ${runId} AND stream NOT LIKE 'batch:%'
      ${options.after === undefined ? sql`` : sql`AND id > ${options.after}`}
      ${options.type === undefined ? sql`` : sql`AND type = ${options.type}`}
    ORDER BY id LIMIT ${options.limit + 1}`

/** A batch's newest HISTORY_MAX_RUNS runs finished since `since`, oldest first, from the rollup. */
export const historyQuery = (sql: PgClient.PgClient, batch: string, since: Date) =>
  sql<
    {
      run_id: string
      started_at: Date | null
      finished_at: Date
      duration_ms: string | number | null
      outcome: string | null
      repairs: string | number
      dry_run: boolean
    }
  >`
    SELECT run_id, started_at, finished_at, duration_ms, outcome, repairs, dry_run FROM (
      SELECT run_id, started_at, finished_at, duration_ms, outcome, coalesce(repaired, 0) AS repairs, dry_run
      FROM sweeper_runs
      WHERE batch = ${batch} AND finished_at >= ${since}
      ORDER BY finished_at DESC LIMIT ${HISTORY_MAX_RUNS}
    ) newest ORDER BY finished_at`

/** A batch's runs since `since` in epoch-aligned buckets of `bucketMs`: one row per bucket with runs. */
export const bucketsQuery = (sql: PgClient.PgClient, batch: string, since: Date, bucketMs: number) =>
  sql<
    {
      start: Date
      runs: string
      dry_runs: string
      succeeded: string
      failed: string
      repairs: string
      duration_max: string | null
      duration_total: string | null
    }
  >`
    SELECT to_timestamp(floor(extract(epoch FROM finished_at) * 1000 / ${bucketMs}) * ${bucketMs} / 1000.0) AS start,
      count(*) AS runs,
      count(*) FILTER (WHERE dry_run) AS dry_runs,
      count(*) FILTER (WHERE NOT dry_run AND outcome = 'succeeded') AS succeeded,
      count(*) FILTER (WHERE NOT dry_run AND outcome IN ('failed', 'timed_out', 'abandoned')) AS failed,
      coalesce(sum(repaired) FILTER (WHERE NOT dry_run), 0) AS repairs,
      max(duration_ms) AS duration_max,
      sum(duration_ms) AS duration_total
    FROM sweeper_runs WHERE batch = ${batch} AND finished_at >= ${since}
    GROUP BY 1 ORDER BY 1`

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i

export const RunHistorySql = Layer.effect(
  RunHistory,
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient

    const run = Effect.fn("RunHistory.run")(function*(runId: string) {
      if (!UUID.test(runId)) return null
      const ends = yield* runEndsQuery(sql, runId)
      const started = ends.map(stored).find((e) => e.type === "RunStarted")
      const finished = ends.map(stored).find((e) => e.type === "RunFinished")
      if (started === undefined && finished === undefined) return null
      const holds = yield* sql<EventRow>`SELECT id, stream, type, data, run_id, occurred_at FROM sweeper_events
        WHERE run_id = ${runId} AND type IN ('RepairHeld', 'RepairReleased') ORDER BY id LIMIT 200`
      const pipelines = yield* runPipelinesQuery(sql, runId)
      return runDetailOf(runId, started, finished, holds.map(stored), pipelines.map((row) => Number(row.pipeline_id)))
    })

    const repairs = Effect.fn("RunHistory.repairs")(
      function*(
        runId: string,
        options: { readonly after?: number | undefined; readonly type?: string | undefined; readonly limit: number }
      ) {
        if (!UUID.test(runId)) return { events: [], next: null }
        const rows = yield* repairsQuery(sql, runId, options)
        const events = rows.slice(0, options.limit).map(stored)
        return { events, next: rows.length > options.limit ? events.at(-1)!.id : null }
      }
    )

    const history = Effect.fn("RunHistory.history")(function*(batch: string, since: Date) {
      const rows = yield* historyQuery(sql, batch, since)
      return rows.map((row): RunPoint => ({
        runId: row.run_id,
        startedAt: row.started_at,
        finishedAt: row.finished_at,
        durationMs: Number(row.duration_ms ?? 0),
        outcome: row.outcome ?? "unknown",
        repairs: Number(row.repairs),
        dryRun: row.dry_run
      }))
    })

    const buckets = Effect.fn("RunHistory.buckets")(function*(batch: string, since: Date, bucketMs: number) {
      const rows = yield* bucketsQuery(sql, batch, since, bucketMs)
      return rows.map((row): HistoryBucket => ({
        start: row.start,
        runs: Number(row.runs),
        dryRuns: Number(row.dry_runs),
        succeeded: Number(row.succeeded),
        failed: Number(row.failed),
        repairs: Number(row.repairs),
        durationMsMax: Number(row.duration_max ?? 0),
        durationMsTotal: Number(row.duration_total ?? 0)
      }))
    })

    return RunHistory.of({ run, repairs, history, buckets })
  })
)
