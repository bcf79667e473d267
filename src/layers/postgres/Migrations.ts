/**
 * Sweeper's schema. Two sets of migrations, chosen by the schema mode:
 * - both modes: Sweeper's own `sweeper_*` tables (event log, lease fences, ownership record);
 * - standalone only: the platform tables with GitLab's names, types and encodings, for a database
 *   Sweeper owns (embedded default, demos, tests). Each table is created only when absent and
 *   recorded in `sweeper_schema_ownership`; the indexes the batches' scans want are created with
 *   the table (on an empty table that blocks nobody), never added to a table that already existed.
 * In gitlab mode nothing here touches GitLab's tables: `sweeper doctor` recommends the indexes and
 * `sweeper doctor --apply-indexes` builds them concurrently, when the operator asks.
 * Run by `sweeper migrate` (`--plan` lists what is pending), `sweeper start` and `sweeper run`;
 * read-only commands only check that nothing is pending (see App.ts).
 * sweeper_events may hold tens of millions of rows by the time a release adds to it, so what reads
 * or indexes the whole table is an online step (ONLINE_STEPS), never part of a transaction that
 * holds a lock appends need; see migrateWith for when `start` runs those steps and when it refuses.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Predicate from "effect/Predicate"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import * as Migrator from "effect/sql/Migrator"
import * as SqlClient from "effect/sql/SqlClient"
import { SqlError } from "effect/sql/SqlError"
import { type DatabaseName, databaseOfTable } from "../../domain/Databases.ts"
import {
  detectCiSchemaMode,
  detectSchemaMode,
  MIGRATIONS_TABLE,
  OWNERSHIP_TABLE,
  type SchemaMode
} from "./DatabaseSchema.ts"
import { transitionTables } from "./migrations/0009_transition_tables.ts"
import { shadowCandidates } from "./migrations/0011_shadow_candidates.ts"

export const PLATFORM_TABLES = [
  "namespaces",
  "projects",
  "issues",
  "project_export_jobs",
  "project_relation_exports",
  "ci_builds"
] as const

const createOwnershipTable = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE TABLE IF NOT EXISTS ${sql(OWNERSHIP_TABLE)} (
    table_name text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
  )`
})

/**
 * Which platform tables a standalone database gets: all of them when ci and main are one database;
 * in a decomposed layout each database only those GitLab keeps there (its gitlab_schema's), so
 * exactly one database holds each table, as in a decomposed GitLab.
 */
export const PlatformTablesOf = Context.Reference<"all" | DatabaseName>("sweeper/layers/postgres/PlatformTablesOf", {
  defaultValue: () => "all"
})

/**
 * Creates `table` with `create` and then its `indexes`, only when the table does not exist yet and
 * belongs in this database, and records that Sweeper created it. An existing table (someone
 * else's) is left exactly as it is.
 */
const ownTable = (
  table: string,
  create: Effect.Effect<unknown, unknown, SqlClient.SqlClient>,
  indexes: ReadonlyArray<Effect.Effect<unknown, unknown, SqlClient.SqlClient>> = []
) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const here = yield* PlatformTablesOf
    if (here !== "all" && databaseOfTable(table) !== here) return
    const found = yield* sql<{ found: boolean }>`SELECT to_regclass(${table}) IS NOT NULL AS found`
    if (found[0]?.found === true) return
    yield* create
    for (const index of indexes) yield* index
    yield* sql`INSERT INTO ${sql(OWNERSHIP_TABLE)} (table_name) VALUES (${table}) ON CONFLICT DO NOTHING`
  })

