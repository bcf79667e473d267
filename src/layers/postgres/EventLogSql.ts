/** EventLog on PostgreSQL. `append` uses whatever connection the fiber's transaction holds. */
import { PgClient } from "@effect/sql-pg"
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { CurrentRun } from "../../domain/Batch.ts"
import { dataOf, type DomainEvent, type StoredEvent, streamOf } from "../../domain/Events.ts"
import { type EventFilter, EventLog } from "../../services/EventLog.ts"

/** A `sweeper_events` row as PostgreSQL returns it (bigserial ids may come back as strings). */
export interface EventRow {
  readonly id: string | number
  readonly stream: string
  readonly type: string
  readonly data: Record<string, unknown>
  readonly run_id: string | null
  readonly occurred_at: Date
}

export const storedEvent = (row: EventRow): StoredEvent => ({
  id: Number(row.id),
  stream: row.stream,
  type: row.type,
  data: row.data,
  runId: row.run_id,
  occurredAt: row.occurred_at
})

/**
 * A repair page's events as a data-modifying CTE body, for a page written in ONE statement: every
 * row of the page comes with its event, keyed, and only those whose key the statement's `written`
 * CTE returns (a `key text` column: the rows its guarded UPDATE actually changed) are inserted, in
 * the order given. The events commit with the write or not at all, in the write's single round trip.
 */
export const eventsForWrittenCte = Effect.fnUntraced(function*(
  sql: PgClient.PgClient,
  keyed: ReadonlyArray<{ readonly key: string; readonly event: DomainEvent }>,
  written: string,
  table: EventsTable = "sweeper_events"
) {
  const run = yield* CurrentRun
  const occurredAt = DateTime.toDateUtc(yield* DateTime.now)
  // Columns as arrays, as `appendAll` sends them (and for the same reason: no document to parse).
  const keys = keyed.map(({ key }) => key)
  const streams = keyed.map(({ event }) => streamOf(event))
  const types = keyed.map(({ event }) => event._tag)
  const data = keyed.map(({ event }) => JSON.stringify(dataOf(event)))
  return sql`INSERT INTO ${sql(table)} (stream, type, data, run_id, occurred_at)
    SELECT e.stream, e.type, e.data::jsonb, ${run.runId}::uuid, ${occurredAt}::timestamptz
    FROM unnest(${keys}::text[], ${streams}::text[], ${types}::text[], ${data}::text[])
      WITH ORDINALITY AS e(key, stream, type, data, n)
    WHERE e.key IN (SELECT key FROM ${sql.literal(written)})
    ORDER BY e.n`
})

/** Main's ledger, or a separate ci database's outbox of repair events (see Outbox.ts). */
export type EventsTable = "sweeper_events" | "sweeper_outbox"

/**
 * EventLog writing into `table`: main's ledger (EventLogSql), or, for a decomposed GitLab's ci
 * repairs, ci's outbox, so that a repair's events share its ci transaction. Queries read `table`.
 */
export const EventLogSqlInto = (table: EventsTable) =>
  Layer.effect(
    EventLog,
    Effect.gen(function*() {
      const sql = yield* PgClient.PgClient
      const append = Effect.fn("EventLog.append")(function*(event: DomainEvent) {
        const run = yield* CurrentRun
        const now = yield* DateTime.now
        yield* sql`INSERT INTO ${sql(table)} (stream, type, data, run_id, occurred_at) VALUES (
        ${streamOf(event)}, ${event._tag}, ${sql.json(dataOf(event))}, ${run.runId}, ${DateTime.toDateUtc(now)})`
      })
      // One INSERT for the whole batch, its columns as three array parameters (unnest … WITH ORDINALITY
      // keeps their order, so ids follow the batch): a page of repairs costs one round trip and a few
      // parameters for its events, not one round trip per row nor five parameters per row (which the
      // driver would type and encode one by one, a CPU cost that showed in profiles at 1000 a page).
      // Arrays rather than one jsonb document of the rows (jsonb_to_recordset): 1000 stale-upload
      // events 7.5–8.0 ms against 8.5–9.2 ms, the server no longer parses the document and takes
      // each row's payload back out of it.
      const appendAll = Effect.fn("EventLog.appendAll")(function*(batch: ReadonlyArray<DomainEvent>) {
        if (batch.length === 0) return
        const run = yield* CurrentRun
        const occurredAt = DateTime.toDateUtc(yield* DateTime.now)
        const streams = batch.map(streamOf)
        const types = batch.map((event) => event._tag)
        const data = batch.map((event) => JSON.stringify(dataOf(event)))
        yield* sql`INSERT INTO ${sql(table)} (stream, type, data, run_id, occurred_at)
        SELECT e.stream, e.type, e.data::jsonb, ${run.runId}::uuid, ${occurredAt}::timestamptz
        FROM unnest(${streams}::text[], ${types}::text[], ${data}::text[]) WITH ORDINALITY AS e(stream, type, data, n)
        ORDER BY e.n`
      })
      const query = Effect.fn("EventLog.query")(function*(filter: EventFilter) {
        const clauses = [
          filter.stream !== undefined ? sql`stream = ${filter.stream}` : undefined,
          // Written literally, so the planner reads a batch's stream through the partial (stream, id)
          // index, in id order (migration 0012: the other streams have a hash index only).
          filter.stream?.startsWith("batch:") === true ? sql`stream LIKE 'batch:%'` : undefined,
          filter.streamPrefix !== undefined
            ? sql`stream LIKE ${filter.streamPrefix.replace(/[%_\\]/g, "\\$&") + "%"}`
            : undefined,
          filter.type !== undefined ? sql`type = ${filter.type}` : undefined,
          filter.runId !== undefined ? sql`run_id = ${filter.runId}` : undefined,
          filter.since !== undefined ? sql`occurred_at >= ${filter.since}` : undefined,
          filter.until !== undefined ? sql`occurred_at < ${filter.until}` : undefined
        ].filter((clause) => clause !== undefined)
        const where = clauses.length === 0 ? sql`` : sql`WHERE ${sql.and(clauses)}`
        const order = filter.newestFirst === true ? sql`ORDER BY id DESC` : sql`ORDER BY id`
        const limit = filter.limit !== undefined ? sql`LIMIT ${filter.limit}` : sql``
        const rows = yield* sql<
          EventRow
        >`SELECT id, stream, type, data, run_id, occurred_at FROM ${sql(table)} ${where} ${order} ${limit}`
        return rows.map(storedEvent)
      })
      return EventLog.of({ append, appendAll, query, transaction: sql.withTransaction })
    })
  )

export const EventLogSql = EventLogSqlInto("sweeper_events")
