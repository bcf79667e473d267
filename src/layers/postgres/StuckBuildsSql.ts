/**
 * The stuck-builds family on PostgreSQL: `p_ci_builds` when GitLab has it (every statement names a
 * build by `(id, partition_id)`), else `ci_builds`. One predicate per rule (`ruleMatch`) serves the
 * page read, the page write's guard and the re-read, so a row is repaired only while it still
 * matches what was decided.
 *
 * Why a keyset walk and not GitLab's "first 100 matching rows until empty": a row that never leaves
 * the scope (held by another transaction, refused by a trigger, a zombie) comes back first in every
 * re-query, so GitLab's loop never ends; the cursor here moves past every row read.
 */
import { PgClient } from "@effect/sql-pg"
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import type { SqlError } from "effect/sql/SqlError"
import type { BuildCursor, BuildKey } from "../../domain/Build.ts"
import { WRITE_LOCK_TRIGGER_PREFIX } from "../../domain/Databases.ts"
import { type FenceError, RowLocked } from "../../domain/Errors.ts"
import { BuildDoomed, BuildDropped } from "../../domain/Events.ts"
import {
  FailureReasons,
  type FailureReasonSet,
  reasonCodeOf,
  ruleCutoff,
  RUNNER_ONLINE_CONTACT_TIMEOUT,
  type StuckRule
} from "../../domain/StuckBuilds.ts"
import { retryOrDoomFamily } from "../../repair/StuckDropRetry.ts"
import type { DropManyResult } from "../../services/Builds.ts"
import { EventLog } from "../../services/EventLog.ts"
import { type FamilyBuild, StuckBuilds } from "../../services/StuckBuilds.ts"
import {
  buildEventFields,
  type BuildRow,
  dropPage,
  dropSide,
  failOneBuild,
  keyMatch,
  keysetAfter,
  keyString,
  toBuild
} from "./BuildsSql.ts"
import { type BuildsTable, detectBuildsTable, PlainBuilds } from "./DatabaseSchema.ts"
import { fenceWrite } from "./Fencing.ts"
import { RepairEvents } from "./Outbox.ts"

/** Which of GitLab's runner tables the database holds: decides how `build.stuck?` is asked. */
export interface RunnerTables {
  readonly runners: boolean
  readonly runnerProjects: boolean
  /** ci_runner_namespaces, and projects/namespaces held beside it (not in a decomposed ci database). */
  readonly groupScope: boolean
}

const detectRunnerTables = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  // Held here: present and not write-locked. A decomposed GitLab's ci database keeps stale, locked
  // copies of projects and namespaces (main's tables): joining those would find no group at all.
  const rows = yield* sql<{ name: string; found: boolean }>`
    SELECT name, to_regclass(name) IS NOT NULL AND NOT EXISTS (
        SELECT FROM pg_trigger t WHERE t.tgrelid = to_regclass(name)
          AND t.tgname = ${WRITE_LOCK_TRIGGER_PREFIX} || name AND t.tgenabled <> 'D') AS found
    FROM unnest(ARRAY['ci_runners', 'ci_runner_projects', 'ci_runner_namespaces', 'projects', 'namespaces']) AS name`
  const has = (name: string) => rows.some((row) => row.name === name && row.found)
  return {
    runners: has("ci_runners"),
    runnerProjects: has("ci_runner_projects"),
    groupScope: has("ci_runner_namespaces") && has("projects") && has("namespaces")
  } satisfies RunnerTables
})

/**
 * GitLab's `build.stuck?`: pending and no online runner could pick it. Online: active and contacted
 * within ONLINE_CONTACT_TIMEOUT. Could pick: an instance runner, a project runner assigned to the
 * build's project, a group runner of one of the project's ancestor groups. Runner tags are not
 * compared: a runner counts as able even when its tags do not fit, so Sweeper may leave a build
 * GitLab would call stuck (the one-day rule fails it later) but never fails one a runner could take.
 * Without a group scope to join, any online group runner counts as able, for the same reason.
 * Without ci_runners (a standalone database) no runner exists, so no runner can pick anything.
 */