const platformTables = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* createOwnershipTable
  yield* ownTable(
    "namespaces",
    sql`CREATE TABLE namespaces (
    id bigserial PRIMARY KEY,
    name text NOT NULL DEFAULT '',
    path text NOT NULL DEFAULT '',
    type varchar NOT NULL DEFAULT 'Group',
    parent_id bigint NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
  )`,
    [sql`CREATE INDEX index_namespaces_on_parent_id ON namespaces (parent_id)`]
  )
  yield* ownTable(
    "projects",
    sql`CREATE TABLE projects (
    id bigserial PRIMARY KEY,
    namespace_id bigint NOT NULL REFERENCES namespaces (id),
    name text NOT NULL DEFAULT '',
    path text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
  )`,
    [sql`CREATE INDEX index_projects_on_namespace_id ON projects (namespace_id)`]
  )
  yield* ownTable(
    "issues",
    sql`CREATE TABLE issues (
    id bigserial PRIMARY KEY,
    project_id bigint NOT NULL REFERENCES projects (id),
    title text NOT NULL DEFAULT '',
    relative_position integer NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
  )`,
    [sql`CREATE INDEX index_issues_on_project_id_and_relative_position ON issues (project_id, relative_position, id)`]
  )
  yield* ownTable(
    "project_export_jobs",
    sql`CREATE TABLE project_export_jobs (
    id bigserial PRIMARY KEY,
    project_id bigint NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    jid varchar(100) NOT NULL UNIQUE,
    status smallint NOT NULL DEFAULT 0,
    user_id bigint NULL,
    exported_by_admin boolean DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
  )`,
    [
      // stuck-export-jobs reads only queued/started jobs: a partial index keeps that read small.
      sql`CREATE INDEX index_project_export_jobs_on_status_queued_or_started ON project_export_jobs (id) WHERE status IN (0, 1)`
    ]
  )
  yield* ownTable(
    "project_relation_exports",
    sql`CREATE TABLE project_relation_exports (
    id bigserial PRIMARY KEY,
    project_export_job_id bigint NOT NULL REFERENCES project_export_jobs (id) ON DELETE CASCADE,
    project_id bigint NULL,
    relation text NOT NULL,
    status smallint NOT NULL DEFAULT 0,
    jid text NULL,
    export_error text NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (project_export_job_id, relation)
  )`
  )
  // GitLab ≥ 16 keeps builds in p_ci_builds: a standalone database beside one gets no ci_builds.
  const partitioned = yield* sql<{ found: boolean }>`SELECT to_regclass('p_ci_builds') IS NOT NULL AS found`
  if (partitioned[0]?.found === true) return
  yield* ownTable(
    "ci_builds",
    sql`CREATE TABLE ci_builds (
    id bigserial PRIMARY KEY,
    project_id bigint NOT NULL,
    commit_id bigint NULL,
    name varchar NULL,
    type varchar DEFAULT 'Ci::Build',
    status varchar NOT NULL,
    failure_reason integer NULL,
    runner_id bigint NULL,
    lock_version integer NOT NULL DEFAULT 0,
    created_at timestamp NOT NULL DEFAULT (now() AT TIME ZONE 'UTC'),
    updated_at timestamp NOT NULL DEFAULT (now() AT TIME ZONE 'UTC'),
    started_at timestamp NULL,
    finished_at timestamp NULL
  )`,
    [
      // drop-canceling-builds walks canceling builds in (created_at, project_id, id) keyset order; the
      // partial index holds only those rows, so the walk never touches the millions of finished builds.
      // Its definition is the one doctor recommends (Indexes.ts), so doctor finds it serving the scan.
      sql`CREATE INDEX index_ci_builds_canceling_on_created_at_project_id_id
      ON ci_builds (created_at, project_id, id) WHERE status = 'canceling' AND type = 'Ci::Build'`
    ]
  )
})

/**
 * An event table: main's ledger (`sweeper_events`) or a separate ci database's outbox
 * (`sweeper_outbox`), whose rows the relay copies into the ledger column for column.
 */
const createEventTable = (table: "sweeper_events" | "sweeper_outbox") =>
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
const createLeaseFences = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) =>
    sql`CREATE TABLE IF NOT EXISTS sweeper_lease_fences (
    name text PRIMARY KEY,
    epoch bigint NOT NULL
  )`
)

