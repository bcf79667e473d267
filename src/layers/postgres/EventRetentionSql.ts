/**
 * EventRetention on PostgreSQL. `keptQuery` is domain/Retention.ts's `keptForState` in SQL, for
 * every batch stream at once; the contract test holds the two to the same answers. Pages are
 * DELETEs of at most `limit` rows by `occurred_at` (index_sweeper_events_on_occurred_at), each in
 * its own transaction with the lease fence and the page's EventsPruned.
 */
import { PgClient } from "@effect/sql-pg"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { EventsPruned } from "../../domain/Events.ts"
import { EventLog } from "../../services/EventLog.ts"
import { EventRetention } from "../../services/EventRetention.ts"
import { fenceWrite } from "./Fencing.ts"

/**
 * The kept ids older than `before`. `stream LIKE 'batch:%'` is written literally so the planner
 * matches index_sweeper_events_on_batch_streams (partial, only batch streams): the rule reads every
 * batch event, never the repair streams. Each CTE mirrors one clause of `keptForState`.
 */
export const keptQuery = (sql: PgClient.PgClient, before: Date) =>
  sql<{ id: string | number }>`
  WITH b AS (
    SELECT id, stream, type, run_id::text AS run_id, occurred_at,
      CASE WHEN type = 'RunStarted' THEN coalesce(data->>'run_id', run_id::text) END AS started_run,
      coalesce(data->'dryRun' = 'true'::jsonb, false) AS dry,
      data->>'outcome' AS outcome,
      CASE WHEN data->>'scheduled_at' ~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}T' THEN (data->>'scheduled_at')::timestamptz END AS scheduled
    FROM sweeper_events WHERE stream LIKE 'batch:%'
  ),
  last AS (
    SELECT stream,
      max(id) FILTER (WHERE type = 'RunStarted') AS started,
      max(id) FILTER (WHERE type = 'RunStarted' AND NOT dry AND started_run IS NOT NULL) AS live_started,
      max(id) FILTER (WHERE type = 'RunFinished' AND NOT dry) AS finished,
      max(id) FILTER (WHERE type = 'RunFinished' AND NOT dry AND outcome = 'succeeded') AS success,
      max(id) FILTER (WHERE type = 'BatchPaused') AS paused,
      max(id) FILTER (WHERE type = 'BatchResumed') AS resumed
    FROM b GROUP BY stream
  ),
  cover AS (
    SELECT DISTINCT ON (stream) stream, id FROM b
    WHERE type = 'RunStarted' OR (type = 'TickMissed' AND scheduled IS NOT NULL)
    ORDER BY stream, CASE WHEN type = 'RunStarted' THEN coalesce(scheduled, occurred_at) ELSE scheduled END DESC, id DESC
  ),
  singles AS (
    SELECT unnest(ARRAY[started, live_started, finished, success, paused, resumed]) AS id FROM last
    UNION SELECT id FROM cover
  ),
  kept_starts AS (
    SELECT b.stream, b.started_run FROM b JOIN singles s ON s.id = b.id
    WHERE b.type = 'RunStarted' AND b.started_run IS NOT NULL
  ),
  finished_runs AS (
    SELECT DISTINCT stream, run_id FROM b WHERE type = 'RunFinished' AND run_id IS NOT NULL
  ),
  keep AS (
    SELECT id FROM singles WHERE id IS NOT NULL
    UNION
    SELECT b.id FROM b WHERE b.type = 'RunStarted' AND b.started_run IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM finished_runs f WHERE f.stream = b.stream AND f.run_id = b.started_run)
    UNION
    SELECT b.id FROM b JOIN kept_starts k ON k.stream = b.stream AND k.started_run = b.run_id WHERE b.type = 'RunFinished'
    UNION
    SELECT b.id FROM b JOIN last l ON l.stream = b.stream
    WHERE b.type = 'RunFinished' AND NOT b.dry AND b.outcome IN ('failed', 'timed_out', 'abandoned') AND b.id > coalesce(l.success, 0)
  )
  SELECT b.id FROM keep k JOIN b ON b.id = k.id WHERE b.occurred_at < ${before} ORDER BY b.id`

/** `id NOT IN` the kept list, passed as one jsonb parameter (a hashed subplan, however long). */
const notKept = (sql: PgClient.PgClient, kept: ReadonlyArray<number>) =>
  sql`id NOT IN (SELECT jsonb_array_elements_text(${sql.json(kept)})::bigint)`

/** The oldest `limit` prunable rows: what one page deletes (also what doctor EXPLAINs). */
export const prunePageQuery = (sql: PgClient.PgClient, before: Date, kept: ReadonlyArray<number>, limit: number) =>
  sql`SELECT id FROM sweeper_events WHERE occurred_at < ${before} AND ${
    notKept(sql, kept)
  } ORDER BY occurred_at LIMIT ${limit}`

export const EventRetentionSql = Layer.effect(
  EventRetention,
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const events = yield* EventLog
    return EventRetention.of({
      kept: Effect.fn("EventRetention.kept")(function*(before: Date) {
        return (yield* keptQuery(sql, before)).map((row) => Number(row.id))
      }),
      countPrunable: Effect.fn("EventRetention.countPrunable")(function*(before: Date, kept: ReadonlyArray<number>) {
        const rows = yield* sql<
          { n: string | number }
        >`SELECT count(*) AS n FROM sweeper_events WHERE occurred_at < ${before} AND ${notKept(sql, kept)}`
        return Number(rows[0]?.n ?? 0)
      }),
      prunePage: Effect.fn("EventRetention.prunePage")(
        function*(before: Date, kept: ReadonlyArray<number>, limit: number) {
          return yield* events.transaction(Effect.gen(function*() {
            yield* fenceWrite(sql)
            // The page's rows are claimed FOR UPDATE SKIP LOCKED so a row another open transaction
            // holds (an operator's session, a stale replica's prune) is passed over, not waited for
            // with the fence row held; the page fills up with the next rows instead.
            // `locked`: the rows the same window read without locking has and the claim has not.
            const rows = yield* sql<{ n: string | number; locked: ReadonlyArray<number | string> }>`
            WITH page AS (${prunePageQuery(sql, before, kept, limit)} FOR UPDATE SKIP LOCKED),
            gone AS (DELETE FROM sweeper_events WHERE id IN (SELECT id FROM page) RETURNING run_id, type, stream),
            -- A run's rollup row goes with its RunFinished (or its RunStarted, for a run that never
            -- finished): the console shows no run the ledger no longer holds, and the table stays bounded.
            runs_gone AS (
              DELETE FROM sweeper_runs r USING gone g
              WHERE g.run_id = r.run_id AND g.stream LIKE 'batch:%'
                AND (g.type = 'RunFinished' OR (g.type = 'RunStarted' AND r.finished_at IS NULL))
              RETURNING 1),
            locked AS (
              SELECT s.id FROM (${prunePageQuery(sql, before, kept, limit)}) s
              WHERE s.id NOT IN (SELECT id FROM page))
            SELECT (SELECT count(*) FROM gone) AS n, (SELECT count(*) FROM runs_gone) AS runs,
              (SELECT coalesce(jsonb_agg(id ORDER BY id), '[]') FROM locked) AS locked`
            const count = Number(rows[0]?.n ?? 0)
            if (count > 0) yield* events.append(new EventsPruned({ before: before.toISOString(), count }))
            return { pruned: count, locked: (rows[0]?.locked ?? []).map(Number) }
          }))
        }
      )
    })
  })
)
