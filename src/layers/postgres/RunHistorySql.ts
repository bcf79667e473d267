/**
 * RunHistory on PostgreSQL. Every read is bounded by an index of migration 0005: a run's events by
 * (run_id, id), a batch's runs by sweeper_runs (batch, finished_at) — never a scan of the ledger.
 */
import { PgClient } from "@effect/sql-pg"
import { Effect, Layer } from "effect"
import type { StoredEvent } from "../../domain/Events.ts"
import { HISTORY_MAX_RUNS, type RunDetail, RunHistory, type RunPoint } from "../../services/RunHistory.ts"
import { type EventRow, storedEvent as stored } from "./EventLogSql.ts"

const text = (value: unknown) => typeof value === "string" ? value : null

/** Shared by the SQL and memory layers: a run's header from its RunStarted / RunFinished. */
export const runDetailOf = (
  runId: string,
  started: StoredEvent | undefined,
  finished: StoredEvent | undefined,
  holds: ReadonlyArray<StoredEvent>,
  repairs: number
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
    error: text(finished?.data.error),
    holds,
    repairs
  }
}

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
    }
  >`
    SELECT run_id, started_at, finished_at, duration_ms, outcome, repairs FROM (
      SELECT run_id, started_at, finished_at, duration_ms, outcome, repairs FROM sweeper_runs
      WHERE batch = ${batch} AND finished_at >= ${since}
      ORDER BY finished_at DESC LIMIT ${HISTORY_MAX_RUNS}
    ) newest ORDER BY finished_at`

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
      const counted = yield* sql<{ repairs: string | number }>`SELECT repairs FROM sweeper_runs WHERE run_id = ${runId}`
      return runDetailOf(runId, started, finished, holds.map(stored), Number(counted[0]?.repairs ?? 0))
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
        repairs: Number(row.repairs)
      }))
    })

    return RunHistory.of({ run, repairs, history })
  })
)