const sweeperTables = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* createEventTable("sweeper_events")
  yield* sql`CREATE INDEX IF NOT EXISTS index_sweeper_events_on_stream_and_id ON sweeper_events (stream, id)`
  yield* sql`CREATE INDEX IF NOT EXISTS index_sweeper_events_on_run_id ON sweeper_events (run_id) WHERE run_id IS NOT NULL`
  yield* sql`CREATE INDEX IF NOT EXISTS index_sweeper_events_on_type_and_occurred_at ON sweeper_events (type, occurred_at)`
  yield* createLeaseFences
})

/**
 * Databases migrated before the ownership record existed had their platform tables created by
 * migration 1: record them, so detection keeps calling such a database standalone.
 */
const ownershipRecord = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* createOwnershipTable
  const owned = yield* sql<{ n: string }>`SELECT count(*) AS n FROM ${sql(OWNERSHIP_TABLE)}`
  if (Number(owned[0]?.n ?? 0) > 0) return
  const legacy = yield* sql<{ n: string }>`SELECT count(*) AS n FROM ${sql(MIGRATIONS_TABLE)} WHERE migration_id = 1`
  if (Number(legacy[0]?.n ?? 0) === 0) return
  for (const table of PLATFORM_TABLES) {
    yield* sql`INSERT INTO ${sql(OWNERSHIP_TABLE)} (table_name)
      SELECT ${table} WHERE to_regclass(${table}) IS NOT NULL ON CONFLICT DO NOTHING`
  }
})

/**
 * Event retention (prune-events): its DELETE pages walk events by time, and its kept-for-state rule
 * reads every batch-stream event. Its two indexes are built by the online steps below (concurrently,
 * outside any transaction): this migration once built them inside its transaction, which held every
 * append to sweeper_events for the length of the build on a large ledger.
 */
const retentionIndexes = Effect.void

/** `data->'field'` as a bigint when it is a JSON number and `when` holds; null otherwise (never a cast error). */
const numberField = (data: string, field: string, when: string) =>
  `CASE WHEN ${when} AND jsonb_typeof(${data}->'${field}') = 'number' THEN (${data}->>'${field}')::numeric::bigint END`

/**
 * How a run's row takes in what a newer event (or a backfilled range) says: never additive, so a
 * range folded twice (the backfill meeting the trigger) changes nothing.
 */
const RUN_MERGE = `batch = coalesce(r.batch, excluded.batch),
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
const ledgerRollup = Effect.gen(function*() {
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

/**
 * The stuck-builds family on Sweeper's own ci_builds (standalone: embedded, demos, tests): the
 * delayed builds' scheduled_at that drop-scheduled-builds reads, and one partial index per status
 * the family walks, in its keyset order, so each walk reads only its own rows. GitLab's databases
 * have their own columns and indexes and are never touched (doctor judges their scans).
 */
const stuckBuildsFamily = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const owned = yield* sql<{ n: string }>`SELECT count(*) AS n FROM ${sql(OWNERSHIP_TABLE)}
    WHERE table_name = 'ci_builds'`
  if (Number(owned[0]?.n ?? 0) === 0) return
  yield* sql`ALTER TABLE ci_builds ADD COLUMN IF NOT EXISTS scheduled_at timestamptz NULL`
  for (const status of ["pending", "running", "scheduled"]) {
    yield* sql.unsafe(`CREATE INDEX IF NOT EXISTS index_ci_builds_${status}_on_created_at_project_id_id
      ON ci_builds (created_at, project_id, id) WHERE status = '${status}' AND type = 'Ci::Build'`)
  }
})

/**
 * Replay of repair events written in the ci database (a decomposed GitLab): the outbox ids whose
 * events main's ledger already has. The relay inserts an id here in the same transaction as its
 * events, so a relay repeated after a crash finds it and appends nothing twice (see Outbox.ts).
 */
const eventRelay = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE TABLE IF NOT EXISTS sweeper_relayed (
    outbox_id bigint PRIMARY KEY,
    relayed_at timestamptz NOT NULL DEFAULT now()
  )`
})

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
const relayKeys = Effect.gen(function*() {
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
const outboxKeys = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`ALTER TABLE sweeper_outbox ADD COLUMN IF NOT EXISTS key uuid`
  yield* sql.unsafe(`UPDATE sweeper_outbox SET key = ${legacyKey("id")} WHERE key IS NULL`)
  yield* sql`ALTER TABLE sweeper_outbox ALTER COLUMN key SET DEFAULT gen_random_uuid(), ALTER COLUMN key SET NOT NULL`
  yield* sql`CREATE INDEX IF NOT EXISTS index_sweeper_outbox_on_run_id ON sweeper_outbox (run_id)`
})

