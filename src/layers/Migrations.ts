/**
 * The platform tables with GitLab's names, types and encodings (SPEC §7), Sweeper's own event log,
 * and the indexes the batches' queries need. Run at start-up and by `sweeper migrate`.
 */
import { Effect } from "effect"
import { Migrator, SqlClient } from "effect/sql"

const platformTables = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE TABLE IF NOT EXISTS namespaces (
    id bigserial PRIMARY KEY,
    name text NOT NULL DEFAULT '',
    path text NOT NULL DEFAULT '',
    type varchar NOT NULL DEFAULT 'Group',
    parent_id bigint NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
  )`
  yield* sql`CREATE INDEX IF NOT EXISTS index_namespaces_on_parent_id ON namespaces (parent_id)`
  yield* sql`CREATE TABLE IF NOT EXISTS projects (
    id bigserial PRIMARY KEY,
    namespace_id bigint NOT NULL REFERENCES namespaces (id),
    name text NOT NULL DEFAULT '',
    path text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
  )`
  yield* sql`CREATE INDEX IF NOT EXISTS index_projects_on_namespace_id ON projects (namespace_id)`
  yield* sql`CREATE TABLE IF NOT EXISTS issues (
    id bigserial PRIMARY KEY,
    project_id bigint NOT NULL REFERENCES projects (id),
    title text NOT NULL DEFAULT '',
    relative_position integer NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
  )`
  yield* sql`CREATE INDEX IF NOT EXISTS index_issues_on_project_id_and_relative_position
    ON issues (project_id, relative_position, id)`
  yield* sql`CREATE TABLE IF NOT EXISTS project_export_jobs (
    id bigserial PRIMARY KEY,
    project_id bigint NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    jid varchar(100) NOT NULL UNIQUE,
    status smallint NOT NULL DEFAULT 0,
    user_id bigint NULL,
    exported_by_admin boolean DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
  )`
  // stuck-export-jobs reads only queued/started jobs: a partial index keeps that read small.
  yield* sql`CREATE INDEX IF NOT EXISTS index_project_export_jobs_on_status_queued_or_started
    ON project_export_jobs (id) WHERE status IN (0, 1)`
  yield* sql`CREATE TABLE IF NOT EXISTS project_relation_exports (
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
  yield* sql`CREATE TABLE IF NOT EXISTS ci_builds (
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
  )`
  // drop-canceling-builds walks canceling builds in (created_at, project_id, id) keyset order; the
  // partial index holds only those rows, so the walk never touches the millions of finished builds.
  yield* sql`CREATE INDEX IF NOT EXISTS index_ci_builds_canceling_on_created_at_project_id_id
    ON ci_builds (created_at, project_id, id) WHERE status = 'canceling' AND type = 'Ci::Build'`
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

export const migrations = Migrator.fromRecord({
  "0001_platform_tables": platformTables,
  "0002_sweeper_tables": sweeperTables
})

const runMigrator = Migrator.make({})

/** Runs pending migrations; concurrent processes wait on an advisory lock instead of racing DDL. */
export const migrate = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  return yield* sql.withTransaction(
    sql`SELECT pg_advisory_xact_lock(7356201)`.pipe(
      Effect.andThen(runMigrator({ loader: migrations, table: "sweeper_migrations" }))
    )
  )
})
