/**
 * GitLab's transition side effects of a drop, as CTEs that join the drop's own statement (so they
 * commit with the build's UPDATE or not at all, in its round trip). GitLab's `build.drop!(reason)`
 * (app/models/commit_status.rb, app/models/ci/build.rb, app/models/ci/processable.rb at
 * gitlabhq/gitlabhq 41946e65501d176230532ae34b16e64f5cdac462) does, beyond status and reason:
 *
 *   on the row       processed = false for a latest build (`retried` not true), true for a retried
 *                    one (CommitStatus before_save); scheduled_at = NULL when it leaves scheduled
 *   leaving pending  DELETE its ci_pending_builds row, by build_id (UpdateBuildQueueService#pop)
 *   leaving running  DELETE its ci_running_builds row (#untrack) and its ci_builds_runner_session
 *   completed        with a resource group: its ci_resources row freed (build_id, partition_id NULL)
 *   after commit     PipelineProcessWorker [pipeline_id] (latest builds only),
 *                    Ci::BuildFinishedWorker [build_id],
 *                    Ci::ResourceGroups::AssignResourceFromResourceGroupWorker [resource_group_id]
 *
 * The after-commit jobs cannot be pushed in the transaction, so the statement writes them into the job
 * outbox (`sweeper_job_outbox_batches`, one row for all of them) beside the builds, and the relay
 * (JobOutbox.ts) pushes them after the commit, exactly once. `doom!` (data_integrity_failure) is
 * `update_columns`, which skips every callback: it deletes both queue rows and does nothing else
 * (`dooms`).
 *
 * Each table is touched only where this database holds it (present, not write-locked): GitLab has
 * all of them; a database without one (an older standalone schema) does without that effect, and
 * `sweeper doctor` says which effects a drop produces here.
 */
import type { PgClient } from "@effect/sql-pg"
import * as Effect from "effect/Effect"
import * as SqlClient from "effect/sql/SqlClient"
import { WRITE_LOCK_TRIGGER_PREFIX } from "../../domain/Databases.ts"
import {
  ASSIGN_RESOURCE_WORKER,
  BUILD_FINISHED_WORKER,
  PIPELINE_PROCESS_WORKER,
  type TransitionQueues
} from "../../domain/TransitionJobs.ts"
import type { BuildsTable } from "./DatabaseSchema.ts"

/** GitLab's tables beside the builds that a drop changes. */
export const TRANSITION_TABLES = [
  "ci_pending_builds",
  "ci_running_builds",
  "ci_builds_runner_session",
  "ci_resources"
] as const

/** Which of them this database holds (present and not write-locked), decided once per process. */
export interface TransitionTables {
  readonly pendingBuilds: boolean
  readonly runningBuilds: boolean
  readonly runnerSessions: boolean
  readonly resources: boolean
}

export const NO_TRANSITION_TABLES: TransitionTables = {
  pendingBuilds: false,
  runningBuilds: false,
  runnerSessions: false,
  resources: false
}

export const detectTransitionTables = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const rows = yield* sql<{ name: string; held: boolean }>`
    SELECT t.name, to_regclass(t.name) IS NOT NULL AND NOT EXISTS (
        SELECT FROM pg_trigger g WHERE g.tgrelid = to_regclass(t.name)
          AND g.tgname = ${WRITE_LOCK_TRIGGER_PREFIX} || t.name AND g.tgenabled <> 'D') AS held
    FROM unnest(string_to_array(${TRANSITION_TABLES.join(",")}, ',')) AS t(name)`
  const held = (name: string) => rows.some((row) => row.name === name && row.held)
  return {
    pendingBuilds: held("ci_pending_builds"),
    runningBuilds: held("ci_running_builds"),
    runnerSessions: held("ci_builds_runner_session"),
    resources: held("ci_resources")
  } satisfies TransitionTables
})

/** What a drop does beside the row on this database, one line each (`sweeper doctor`). */
export const describeTransitionEffects = (tables: TransitionTables): ReadonlyArray<string> => [
  "processed = false on the dropped build (true on a retried one), as GitLab's before_save",
  tables.pendingBuilds
    ? "a build leaving pending: its ci_pending_builds row deleted"
    : "ci_pending_builds not held here: no runner-queue row deleted",
  tables.runningBuilds
    ? "a build leaving running: its ci_running_builds row deleted"
    : "ci_running_builds not held here: no running-build row deleted",
  tables.runnerSessions
    ? "a build leaving running: its ci_builds_runner_session row deleted"
    : "ci_builds_runner_session not held here: no runner session deleted",
  tables.resources
    ? "a build holding a resource-group resource: ci_resources row freed"
    : "ci_resources not held here: no resource freed",
  "after commit, through sweeper_job_outbox_batches: PipelineProcessWorker per pipeline, Ci::BuildFinishedWorker per " +
  "build, AssignResourceFromResourceGroupWorker per resource group",
  "a doomed build (data_integrity_failure): its queue rows deleted, nothing else (GitLab's doom!)"
]

/**
 * What a drop's claim CTE must select beside the key, for the UPDATE to hand on: the status the
 * build leaves (the claim reads it under the row lock this statement then holds).
 */