/**
 * The ci database's own Sweeper tables: the lease fences its repairs check in their own transaction,
 * and the outbox their events are written to in that transaction, for the relay to move to main.
 */
const ciOutbox = Effect.gen(function*() {
  yield* createLeaseFences
  yield* createEventTable("sweeper_outbox")
})

const ALL = {
  "0001_platform_tables": platformTables,
  "0002_sweeper_tables": sweeperTables,
  "0003_schema_ownership": ownershipRecord,
  "0004_event_retention_indexes": retentionIndexes,
  "0005_console_rollup": ledgerRollup,
  "0006_ledger_rollup": ledgerRollup,
  "0007_stuck_builds_family": stuckBuildsFamily,
  "0008_event_relay": eventRelay,
  "0009_transition_tables": transitionTables(ownTable),
  "0010_relay_keys": relayKeys,
  "0011_shadow_candidates": shadowCandidates
} as const

/** A separate ci database's migrations (its own sweeper_migrations): the outbox, and ci's platform tables. */
const CI = {
  "0001_platform_tables": platformTables,
  "0007_stuck_builds_family": stuckBuildsFamily,
  "0008_ci_outbox": ciOutbox,
  "0009_transition_tables": transitionTables(ownTable),
  "0010_outbox_keys": outboxKeys
} as const

/** Migrations of Sweeper's own platform tables: a gitlab-mode database never gets them. */
const PLATFORM_ONLY: ReadonlySet<string> = new Set(["0001_platform_tables", "0007_stuck_builds_family"])

/** The migrations of a mode: gitlab mode never gets the platform tables. */
export const migrationsFor = (mode: SchemaMode, database: DatabaseName = "main") => {
  const all = database === "main" ? ALL : CI
  return Migrator.fromRecord(
    mode === "gitlab"
      ? Object.fromEntries(Object.entries(all).filter(([name]) => !PLATFORM_ONLY.has(name)))
      : all
  )
}

const runMigrator = Migrator.make({})

/**
 * The heavy half of migrations 4–6, run outside any transaction: each step is idempotent and knows
 * whether it is still pending, so an interrupted run resumes where it stopped. None of them blocks
 * appends: indexes are built CONCURRENTLY (a leftover invalid one from an interrupted build is
 * dropped first), the backfill folds id ranges of BACKFILL_RANGE events per statement.
 */
export interface OnlineStep {
  readonly id: number
  readonly name: string
  readonly pending: Effect.Effect<boolean, SqlError, SqlClient.SqlClient>
  readonly run: Effect.Effect<void, SqlError, SqlClient.SqlClient>
}

/** Events folded per backfill statement: a fraction of a second each, so no run row waits long. */
export const BACKFILL_RANGE = 50_000

const indexState = (name: string) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql<{ valid: boolean }>`SELECT i.indisvalid AS valid FROM pg_index i
      WHERE i.indexrelid = to_regclass(${name})`
    return rows.length === 0 ? "missing" as const : rows[0]!.valid ? "valid" as const : "invalid" as const
  })

const concurrentIndex = (id: number, name: string, definition: string): OnlineStep => ({
  id,
  name: `build ${name} concurrently`,
  pending: Effect.map(indexState(name), (state) => state !== "valid"),
  run: Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    if ((yield* indexState(name)) === "invalid") yield* sql.unsafe(`DROP INDEX CONCURRENTLY IF EXISTS ${name}`)
    yield* sql.unsafe(`CREATE INDEX CONCURRENTLY IF NOT EXISTS ${name} ON sweeper_events ${definition}`)
  })
})

