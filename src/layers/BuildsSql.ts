/** Builds on PostgreSQL (`ci_builds`, timestamps without time zone holding UTC). */
import { PgClient } from "@effect/sql-pg"
import { DateTime, Effect, Layer, Option } from "effect"
import { type BuildCursor, type CancelingBuild, FailureReason } from "../domain/Build.ts"
import { BuildDoomed, BuildDropped } from "../domain/Events.ts"
import { Builds } from "../services/Builds.ts"
import { EventLog } from "../services/EventLog.ts"
import { fenceWrite } from "./Fencing.ts"

interface BuildRow {
  readonly id: string
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
  projectId: Number(row.project_id),
  runnerId: row.runner_id === null ? null : Number(row.runner_id),
  status: row.status,
  lockVersion: row.lock_version,
  createdAt: DateTime.fromDateUnsafe(row.created_at),
  updatedAt: DateTime.fromDateUnsafe(row.updated_at),
  createdAtExact: row.created_at_exact
})

const columns = (sql: PgClient.PgClient) =>
  sql`id, project_id, runner_id, status, lock_version, created_at, updated_at,
    to_char(created_at, 'YYYY-MM-DD HH24:MI:SS.US') AS created_at_exact`

/**
 * The canceling walk's page query (exported so storage tests can EXPLAIN the exact text): served by
 * the partial index `index_ci_builds_canceling_on_created_at_project_id_id`.
 */
export const stuckCancelingQuery = (sql: PgClient.PgClient, options: {
  readonly cutoff: DateTime.Utc
  readonly after: Option.Option<BuildCursor>
  readonly limit: number
}) => {
  const cutoff = DateTime.toDateUtc(options.cutoff)
  const after = Option.match(options.after, {
    onNone: () => sql``,
    onSome: (c) => {
      const createdAt = c.createdAtExact !== undefined ? sql`${c.createdAtExact}::timestamp` : sql`${DateTime.toDateUtc(c.createdAt)}`
      return sql`AND (created_at, project_id, id) > (${createdAt}, ${c.projectId}, ${c.id})`
    }
  })
  return sql<BuildRow>`
    SELECT ${columns(sql)} FROM ci_builds
    WHERE status = 'canceling' AND type = 'Ci::Build'
      AND created_at < ${cutoff} AND updated_at < ${cutoff} ${after}
    ORDER BY created_at, project_id, id
    LIMIT ${options.limit}`
}

export const BuildsSql = Layer.effect(
  Builds,
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const events = yield* EventLog

    const findStuckCanceling = Effect.fn("Builds.findStuckCanceling")(function*(options: {
      readonly cutoff: DateTime.Utc
      readonly after: Option.Option<BuildCursor>
      readonly limit: number
    }) {
      const rows = yield* stuckCancelingQuery(sql, options)
      return rows.map(toBuild)
    })

    const find = Effect.fn("Builds.find")(function*(id: number) {
      const rows = yield* sql<BuildRow>`SELECT ${columns(sql)} FROM ci_builds WHERE id = ${id}`
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
          UPDATE ci_builds SET status = 'failed', failure_reason = ${reason},
            finished_at = ${at}, updated_at = ${at}, lock_version = lock_version + 1
          WHERE id = ${build.id} AND status = 'canceling' ${lockGuard}
          RETURNING id`
        if (updated.length === 0) return false
        const fields = { id: build.id, project_id: build.projectId, runner_id: build.runnerId, failure_reason: reason }
        yield* events.append(outcome === "dropped" ? new BuildDropped(fields) : new BuildDoomed(fields))
        return true
      }))
    }

    const drop = Effect.fn("Builds.drop")((build: CancelingBuild, now: DateTime.Utc) => failBuild(build, now, "dropped"))
    const doom = Effect.fn("Builds.doom")((build: CancelingBuild, now: DateTime.Utc) => failBuild(build, now, "doomed"))

    return Builds.of({ findStuckCanceling, find, drop, doom })
  })
)