export const fromStatusColumn = (sql: PgClient.PgClient) => sql`b.status AS from_status`

/**
 * The SET items of a drop beyond status, reason and timestamps, with `r` the claimed row: GitLab's
 * before_save on `processed`, and `scheduled_at` cleared when the build leaves scheduled.
 */
export const dropSetItems = (sql: PgClient.PgClient) =>
  sql`processed = coalesce(b.retried, false),
    scheduled_at = CASE WHEN r.from_status = 'scheduled' THEN NULL ELSE b.scheduled_at END`

/** What the drop's UPDATE returns for the side-effect CTEs (the builds table aliased `b`, claim `r`). */
export const droppedColumns = (sql: PgClient.PgClient, table: BuildsTable) =>
  sql`b.id AS build_id, ${
    table.partitioned ? sql`b.partition_id AS build_partition_id` : sql`NULL::bigint AS build_partition_id`
  }, r.from_status, b.commit_id AS pipeline_id, b.resource_group_id, b.retried`

/**
 * The side-effect CTEs of a drop, each `, name AS (…)`, over the CTE `from` that returns
 * `droppedColumns`. The jobs of one statement are one outbox row (migration 0013), in push order:
 * runs of one worker, each run's jobs by id; its batch id is drawn by PostgreSQL (the column's
 * default). None when the statement dropped nothing.
 */
export const dropEffects = (
  sql: PgClient.PgClient,
  table: BuildsTable,
  tables: TransitionTables,
  queues: TransitionQueues,
  from: string
) => {
  const d = sql.literal(from)
  const resourceKey = table.partitioned ? sql`AND c.partition_id = d.build_partition_id` : sql``
  return sql`${
    tables.pendingBuilds
      ? sql`, unqueued AS (DELETE FROM ci_pending_builds q USING ${d} d
      WHERE q.build_id = d.build_id AND d.from_status = 'pending')`
      : sql``
  }${
    tables.runningBuilds
      ? sql`, untracked AS (DELETE FROM ci_running_builds q USING ${d} d
      WHERE q.build_id = d.build_id AND d.from_status = 'running')`
      : sql``
  }${
    tables.runnerSessions
      ? sql`, unsessioned AS (DELETE FROM ci_builds_runner_session s USING ${d} d
      WHERE s.build_id = d.build_id AND d.from_status = 'running')`
      : sql``
  }${
    tables.resources
      ? sql`, released AS (UPDATE ci_resources c SET build_id = NULL, partition_id = NULL FROM ${d} d
      WHERE c.resource_group_id = d.resource_group_id AND c.build_id = d.build_id ${resourceKey})`
      : sql``
  }, jobs AS (INSERT INTO sweeper_job_outbox_batches (jobs, size)
      SELECT jsonb_agg(jsonb_build_object('worker', r.worker, 'queue', r.queue, 'args', r.args) ORDER BY r.kind),
        sum(r.size)
      FROM (
        SELECT j.kind, j.worker, j.queue, jsonb_agg(j.args ORDER BY j.n) AS args, count(*) AS size FROM (
          SELECT 1 AS kind, ${PIPELINE_PROCESS_WORKER}::text AS worker,
            ${
    queues[PIPELINE_PROCESS_WORKER]
  }::text AS queue, jsonb_build_array(p.pipeline_id) AS args, p.pipeline_id AS n
          FROM (SELECT DISTINCT pipeline_id FROM ${d} WHERE pipeline_id IS NOT NULL AND retried IS NOT TRUE) p
          UNION ALL
          SELECT 2, ${BUILD_FINISHED_WORKER}::text, ${queues[BUILD_FINISHED_WORKER]}::text,
            jsonb_build_array(build_id), build_id FROM ${d}
          UNION ALL
          SELECT 3, ${ASSIGN_RESOURCE_WORKER}::text, ${queues[ASSIGN_RESOURCE_WORKER]}::text,
            jsonb_build_array(g.resource_group_id), g.resource_group_id
          FROM (SELECT DISTINCT resource_group_id FROM ${d} WHERE resource_group_id IS NOT NULL) g
        ) j GROUP BY j.kind, j.worker, j.queue
      ) r
      HAVING count(*) > 0
      RETURNING size)`
}

/**
 * The CTEs of a doom, over the CTE `from` returning `build_id`: GitLab's `doom!` deletes the build's
 * ci_pending_builds and ci_running_builds rows by build_id whatever status it left, and nothing else.
 */
export const doomEffects = (sql: PgClient.PgClient, tables: TransitionTables, from: string) => {
  const d = sql.literal(from)
  return sql`${
    tables.pendingBuilds
      ? sql`, unqueued AS (DELETE FROM ci_pending_builds q USING ${d} d WHERE q.build_id = d.build_id)`
      : sql``
  }${
    tables.runningBuilds
      ? sql`, untracked AS (DELETE FROM ci_running_builds q USING ${d} d WHERE q.build_id = d.build_id)`
      : sql``
  }`
}

/** How many jobs a drop statement wrote into the outbox (its `jobs` CTE): whether a relay is owed. */
export const jobsWritten = (sql: PgClient.PgClient) => sql`(SELECT coalesce(sum(size), 0) FROM jobs)`
