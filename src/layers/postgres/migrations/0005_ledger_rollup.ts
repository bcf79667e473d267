/** Migrations 0005 and 0006 (both run this): the console's per-run rollup, `sweeper_runs`. */
import * as Effect from "effect/Effect"
import * as SqlClient from "effect/sql/SqlClient"

/** `data->'field'` as a bigint when it is a JSON number and `when` holds; null otherwise (never a cast error). */
export const numberField = (data: string, field: string, when: string) =>
  `CASE WHEN ${when} AND jsonb_typeof(${data}->'${field}') = 'number' THEN (${data}->>'${field}')::numeric::bigint END`

/**
 * How a run's row takes in what a newer event (or a backfilled range) says: never additive, so a
 * range folded twice (the backfill meeting the trigger) changes nothing.
 */
export const RUN_MERGE = `batch = coalesce(r.batch, excluded.batch),
    started_at = least(r.started_at, excluded.started_at),
    finished_at = greatest(r.finished_at, excluded.finished_at),
    outcome = coalesce(excluded.outcome, r.outcome),
    duration_ms = coalesce(excluded.duration_ms, r.duration_ms),
    dry_run = r.dry_run OR excluded.dry_run,
    repaired = coalesce(excluded.repaired, r.repaired)`

/**
 * The console's per-run rollup, `sweeper_runs`: one row per run, written by a row trigger that fires
 * only for a run's RunStarted and RunFinished (the WHEN clause is checked before any function call,
 * so a repair page's rows cost nothing extra). A run's concurrent appenders therefore never touch
 * its row: only the run guard's two appends do, one after the other. `repaired` is the count of
 * repaired items the RunFinished carries (null for runs whose summary did not say); `dry_run` marks
 * dry runs so totals can leave them out.
 * Migration 5 once built (run_id, id) non-concurrently, kept a statement trigger adding every
 * appending statement's repairs to the run's row (so concurrent appenders queued on that row lock)
 * and backfilled the whole ledger in its transaction. Both 5 and 6 now run this light part only
 * (a table of runs, the trigger swap: milliseconds under a lock timeout); the index, the backfill
 * and the drop of the now redundant (run_id) index are online steps. The old `repairs` column, where
 * it exists, is left in place so replicas still running the previous release keep reading it.
 */
export const ledgerRollup = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE TABLE IF NOT EXISTS sweeper_runs (
    run_id uuid PRIMARY KEY,
    batch text,
    started_at timestamptz,
    finished_at timestamptz,
    outcome text,
    duration_ms bigint
  )`
  yield* sql`ALTER TABLE sweeper_runs ADD COLUMN IF NOT EXISTS dry_run boolean NOT NULL DEFAULT false`
  yield* sql`ALTER TABLE sweeper_runs ADD COLUMN IF NOT EXISTS repaired bigint`
  yield* sql`CREATE INDEX IF NOT EXISTS index_sweeper_runs_on_batch_and_finished_at ON sweeper_runs (batch, finished_at)`
  yield* sql`CREATE TABLE IF NOT EXISTS sweeper_backfills (
    name text PRIMARY KEY,
    through bigint NOT NULL,
    target bigint NOT NULL
  )`
  yield* sql.unsafe(`CREATE OR REPLACE FUNCTION sweeper_runs_fold() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  INSERT INTO sweeper_runs AS r (run_id, batch, started_at, finished_at, outcome, duration_ms, dry_run, repaired)
  VALUES (
    NEW.run_id,
    substr(NEW.stream, 7),
    CASE WHEN NEW.type = 'RunStarted' THEN NEW.occurred_at END,
    CASE WHEN NEW.type = 'RunFinished' THEN NEW.occurred_at END,
    CASE WHEN NEW.type = 'RunFinished' THEN NEW.data->>'outcome' END,
    ${numberField("NEW.data", "duration_ms", "NEW.type = 'RunFinished'")},
    coalesce(NEW.data->'dryRun' = 'true'::jsonb, false),
    ${numberField("NEW.data", "repaired", "NEW.type = 'RunFinished'")}
  )
  ON CONFLICT (run_id) DO UPDATE SET ${RUN_MERGE};
  RETURN NULL;
END
$fn$`)
  const triggers = yield* sql<{ name: string }>`SELECT tgname AS name FROM pg_trigger
    WHERE tgrelid = 'sweeper_events'::regclass AND tgname IN ('sweeper_runs_rollup', 'sweeper_runs_fold')`
  // Each of these takes a lock on sweeper_events: only issued when there is something to change.
  if (triggers.some((t) => t.name === "sweeper_runs_rollup")) {
    yield* sql`DROP TRIGGER sweeper_runs_rollup ON sweeper_events`
    yield* sql`DROP FUNCTION IF EXISTS sweeper_runs_rollup()`
  }
  if (!triggers.some((t) => t.name === "sweeper_runs_fold")) {
    yield* sql.unsafe(`CREATE TRIGGER sweeper_runs_fold AFTER INSERT ON sweeper_events FOR EACH ROW
      WHEN (NEW.run_id IS NOT NULL AND NEW.type IN ('RunStarted', 'RunFinished') AND NEW.stream LIKE 'batch:%')
      EXECUTE FUNCTION sweeper_runs_fold()`)
  }
})
