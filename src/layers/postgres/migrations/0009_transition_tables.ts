/**
 * Migration 0009: what a drop needs beyond the build's row (GitLab's transition side effects).
 * - Both modes, in every database Sweeper migrates: `sweeper_job_outbox`, the Sidekiq jobs a drop
 *   owes GitLab (PipelineProcessWorker, Ci::BuildFinishedWorker, AssignResourceFromResourceGroupWorker),
 *   written in the drop's own statement and relayed to Redis after it commits (JobOutbox.ts). It
 *   sits beside the builds: ci's database on a decomposed GitLab, main's otherwise.
 * - Standalone only (a database whose ci_builds Sweeper created: embedded, demos, tests): GitLab's
 *   tables the drop touches, with GitLab's names and the columns used here, created when absent and
 *   recorded as Sweeper's (ci_pipelines, ci_pending_builds, ci_running_builds,
 *   ci_builds_runner_session, ci_resource_groups, ci_resources), and the build columns the drop
 *   writes or reads (processed, retried, resource_group_id). GitLab's own tables are never touched.
 */
import * as Effect from "effect/Effect"
import * as SqlClient from "effect/sql/SqlClient"
import { OWNERSHIP_TABLE } from "../DatabaseSchema.ts"

/** Ownership.ts's "create this platform table if absent, belonging here, and record it". */
export type OwnTable = (
  table: string,
  create: Effect.Effect<unknown, unknown, SqlClient.SqlClient>,
  indexes?: ReadonlyArray<Effect.Effect<unknown, unknown, SqlClient.SqlClient>>
) => Effect.Effect<void, unknown, SqlClient.SqlClient>

/**
 * The job outbox. `batch` names one page write's jobs (a uuid, drawn by PostgreSQL in the write's
 * statement, so no restore of this database can make two batches share one); the relay pushes a
 * batch per queue under a Redis marker named by it, so a batch pushed once is refused the second
 * time. `claimed_at` and `claimed_by` keep two relays from pushing the same batch at once (see
 * JobOutbox.ts).
 */
const jobOutbox = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE TABLE IF NOT EXISTS sweeper_job_outbox (
    id bigserial PRIMARY KEY,
    batch uuid NOT NULL,
    worker text NOT NULL,
    queue text NOT NULL,
    args jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    claimed_at timestamptz NULL,
    claimed_by uuid NULL
  )`
  yield* sql`CREATE INDEX IF NOT EXISTS index_sweeper_job_outbox_on_batch ON sweeper_job_outbox (batch)`
})

/** Whether Sweeper created ci_builds in this database (standalone), so the platform part applies here. */
const ownsBuilds = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  // Two steps: a ci database in gitlab mode has no ownership table, and a statement naming a missing
  // table would abort the migration's transaction.
  const found = yield* sql<{ found: boolean }>`SELECT to_regclass(${OWNERSHIP_TABLE}) IS NOT NULL AS found`
  if (found[0]?.found !== true) return false
  const owned = yield* sql<{ n: string }>`SELECT count(*) AS n FROM ${sql(OWNERSHIP_TABLE)}
    WHERE table_name = 'ci_builds'`
  return Number(owned[0]?.n ?? 0) > 0
})

const platformTables = (ownTable: OwnTable) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    if (!(yield* ownsBuilds)) return
    yield* sql`ALTER TABLE ci_builds ADD COLUMN IF NOT EXISTS processed boolean NULL`
    yield* sql`ALTER TABLE ci_builds ADD COLUMN IF NOT EXISTS retried boolean NULL`
    yield* sql`ALTER TABLE ci_builds ADD COLUMN IF NOT EXISTS resource_group_id bigint NULL`
    yield* ownTable(
      "ci_pipelines",
      sql`CREATE TABLE ci_pipelines (
      id bigserial PRIMARY KEY,
      project_id bigint NOT NULL,
      ref varchar NULL,
      sha varchar NULL,
      status varchar NULL,
      lock_version integer NOT NULL DEFAULT 0,
      created_at timestamp NOT NULL DEFAULT (now() AT TIME ZONE 'UTC'),
      updated_at timestamp NOT NULL DEFAULT (now() AT TIME ZONE 'UTC'),
      started_at timestamp NULL,
      finished_at timestamp NULL,
      duration integer NULL
    )`,
      [sql`CREATE INDEX index_ci_pipelines_on_status_and_id ON ci_pipelines (status, id)`]
    )
    // The builds' pipeline, as GitLab's commit_id.
    yield* sql`CREATE INDEX IF NOT EXISTS index_ci_builds_on_commit_id ON ci_builds (commit_id)`
    yield* ownTable(
      "ci_pending_builds",
      sql`CREATE TABLE ci_pending_builds (
      id bigserial PRIMARY KEY,
      build_id bigint NOT NULL,
      project_id bigint NOT NULL,
      partition_id bigint NOT NULL DEFAULT 100,
      created_at timestamptz NOT NULL DEFAULT now()
    )`,
      [sql`CREATE UNIQUE INDEX index_ci_pending_builds_on_build_id ON ci_pending_builds (build_id)`]
    )
    yield* ownTable(
      "ci_running_builds",
      sql`CREATE TABLE ci_running_builds (
      id bigserial PRIMARY KEY,
      build_id bigint NOT NULL,
      project_id bigint NOT NULL,
      runner_id bigint NOT NULL,
      runner_type smallint NOT NULL,
      partition_id bigint NOT NULL DEFAULT 100,
      created_at timestamptz NOT NULL DEFAULT now()
    )`,
      [sql`CREATE UNIQUE INDEX index_ci_running_builds_on_build_id ON ci_running_builds (build_id)`]
    )
    yield* ownTable(
      "ci_builds_runner_session",
      sql`CREATE TABLE ci_builds_runner_session (
      id bigserial PRIMARY KEY,
      url varchar NOT NULL,
      build_id bigint NOT NULL,
      partition_id bigint NOT NULL DEFAULT 100,
      project_id bigint NOT NULL
    )`,
      [sql`CREATE UNIQUE INDEX index_ci_builds_runner_session_on_build_id ON ci_builds_runner_session (build_id)`]
    )
    yield* ownTable(
      "ci_resource_groups",
      sql`CREATE TABLE ci_resource_groups (
      id bigserial PRIMARY KEY,
      project_id bigint NOT NULL,
      key varchar(255) NOT NULL,
      process_mode smallint NOT NULL DEFAULT 0,
      created_at timestamptz NOT NULL DEFAULT now(),
      updated_at timestamptz NOT NULL DEFAULT now()
    )`,
      [sql`CREATE UNIQUE INDEX index_ci_resource_groups_on_project_id_and_key ON ci_resource_groups (project_id, key)`]
    )
    yield* ownTable(
      "ci_resources",
      sql`CREATE TABLE ci_resources (
      id bigserial PRIMARY KEY,
      resource_group_id bigint NOT NULL,
      build_id bigint NULL,
      partition_id bigint NULL,
      project_id bigint NOT NULL,
      created_at timestamptz NOT NULL DEFAULT now(),
      updated_at timestamptz NOT NULL DEFAULT now()
    )`,
      [
        sql`CREATE INDEX index_ci_resources_on_build_id ON ci_resources (build_id)`,
        sql`CREATE UNIQUE INDEX index_ci_resources_on_resource_group_id_and_build_id
          ON ci_resources (resource_group_id, build_id)`
      ]
    )
  })

export const transitionTables = (ownTable: OwnTable) =>
  Effect.gen(function*() {
    yield* jobOutbox
    yield* platformTables(ownTable)
  })
