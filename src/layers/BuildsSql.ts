/**
 * Builds on PostgreSQL, timestamps without time zone holding UTC. GitLab ≥ 16 keeps them in
 * `p_ci_builds`, LIST-partitioned on `partition_id` (`ci_builds` = 100,
 * `gitlab_partitions_dynamic.ci_builds_<n>`): reading through the parent covers every partition, and
 * every statement names a build by its whole primary key `(id, partition_id)`, which also lets
 * PostgreSQL prune to one partition. Older GitLab and standalone databases: plain `ci_builds`.
 * The table and its key columns come from one `BuildsTable` value (DatabaseSchema.ts), so every
 * statement here is built from the same description.
 */
import { PgClient } from "@effect/sql-pg"
import { DateTime, Effect, Layer, Option } from "effect"
import { type BuildCursor, type BuildKey, type CancelingBuild, FailureReason } from "../domain/Build.ts"
import { BuildDoomed, BuildDropped } from "../domain/Events.ts"
import { Builds } from "../services/Builds.ts"
import { EventLog } from "../services/EventLog.ts"
import { type BuildsTable, detectBuildsTable, PlainBuilds } from "./DatabaseSchema.ts"
import { fenceWrite } from "./Fencing.ts"

interface BuildRow {
  readonly id: string
  /** Only selected from p_ci_builds. */
  readonly partition_id?: string
  readonly project_id: string
  readonly runner_id: string | null
  readonly status: string
  readonly lock_version: number
  readonly created_at: Date
  readonly updated_at: Date
  /** created_at with its microseconds, for the keyset cursor (a Date keeps milliseconds). */
  readonly created_at_exact: string
}

const toBuild = (row: BuildRow): CancelingBuild => ({
  id: Number(row.id),
  ...(row.partition_id === undefined ? {} : { partitionId: Number(row.partition_id) }),
  projectId: Number(row.project_id),
  runnerId: row.runner_id === null ? null : Number(row.runner_id),
  status: row.status,
  lockVersion: row.lock_version,
  createdAt: DateTime.fromDateUnsafe(row.created_at),
  updatedAt: DateTime.fromDateUnsafe(row.updated_at),
  createdAtExact: row.created_at_exact
})

const columns = (sql: PgClient.PgClient, table: BuildsTable) =>
  sql`id, ${table.partitioned ? sql`partition_id, ` : sql``}project_id, runner_id, status, lock_version, created_at, updated_at,
    to_char(created_at, 'YYYY-MM-DD HH24:MI:SS.US') AS created_at_exact`

/** `id = … [AND partition_id = …]`: the whole primary key of one build. */
export const keyMatch = (sql: PgClient.PgClient, table: BuildsTable, key: BuildKey) => {
  if (!table.partitioned) return sql`id = ${key.id}`
  if (key.partitionId === undefined) throw new Error(`build ${key.id} read from ${table.name} without its partition_id`)
  return sql`id = ${key.id} AND partition_id = ${key.partitionId}`
}

/** The keyset order: (created_at, project_id) then the primary key. */
const keysetColumns = (table: BuildsTable) => ["created_at", "project_id", ...table.key].join(", ")

/**
 * The canceling walk's page query (exported so storage tests and `sweeper doctor` EXPLAIN the exact
 * text). On a standalone database it is served by the partial index
 * `index_ci_builds_canceling_on_created_at_project_id_id` (see Indexes.ts for GitLab's databases).
 */
export const stuckCancelingQuery = (sql: PgClient.PgClient, options: {
  readonly cutoff: DateTime.Utc
  readonly after: Option.Option<BuildCursor>
  readonly limit: number
}, table: BuildsTable = PlainBuilds) => {
  const cutoff = DateTime.toDateUtc(options.cutoff)
  const order = sql.literal(keysetColumns(table))
  const after = Option.match(options.after, {
    onNone: () => sql``,
    onSome: (c) => {
      const createdAt = c.createdAtExact !== undefined ? sql`${c.createdAtExact}::timestamp` : sql`${DateTime.toDateUtc(c.createdAt)}`
      const key = table.partitioned ? sql`${c.id}, ${c.partitionId ?? 0}` : sql`${c.id}`
      return sql`AND (${order}) > (${createdAt}, ${c.projectId}, ${key})`
    }
  })
  return sql<BuildRow>`
    SELECT ${columns(sql, table)} FROM ${sql(table.name)}
    WHERE status = 'canceling' AND type = 'Ci::Build'
      AND created_at < ${cutoff} AND updated_at < ${cutoff} ${after}
    ORDER BY ${order}
    LIMIT ${options.limit}`
}

export const BuildsSql = Layer.effect(
  Builds,
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const events = yield* EventLog
    // Decided once per process: GitLab converts ci_builds to p_ci_builds in a migration, not live.
    const table = yield* detectBuildsTable

    const findStuckCanceling = Effect.fn("Builds.findStuckCanceling")(function*(options: {
      readonly cutoff: DateTime.Utc
      readonly after: Option.Option<BuildCursor>
      readonly limit: number
    }) {
      const rows = yield* stuckCancelingQuery(sql, options, table)
      return rows.map(toBuild)
    })

    const find = Effect.fn("Builds.find")(function*(key: BuildKey) {
      const rows = yield* sql<BuildRow>`SELECT ${columns(sql, table)} FROM ${sql(table.name)} WHERE ${keyMatch(sql, table, key)}`
      return Option.map(Option.fromNullishOr(rows[0]), toBuild)
    })

    /**
     * Fails a canceling build with `reason` and appends its event, in one fenced transaction.
     * `lockVersion` set: optimistic (drop); undefined: only the status guard (doom).
     */
    const failBuild = (build: CancelingBuild, now: DateTime.Utc, outcome: "dropped" | "doomed") => {
      const reason = outcome === "dropped" ? FailureReason.stuck_or_timeout_failure : FailureReason.data_integrity_failure
      const lockGuard = outcome === "dropped" ? sql`AND lock_version = ${build.lockVersion}` : sql``
      const at = DateTime.toDateUtc(now)
      return events.transaction(Effect.gen(function*() {
        yield* fenceWrite(sql)
        const updated = yield* sql`
          UPDATE ${sql(table.name)} SET status = 'failed', failure_reason = ${reason},
            finished_at = ${at}, updated_at = ${at}, lock_version = lock_version + 1
          WHERE ${keyMatch(sql, table, build)} AND status = 'canceling' ${lockGuard}
          RETURNING id`
        if (updated.length === 0) return false
        const fields = {
          id: build.id,
          ...(table.partitioned ? { partition_id: build.partitionId! } : {}),
          project_id: build.projectId,
          runner_id: build.runnerId,
          failure_reason: reason
        }
        yield* events.append(outcome === "dropped" ? new BuildDropped(fields) : new BuildDoomed(fields))
        return true
      }))
    }

    const drop = Effect.fn("Builds.drop")((build: CancelingBuild, now: DateTime.Utc) => failBuild(build, now, "dropped"))
    const doom = Effect.fn("Builds.doom")((build: CancelingBuild, now: DateTime.Utc) => failBuild(build, now, "doomed"))

    return Builds.of({ findStuckCanceling, find, drop, doom })
  })
)
