/**
 * Sweeper's schema (SPEC §7, §8.1). Two sets of migrations, chosen by the schema mode:
 * - both modes: Sweeper's own `sweeper_*` tables (event log, lease fences, ownership record);
 * - standalone only: the platform tables with GitLab's names, types and encodings, for a database
 *   Sweeper owns (embedded default, demos, tests). Each table is created only when absent and
 *   recorded in `sweeper_schema_ownership`; the indexes the batches' scans want are created with
 *   the table (on an empty table that blocks nobody), never added to a table that already existed.
 * In gitlab mode nothing here touches GitLab's tables: `sweeper doctor` recommends the indexes and
 * `sweeper doctor --apply-indexes` builds them concurrently, when the operator asks.
 * Run by `sweeper migrate` (`--plan` lists what is pending), `sweeper start` and `sweeper run`;
 * read-only commands only check that nothing is pending (see App.ts).
 */
import { Effect, Option } from "effect"
import { Migrator, SqlClient } from "effect/sql"
import { detectSchemaMode, MIGRATIONS_TABLE, OWNERSHIP_TABLE, type SchemaMode } from "./DatabaseSchema.ts"

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
 * Creates `table` with `create` and then its `indexes`, only when the table does not exist yet, and
 * records that Sweeper created it. An existing table (someone else's) is left exactly as it is.
 */
const ownTable = (
  table: string,
  create: Effect.Effect<unknown, unknown, SqlClient.SqlClient>,
  indexes: ReadonlyArray<Effect.Effect<unknown, unknown, SqlClient.SqlClient>> = []
) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
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

const sweeperTables = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE TABLE IF NOT EXISTS sweeper_events (
    id bigserial PRIMARY KEY,
    stream text NOT NULL,
    type text NOT NULL,
    data jsonb NOT NULL,
    run_id uuid NULL,
    occurred_at timestamptz NOT NULL DEFAULT now()
  )`
  yield* sql`CREATE INDEX IF NOT EXISTS index_sweeper_events_on_stream_and_id ON sweeper_events (stream, id)`
  yield* sql`CREATE INDEX IF NOT EXISTS index_sweeper_events_on_run_id ON sweeper_events (run_id) WHERE run_id IS NOT NULL`
  yield* sql`CREATE INDEX IF NOT EXISTS index_sweeper_events_on_type_and_occurred_at ON sweeper_events (type, occurred_at)`
  // Fencing: the newest epoch that has written under each exclusive lease. A write carrying an
  // older epoch finds a newer one here and is rejected (see layers/Fencing.ts).
  yield* sql`CREATE TABLE IF NOT EXISTS sweeper_lease_fences (
    name text PRIMARY KEY,
    epoch bigint NOT NULL
  )`
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
 * reads every batch-stream event. Without these both would read the whole table. sweeper_events is
 * Sweeper's own table, so the migration builds them in both schema modes; on an existing large
 * table the build holds appends to sweeper_events for its duration (seconds per million rows).
 */
const retentionIndexes = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE INDEX IF NOT EXISTS index_sweeper_events_on_occurred_at ON sweeper_events (occurred_at)`
  // Partial: only batch streams (a few per run), not the repair streams. Queries must say
  // `stream LIKE 'batch:%'` literally for the planner to use it.
  yield* sql`CREATE INDEX IF NOT EXISTS index_sweeper_events_on_batch_streams ON sweeper_events (stream, id) WHERE stream LIKE 'batch:%'`
})

/**
 * The console (issue 19). Two reads must stay fast on a ledger of millions of events:
 * - a run's repairs, paged with a keyset (`run_id = $1 AND id > $after ORDER BY id LIMIT n`): the
 *   index on (run_id) alone orders ties by heap position, so paging would sort the whole run;
 *   (run_id, id) walks straight to the page.
 * - a batch's history (repairs per run, duration, outcome over 30 days): one row per run in
 *   `sweeper_runs`, kept by a statement-level trigger on sweeper_events. Counting a run's repairs
 *   from the events at view time would read every repair event in the range (millions for an
 *   every-minute batch); the trigger adds one GROUP BY over the statement's new rows, and the repair
 *   pages already insert their events in one statement, so it runs once per page, not per event.
 *   Backfilled from the events already there. Pruned events leave their run's row (a few bytes).
 */
/** Each run's row of sweeper_runs from a set of events: the trigger's new rows, or the whole ledger (backfill). */
const runsRollupOf = (events: "sweeper_new_events" | "sweeper_events") =>
  `SELECT run_id,
    max(substr(stream, 7)) FILTER (WHERE type IN ('RunStarted', 'RunFinished')),
    min(occurred_at) FILTER (WHERE type = 'RunStarted'),
    max(occurred_at) FILTER (WHERE type = 'RunFinished'),
    max(data->>'outcome') FILTER (WHERE type = 'RunFinished'),
    (max((data->>'duration_ms')::numeric) FILTER (WHERE type = 'RunFinished'))::bigint,
    count(*) FILTER (WHERE stream NOT LIKE 'batch:%')
  FROM ${events} WHERE run_id IS NOT NULL GROUP BY run_id`

