/** Migration 0008: main's record of relayed outbox rows, and a separate ci database's outbox. */
import * as Effect from "effect/Effect"
import * as SqlClient from "effect/sql/SqlClient"
import { createEventTable, createLeaseFences } from "./0002_sweeper_tables.ts"

/**
 * Replay of repair events written in the ci database (a decomposed GitLab): the outbox ids whose
 * events main's ledger already has. The relay inserts an id here in the same transaction as its
 * events, so a relay repeated after a crash finds it and appends nothing twice (see Outbox.ts).
 */
export const eventRelay = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE TABLE IF NOT EXISTS sweeper_relayed (
    outbox_id bigint PRIMARY KEY,
    relayed_at timestamptz NOT NULL DEFAULT now()
  )`
})

/**
 * The ci database's own Sweeper tables: the lease fences its repairs check in their own transaction,
 * and the outbox their events are written to in that transaction, for the relay to move to main.
 */
export const ciOutbox = Effect.gen(function*() {
  yield* createLeaseFences
  yield* createEventTable("sweeper_outbox")
})