const noOnlineRunner = (sql: PgClient.PgClient, runners: RunnerTables, now: DateTime.Utc) => {
  if (!runners.runners) return sql`TRUE`
  const online = DateTime.toDateUtc(DateTime.subtractDuration(now, RUNNER_ONLINE_CONTACT_TIMEOUT))
  const project = runners.runnerProjects
    ? sql`(r.runner_type = 3 AND EXISTS (
        SELECT FROM ci_runner_projects rp WHERE rp.runner_id = r.id AND rp.project_id = b.project_id))`
    : sql`FALSE`
  const group = runners.groupScope
    ? sql`(r.runner_type = 2 AND EXISTS (
        SELECT FROM ci_runner_namespaces rn JOIN namespaces n ON rn.namespace_id = ANY (n.traversal_ids)
        JOIN projects p ON p.namespace_id = n.id WHERE rn.runner_id = r.id AND p.id = b.project_id))`
    : sql`r.runner_type = 2`
  return sql`NOT EXISTS (SELECT FROM ci_runners r WHERE r.active AND r.contacted_at > ${online}
    AND (r.runner_type = 1 OR ${project} OR ${group}))`
}

/** The rule as a predicate on the builds table aliased `b`: status, age, and `stuck?` if it asks. */
export const ruleMatch = (sql: PgClient.PgClient, runners: RunnerTables, rule: StuckRule, now: DateTime.Utc) => {
  const cutoff = DateTime.toDateUtc(ruleCutoff(rule, now))
  const age = rule.timestamps === "scheduled_at"
    ? sql`b.scheduled_at IS NOT NULL AND b.scheduled_at < ${cutoff}`
    : rule.timestamps === "updated_at"
    ? sql`b.updated_at < ${cutoff}`
    : sql`b.created_at < ${cutoff} AND b.updated_at < ${cutoff}`
  const stuck = rule.noOnlineRunner ? sql`AND ${noOnlineRunner(sql, runners, now)}` : sql``
  const assigned = rule.runnerAssigned === true ? sql`AND b.runner_id IS NOT NULL` : sql``
  return sql`b.status = ${rule.status} AND b.type = 'Ci::Build' AND ${age} ${stuck} ${assigned}`
}

const columns = (sql: PgClient.PgClient, table: BuildsTable) =>
  sql`b.id, ${
    table.partitioned ? sql`b.partition_id, ` : sql``
  }b.project_id, b.runner_id, b.commit_id, b.status, b.lock_version, b.created_at, b.updated_at,
    to_char(b.created_at, 'YYYY-MM-DD HH24:MI:SS.US') AS created_at_exact`

const keysetColumns = (table: BuildsTable) => ["created_at", "project_id", ...table.key].map((c) => `b.${c}`).join(", ")

/**
 * One page of a rule in GitLab's order, (created_at, project_id), the primary key breaking ties so
 * no row is read twice. Exported for the storage tests' EXPLAIN.
 */
export const stuckPageQuery = (
  sql: PgClient.PgClient,
  options: {
    readonly rule: StuckRule
    readonly now: DateTime.Utc
    readonly after: Option.Option<BuildCursor>
    readonly limit: number
  },
  table: BuildsTable = PlainBuilds,
  runners: RunnerTables = { runners: false, runnerProjects: false, groupScope: false }
) => {
  const order = sql.literal(keysetColumns(table))
  const after = keysetAfter(sql, table, order, options.after)
  return sql<BuildRow>`
    SELECT ${columns(sql, table)} FROM ${sql(table.name)} AS b
    WHERE ${ruleMatch(sql, runners, options.rule, options.now)} ${after}
    ORDER BY ${order}
    LIMIT ${options.limit}`
}

const droppedEvent = (table: BuildsTable, rule: StuckRule, build: FamilyBuild, reason: number) =>
  new BuildDropped({
    ...buildEventFields(table, build, reason),
    stuck_type: rule.stuckType,
    rule: rule.name
  })