const backfillDone = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const found = yield* sql<{ found: boolean }>`SELECT to_regclass('sweeper_backfills') IS NOT NULL AS found`
  if (found[0]?.found !== true) return false
  const rows = yield* sql<{ done: boolean }>`SELECT through >= target AS done FROM sweeper_backfills
    WHERE name = 'sweeper_runs'`
  return rows[0]?.done === true
})

/**
 * Every run's row from the batch events already in the ledger, in id ranges up to the newest id
 * when the backfill began (later events went through the trigger). Progress is recorded with each
 * range, in the same statement.
 */
const backfillRuns: OnlineStep = {
  id: 6,
  name: "backfill sweeper_runs in id ranges",
  pending: Effect.map(backfillDone, (done) => !done),
  run: Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    yield* sql`INSERT INTO sweeper_backfills (name, through, target)
      SELECT 'sweeper_runs', 0, coalesce(max(id), 0) FROM sweeper_events ON CONFLICT (name) DO NOTHING`
    while (true) {
      const rows = yield* sql<{ through: string; target: string }>`SELECT through, target FROM sweeper_backfills
        WHERE name = 'sweeper_runs'`
      const through = Number(rows[0]!.through)
      const target = Number(rows[0]!.target)
      if (through >= target) return
      const upTo = Math.min(target, through + BACKFILL_RANGE)
      yield* sql.unsafe(
        `WITH folded AS (
        INSERT INTO sweeper_runs AS r (run_id, batch, started_at, finished_at, outcome, duration_ms, dry_run, repaired)
        SELECT run_id,
          max(substr(stream, 7)),
          min(occurred_at) FILTER (WHERE type = 'RunStarted'),
          max(occurred_at) FILTER (WHERE type = 'RunFinished'),
          max(data->>'outcome') FILTER (WHERE type = 'RunFinished'),
          max(${numberField("data", "duration_ms", "type = 'RunFinished'")}),
          bool_or(coalesce(data->'dryRun' = 'true'::jsonb, false)),
          max(${numberField("data", "repaired", "type = 'RunFinished'")})
        FROM sweeper_events
        WHERE id > $1 AND id <= $2 AND run_id IS NOT NULL AND stream LIKE 'batch:%'
          AND type IN ('RunStarted', 'RunFinished')
        GROUP BY run_id
        ON CONFLICT (run_id) DO UPDATE SET ${RUN_MERGE}
        RETURNING 1)
      UPDATE sweeper_backfills SET through = $2 WHERE name = 'sweeper_runs'`,
        [through, upTo]
      )
    }
  })
}

/** (run_id) alone: (run_id, id) serves every read it served, and one index less on the append path. */
const dropRunIdIndex: OnlineStep = {
  id: 6,
  name: "drop index_sweeper_events_on_run_id concurrently",
  pending: Effect.map(indexState("index_sweeper_events_on_run_id"), (state) => state !== "missing"),
  run: Effect.flatMap(
    SqlClient.SqlClient,
    (sql) => sql`DROP INDEX CONCURRENTLY IF EXISTS index_sweeper_events_on_run_id`
  )
}

export const ONLINE_STEPS: ReadonlyArray<OnlineStep> = [
  concurrentIndex(4, "index_sweeper_events_on_occurred_at", "(occurred_at)"),
  // Partial: only batch streams (a few per run), not the repair streams. Queries must say
  // `stream LIKE 'batch:%'` literally for the planner to use it.
  concurrentIndex(4, "index_sweeper_events_on_batch_streams", "(stream, id) WHERE stream LIKE 'batch:%'"),
  // A run's repairs, paged with a keyset (`run_id = $1 AND id > $after ORDER BY id LIMIT n`): the
  // index on (run_id) alone orders ties by heap position, so paging would sort the whole run.
  concurrentIndex(5, "index_sweeper_events_on_run_id_and_id", "(run_id, id) WHERE run_id IS NOT NULL"),
  backfillRuns,
  dropRunIdIndex
]

const stepLabel = (step: OnlineStep) => `${String(step.id).padStart(4, "0")}_${step.name}`

