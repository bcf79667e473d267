/** Migration 0002: Sweeper's own tables, the event ledger and the lease fences. */
import * as Effect from "effect/Effect"
import * as SqlClient from "effect/sql/SqlClient"

/**
 * An event table: main's ledger (`sweeper_events`) or a separate ci database's outbox
 * (`sweeper_outbox`), whose rows the relay copies into the ledger column for column.
 */
export const createEventTable = (table: "sweeper_events" | "sweeper_outbox") =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql`CREATE TABLE IF NOT EXISTS ${sql(table)} (
    id bigserial PRIMARY KEY,
    stream text NOT NULL,
    type text NOT NULL,
    data jsonb NOT NULL,
    run_id uuid NULL,
    occurred_at timestamptz NOT NULL DEFAULT now()
  )`)

/**
 * Fencing: the newest epoch that has written under each exclusive lease. A write carrying an older
 * epoch finds a newer one here and is rejected (see layers/Fencing.ts). In every database Sweeper
 * writes, beside the writes it fences.
 */
export const createLeaseFences = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) =>
    sql`CREATE TABLE IF NOT EXISTS sweeper_lease_fences (
    name text PRIMARY KEY,
    epoch bigint NOT NULL
  )`
)

export const sweeperTables = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* createEventTable("sweeper_events")
  yield* sql`CREATE INDEX IF NOT EXISTS index_sweeper_events_on_stream_and_id ON sweeper_events (stream, id)`
  yield* sql`CREATE INDEX IF NOT EXISTS index_sweeper_events_on_run_id ON sweeper_events (run_id) WHERE run_id IS NOT NULL`
  yield* sql`CREATE INDEX IF NOT EXISTS index_sweeper_events_on_type_and_occurred_at ON sweeper_events (type, occurred_at)`
  yield* createLeaseFences
})