export const StuckBuildsSql = Layer.effect(
  StuckBuilds,
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const events = yield* EventLog
    const repairEvents = yield* RepairEvents
    const table = yield* detectBuildsTable
    const runners = yield* detectRunnerTables
    const side = yield* dropSide

    const findStuck = Effect.fn("StuckBuilds.findStuck")(function*(options: {
      readonly rule: StuckRule
      readonly now: DateTime.Utc
      readonly after: Option.Option<BuildCursor>
      readonly limit: number
    }) {
      return (yield* stuckPageQuery(sql, options, table, runners)).map(toBuild)
    })

    /**
     * A page in one statement (fence, claim with SKIP LOCKED, guarded UPDATE, events), as
     * drop-canceling's. A statement that fails for good (a trigger refusing one row aborts the whole
     * UPDATE) writes nothing; the page is then halved until the refused rows stand alone, so only
     * they stay behind. A transient failure (connection, deadlock) is the run's, as everywhere.
     */
    const dropMany: (
      rule: StuckRule,
      reasons: FailureReasonSet,
      builds: ReadonlyArray<FamilyBuild>,
      now: DateTime.Utc
    ) => Effect.Effect<DropManyResult, SqlError | FenceError> = Effect.fn("StuckBuilds.dropMany")(
      function*(rule: StuckRule, reasons: FailureReasonSet, builds: ReadonlyArray<FamilyBuild>, now: DateTime.Utc) {
        const reason = yield* reasonCodeOf(rule, reasons)
        // Halves, each its own statement, down to the refused rows alone (left for retryOrDoom to
        // count): a page with one refused row costs about 2·log2(page) statements, not one per row.
        const halves = Effect.gen(function*() {
          if (builds.length === 1) return { dropped: [], locked: [] } satisfies DropManyResult
          const half = Math.ceil(builds.length / 2)
          const [first, second] = [
            yield* dropMany(rule, reasons, builds.slice(0, half), now),
            yield* dropMany(rule, reasons, builds.slice(half), now)
          ]
          return {
            dropped: [...first.dropped, ...second.dropped],
            locked: [...first.locked, ...second.locked]
          } satisfies DropManyResult
        })
        return yield* dropPage(sql, table, repairEvents, side, {
          builds,
          match: ruleMatch(sql, runners, rule, now),
          status: "failed",
          reason,
          at: DateTime.toDateUtc(yield* DateTime.now),
          event: (build) => droppedEvent(table, rule, build, reason),
          refused: halves
        })
      }
    )

    /** Re-reads one build, if it still matches the rule at `now`. */
    const findMatching = (rule: StuckRule, now: DateTime.Utc) => (key: BuildKey) =>
      Effect.map(
        sql<BuildRow>`SELECT ${columns(sql, table)} FROM ${sql(table.name)} AS b
          WHERE ${keyMatch(sql, table, key)} AND ${ruleMatch(sql, runners, rule, now)}`,
        (rows) => Option.map(Option.fromNullishOr(rows[0]), toBuild)
      )

    /**
     * One build failed in its own fenced transaction: with the rule's reason, guarded by the rule and
     * the lock_version read (drop); with data_integrity_failure, guarded by the rule alone (doom).
     * Never waits for a row another transaction holds: RowLocked instead.
     */
    const failOne = (
      rule: StuckRule,
      reasons: FailureReasonSet,
      now: DateTime.Utc,
      outcome: "dropped" | "doomed"
    ) =>
    (build: FamilyBuild) =>
      events.transaction(Effect.gen(function*() {
        const reason = outcome === "dropped"
          ? yield* reasonCodeOf(rule, reasons)
          : FailureReasons.data_integrity_failure
        const lockGuard = outcome === "dropped" ? sql`AND b.lock_version = ${build.lockVersion}` : sql``
        yield* fenceWrite(sql)
        const written = yield* failOneBuild(sql, table, side, {
          build,
          guard: sql`${ruleMatch(sql, runners, rule, now)} ${lockGuard}`,
          outcome,
          status: "failed",
          reason,
          at: DateTime.toDateUtc(yield* DateTime.now)
        })
        if (written.updated === 0) {
          // Claimed yet not updated: a trigger swallowed the write; the row stays as it is for good.
          if (written.claimed > 0) return { failed: "refused" as const, jobs: 0 }
          if (written.matched) return yield* new RowLocked({ key: `build:${keyString(table, build)}` })
          return { failed: false, jobs: 0 }
        }
        const fields = buildEventFields(table, build, reason)
        yield* events.append(
          outcome === "dropped" ? droppedEvent(table, rule, build, reason) : new BuildDoomed(fields)
        )
        return { failed: true, jobs: written.jobs }
      })).pipe(
        Effect.tap((written) => written.failed === true ? repairEvents.committed(1) : Effect.void),
        Effect.tap((written) => written.jobs > 0 ? side.jobs.committed : Effect.void),
        Effect.map((written) => written.failed)
      )

    return StuckBuilds.of({
      findStuck,
      dropMany,
      retryOrDoom: (rule, reasons, lost, now) =>
        retryOrDoomFamily(rule, {
          find: findMatching(rule, now),
          drop: failOne(rule, reasons, now, "dropped"),
          doom: failOne(rule, reasons, now, "doomed")
        })(lost)
    })
  })
)