/** The online steps still to run (all of them before the transactional migrations created their tables). */
export const pendingOnlineSteps = Effect.gen(function*() {
  const pending: Array<OnlineStep> = []
  for (const step of ONLINE_STEPS) if (yield* step.pending) pending.push(step)
  return pending
})

/** `<id>_<name>` of every migration of `mode` not applied yet (the Migrator runs ids above the latest). */
export const pendingMigrations = (mode: SchemaMode, database: DatabaseName = "main") =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const all = yield* migrationsFor(mode, database)
    const found = yield* sql<{ found: boolean }>`SELECT to_regclass(${MIGRATIONS_TABLE}) IS NOT NULL AS found`
    const latest = found[0]?.found === true
      ? Number(
        (yield* sql<{ latest: number | null }>`SELECT max(migration_id) AS latest FROM ${sql(MIGRATIONS_TABLE)}`)[0]
          ?.latest ?? 0
      )
      : 0
    return all.filter(([id]) => id > latest).map(([id, name]) => `${String(id).padStart(4, "0")}_${name}`)
  })

/** `migrate --plan`: the transactional migrations pending, then the online steps pending. */
export const pendingPlan = (mode: SchemaMode) =>
  Effect.gen(function*() {
    const light = yield* pendingMigrations(mode)
    const events = yield* SqlClient.SqlClient
    const ledger = yield* events<{ found: boolean }>`SELECT to_regclass('sweeper_events') IS NOT NULL AS found`
    // Before sweeper_events exists every step is pending, and costs nothing.
    const online = ledger[0]?.found === true ? (yield* pendingOnlineSteps).map(stepLabel) : ONLINE_STEPS.map(stepLabel)
    return [...light, ...online.map((step) => `${step} (online)`)]
  })

/**
 * Past this many events the online steps are left to `sweeper migrate`; below it they take a
 * second or two, so `sweeper start` runs them itself (a fresh or small ledger never needs a step).
 */
export const ONLINE_INLINE_MAX_EVENTS = 200_000

/** How long the transactional DDL waits for a lock on a table in use before backing off. */
const LOCK_TIMEOUT = "500ms"
const MIGRATION_LOCK = 7356201

/** Events in sweeper_events, counted up to `cap` + 1 (a bounded read, never the whole table). */
const ledgerSize = (cap: number) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const found = yield* sql<{ found: boolean }>`SELECT to_regclass('sweeper_events') IS NOT NULL AS found`
    if (found[0]?.found !== true) return 0
    const rows = yield* sql<{ n: string }>`SELECT count(*) AS n FROM (SELECT 1 FROM sweeper_events LIMIT ${cap + 1}) s`
    return Number(rows[0]!.n)
  })

export class HeavyMigrationPending extends Schema.TaggedError<HeavyMigrationPending>()("HeavyMigrationPending", {
  events: Schema.Number,
  steps: Schema.Array(Schema.String)
}) {
  override get message() {
    return `sweeper_events holds over ${this.events.toLocaleString("en-US")} events and ${this.steps.length} online ` +
      `migration step(s) are pending (${this.steps.join(", ")}): run \`sweeper migrate\` first ` +
      `(appends and repairs go on while it runs), then start again`
  }
}

/** A lock timeout, as the SqlError itself or as the cause the Migrator wraps it in (MigrationError). */
const isLockTimeout = (error: unknown): boolean =>
  error instanceof SqlError
    ? Predicate.isTagged(error.reason, "LockTimeoutError")
    : Predicate.hasProperty(error, "cause") && error.cause instanceof SqlError && isLockTimeout(error.cause)

/**
 * Runs what is pending of `mode`'s migrations on one connection that holds a session advisory lock
 * throughout, so concurrent processes wait instead of racing DDL, and decide the mode under it.
 * 1. The transactional migrations, with a lock timeout: their DDL on sweeper_events (the trigger
 *    swap) must never sit in the lock queue with every append queued behind it, so it gives up
 *    after LOCK_TIMEOUT, rolls back to its savepoint and tries again a moment later.
 * 2. The online steps, outside any transaction. With `heavy: "refuse"` (`sweeper start`, `run`) a
 *    ledger over ONLINE_INLINE_MAX_EVENTS with steps pending is refused before anything changes:
 *    the steps take minutes there, every replica of a deploy would queue on the lock for them past
 *    its health checks, and one operator-run `sweeper migrate` does them once, with its progress.
 * Returns the migrations and steps applied, as `[id, name]`.
 */
