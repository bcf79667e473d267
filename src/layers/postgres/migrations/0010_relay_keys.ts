/** Migration 0010: outbox rows recognised by a key of their own, on main's side and on ci's. */
import * as Effect from "effect/Effect"
import * as SqlClient from "effect/sql/SqlClient"

/**
 * The key a relay recognises an outbox row by, for rows written before keys existed: derived from
 * the row's id in both databases alike (ci's rows here, main's recorded ids in relayKeys), so a row
 * main had already taken is still recognised once, and never again after that.
 */
const legacyKey = (id: string) => `md5('sweeper_outbox:' || ${id})::uuid`

/**
 * Main's side of outbox keys: the key of every outbox row whose events main's ledger has
 * (`sweeper_relayed_keys`, kept for RELAYED_KEYS_KEPT whatever happens to ci, so a row a restored
 * ci brings back is recognised), and the runs whose RunFinished said events were still owed
 * (`sweeper_owed_runs`), until the relay appends their RunEventsRelayed. Ids main recorded before
 * keys existed become their keys; `sweeper_relayed` stays, empty, for replicas of the previous release.
 */
export const relayKeys = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE TABLE IF NOT EXISTS sweeper_relayed_keys (
    key uuid PRIMARY KEY,
    relayed_at timestamptz NOT NULL DEFAULT now()
  )`
  yield* sql`CREATE INDEX IF NOT EXISTS index_sweeper_relayed_keys_on_relayed_at ON sweeper_relayed_keys (relayed_at)`
  yield* sql.unsafe(`INSERT INTO sweeper_relayed_keys (key) SELECT ${legacyKey("outbox_id")} FROM sweeper_relayed
    ON CONFLICT DO NOTHING`)
  yield* sql`DELETE FROM sweeper_relayed`
  yield* sql`CREATE TABLE IF NOT EXISTS sweeper_owed_runs (
    run_id uuid PRIMARY KEY,
    batch text NOT NULL,
    events bigint NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now()
  )`
})

/**
 * ci's side: every outbox row gets a random key (`gen_random_uuid()`), which no restore or failover
 * of ci can hand out again the way it hands out ids again; rows already there get their legacy key.
 * And an index on run_id: a run's end asks what of it is still in the outbox.
 */
export const outboxKeys = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`ALTER TABLE sweeper_outbox ADD COLUMN IF NOT EXISTS key uuid`
  yield* sql.unsafe(`UPDATE sweeper_outbox SET key = ${legacyKey("id")} WHERE key IS NULL`)
  yield* sql`ALTER TABLE sweeper_outbox ALTER COLUMN key SET DEFAULT gen_random_uuid(), ALTER COLUMN key SET NOT NULL`
  yield* sql`CREATE INDEX IF NOT EXISTS index_sweeper_outbox_on_run_id ON sweeper_outbox (run_id)`
})
