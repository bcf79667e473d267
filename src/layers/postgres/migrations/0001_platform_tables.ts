/** Migration 0001 (standalone only): the platform tables with GitLab's names, types and encodings. */
import * as Effect from "effect/Effect"
import * as SqlClient from "effect/sql/SqlClient"
import { createOwnershipTable, ownTable } from "./Ownership.ts"

export const platformTables = Effect.gen(function*() {
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