const consoleRollup = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE INDEX IF NOT EXISTS index_sweeper_events_on_run_id_and_id ON sweeper_events (run_id, id) WHERE run_id IS NOT NULL`
  yield* sql`CREATE TABLE IF NOT EXISTS sweeper_runs (
    run_id uuid PRIMARY KEY,
    batch text,
    started_at timestamptz,
    finished_at timestamptz,
    outcome text,
    duration_ms bigint,
    repairs bigint NOT NULL DEFAULT 0
  )`
  yield* sql`CREATE INDEX IF NOT EXISTS index_sweeper_runs_on_batch_and_finished_at ON sweeper_runs (batch, finished_at)`
  yield* sql.unsafe(`CREATE OR REPLACE FUNCTION sweeper_runs_rollup() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  INSERT INTO sweeper_runs AS r (run_id, batch, started_at, finished_at, outcome, duration_ms, repairs)
  ${runsRollupOf("sweeper_new_events")}
  ON CONFLICT (run_id) DO UPDATE SET
    batch = coalesce(r.batch, excluded.batch),
    started_at = coalesce(r.started_at, excluded.started_at),
    finished_at = coalesce(excluded.finished_at, r.finished_at),
    outcome = coalesce(excluded.outcome, r.outcome),
    duration_ms = coalesce(excluded.duration_ms, r.duration_ms),
    repairs = r.repairs + excluded.repairs;
  RETURN NULL;
END
$fn$`)
  yield* sql`DROP TRIGGER IF EXISTS sweeper_runs_rollup ON sweeper_events`
  yield* sql.unsafe(`CREATE TRIGGER sweeper_runs_rollup AFTER INSERT ON sweeper_events
    REFERENCING NEW TABLE AS sweeper_new_events FOR EACH STATEMENT EXECUTE FUNCTION sweeper_runs_rollup()`)
  yield* sql.unsafe(`INSERT INTO sweeper_runs (run_id, batch, started_at, finished_at, outcome, duration_ms, repairs)
    ${runsRollupOf("sweeper_events")}
    ON CONFLICT (run_id) DO NOTHING`)
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

const ALL = {
  "0001_platform_tables": platformTables,
  "0002_sweeper_tables": sweeperTables,
  "0003_schema_ownership": ownershipRecord,
  "0004_event_retention_indexes": retentionIndexes,
  "0005_console_rollup": consoleRollup,
  "0006_stuck_builds_family": stuckBuildsFamily
} as const

/** Migrations of Sweeper's own platform tables: a gitlab-mode database never gets them. */
const PLATFORM_ONLY: ReadonlySet<string> = new Set(["0001_platform_tables", "0006_stuck_builds_family"])

/** The migrations of a mode: gitlab mode never gets the platform tables. */
export const migrationsFor = (mode: SchemaMode) =>
  Migrator.fromRecord(
    mode === "gitlab"
      ? Object.fromEntries(Object.entries(ALL).filter(([name]) => !PLATFORM_ONLY.has(name)))
      : ALL
  )

const runMigrator = Migrator.make({})

/** `<id>_<name>` of every migration of `mode` not applied yet (the Migrator runs ids above the latest). */
export const pendingMigrations = (mode: SchemaMode) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const all = yield* migrationsFor(mode)
    const found = yield* sql<{ found: boolean }>`SELECT to_regclass(${MIGRATIONS_TABLE}) IS NOT NULL AS found`
    const latest = found[0]?.found === true
      ? Number(
        (yield* sql<{ latest: number | null }>`SELECT max(migration_id) AS latest FROM ${sql(MIGRATIONS_TABLE)}`)[0]
          ?.latest ?? 0
      )
      : 0
    return all.filter(([id]) => id > latest).map(([id, name]) => `${String(id).padStart(4, "0")}_${name}`)
  })

/**
 * Runs pending migrations of `mode`; concurrent processes wait on an advisory lock instead of racing
 * DDL. Mode detection happens under the lock too, so two processes cannot decide differently.
 */
export const migrateWith = (mode: Option.Option<SchemaMode>) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    return yield* sql.withTransaction(Effect.gen(function*() {
      yield* sql`SELECT pg_advisory_xact_lock(7356201)`
      const detected = yield* detectSchemaMode(mode)
      return yield* runMigrator({ loader: migrationsFor(detected.mode), table: MIGRATIONS_TABLE })
    }))
  })

/** Migrates with the mode detected from the database (tests, embedded). */
export const migrate = migrateWith(Option.none())