export const migrateWith = (mode: Option.Option<SchemaMode>, options: {
  readonly heavy?: "run" | "refuse"
  /**
   * Which of GitLab's databases this connection is: a separate ci database gets only its own
   * migrations (CI) and has no ledger, so no online steps. Default main.
   */
  readonly database?: DatabaseName
  /** Decomposed: each database gets only the platform tables GitLab keeps there (standalone mode). */
  readonly decomposed?: boolean
} = {}) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    // The "transaction" here only pins one connection (the embedded database has no other): it opens
    // with no BEGIN. The lock is polled for, in autocommit: a process waiting for it inside a
    // statement would hold a snapshot that the holder's CREATE INDEX CONCURRENTLY waits out, a
    // deadlock. The transactional migrations get a BEGIN and COMMIT of their own; the online steps
    // then run on the same connection in autocommit (CREATE INDEX CONCURRENTLY refuses a
    // transaction block), and the client's closing COMMIT or ROLLBACK, with no transaction open,
    // only draws a warning from PostgreSQL.
    return yield* sql.withTransaction(Effect.gen(function*() {
      yield* Effect.repeat(
        Effect.map(
          sql<{ got: boolean }>`SELECT pg_try_advisory_lock(${MIGRATION_LOCK}) AS got`,
          (rows) => rows[0]?.got === true
        ),
        { until: (got) => got, schedule: Schedule.spaced("100 millis") }
      )
      const database = options.database ?? "main"
      const work = Effect.gen(function*() {
        const detected = database === "main" ? yield* detectSchemaMode(mode) : yield* detectCiSchemaMode(mode)
        if (options.heavy === "refuse" && database === "main") {
          const size = yield* ledgerSize(ONLINE_INLINE_MAX_EVENTS)
          if (size > ONLINE_INLINE_MAX_EVENTS) {
            const steps = yield* pendingOnlineSteps
            if (steps.length > 0) {
              return yield* new HeavyMigrationPending({ events: ONLINE_INLINE_MAX_EVENTS, steps: steps.map(stepLabel) })
            }
          }
        }
        yield* sql`BEGIN`
        yield* sql.unsafe(`SET LOCAL lock_timeout = '${LOCK_TIMEOUT}'`)
        // The Migrator runs in a savepoint of this transaction: a lock timeout rolls back to it.
        const applied = yield* Effect.retry(
          runMigrator({ loader: migrationsFor(detected.mode, database), table: MIGRATIONS_TABLE }).pipe(
            Effect.provideService(PlatformTablesOf, options.decomposed === true ? database : "all")
          ),
          {
            while: isLockTimeout,
            schedule: Schedule.min([Schedule.exponential("200 millis"), Schedule.spaced("2 seconds")]),
            times: 30
          }
        )
        yield* sql`COMMIT`
        const online: Array<readonly [number, string]> = []
        for (const step of database === "main" ? yield* pendingOnlineSteps : []) {
          yield* Effect.logInfo(`Migration step: ${stepLabel(step)}`)
          yield* step.run
          online.push([step.id, step.name])
        }
        return [...applied, ...online]
      })
      // An online step on a large ledger takes longer than the statement timeout Sweeper's sessions
      // carry (SWEEPER_PG_STATEMENT_TIMEOUT): none on this connection while it migrates.
      yield* sql`SET statement_timeout = 0`
      return yield* work.pipe(
        Effect.ensuring(Effect.ignore(sql`SELECT pg_advisory_unlock(${MIGRATION_LOCK})`)),
        Effect.ensuring(Effect.ignore(sql`RESET statement_timeout`))
      )
    })).pipe(Effect.provideService(SqlClient.BeginTransaction, "SELECT 1"))
  })

/** Migrates with the mode detected from the database (tests, embedded). */
export const migrate = migrateWith(Option.none())
