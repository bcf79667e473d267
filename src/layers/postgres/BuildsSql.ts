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
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import type { SqlError } from "effect/sql/SqlError"
import type * as Statement from "effect/sql/Statement"
import { type BuildCursor, type BuildKey, type CancelingBuild, FailureReason } from "../../domain/Build.ts"
import { type FenceError, isTransientSqlError, RowLocked } from "../../domain/Errors.ts"
import { BuildDoomed, BuildDropped, type DomainEvent } from "../../domain/Events.ts"
import { cancelingEnd, CurrentFailureReasonSet, type FailureReasonSet } from "../../domain/StuckBuilds.ts"
import { CurrentTransitionQueues } from "../../domain/TransitionJobs.ts"
import { retryOrDoom } from "../../repair/DropRetry.ts"
import { Builds, type DropManyResult } from "../../services/Builds.ts"
import { EventLog } from "../../services/EventLog.ts"
import { type BuildsTable, detectBuildsTable, PlainBuilds } from "./DatabaseSchema.ts"
import { eventsForWrittenCte } from "./EventLogSql.ts"
import { fencedCte, fenceWrite } from "./Fencing.ts"
import { TransitionJobRelay } from "./JobOutbox.ts"
import { RepairEvents } from "./Outbox.ts"
import {
  detectTransitionTables,
  doomEffects,
  dropEffects,
  droppedColumns,
  dropSetItems,
  fromStatusColumn,
  jobsWritten,
  type TransitionTables
} from "./TransitionsSql.ts"

/** A build as the page queries select it (BuildsSql and StuckBuildsSql alike). */
export interface BuildRow {
  readonly id: string
  /** Only selected from p_ci_builds. */
  readonly partition_id?: string
  readonly project_id: string
  readonly runner_id: string | null
  /** The build's pipeline (GitLab's `commit_id`). */
  readonly commit_id: string | null
  readonly status: string
  readonly lock_version: number
  readonly created_at: Date
  readonly updated_at: Date
  /** created_at with its microseconds, for the keyset cursor (a Date keeps milliseconds). */
  readonly created_at_exact: string
}

export const toBuild = (row: BuildRow): CancelingBuild => ({
  id: Number(row.id),
  ...(row.partition_id === undefined ? {} : { partitionId: Number(row.partition_id) }),
  projectId: Number(row.project_id),
  runnerId: row.runner_id === null ? null : Number(row.runner_id),
  pipelineId: row.commit_id === null ? null : Number(row.commit_id),
  status: row.status,
  lockVersion: row.lock_version,
  createdAt: DateTime.fromDateUnsafe(row.created_at),
  updatedAt: DateTime.fromDateUnsafe(row.updated_at),
  createdAtExact: row.created_at_exact
})

const columns = (sql: PgClient.PgClient, table: BuildsTable) =>
  sql`id, ${
    table.partitioned ? sql`partition_id, ` : sql``
  }project_id, runner_id, commit_id, status, lock_version, created_at, updated_at,
    to_char(created_at, 'YYYY-MM-DD HH24:MI:SS.US') AS created_at_exact`

/**
 * The fields a build's BuildDropped / BuildDoomed event carries (partition_id on p_ci_builds; its
 * pipeline when it has one, for the run page).
 */
export const buildEventFields = (table: BuildsTable, build: CancelingBuild, reason: number) => ({
  id: build.id,
  ...(table.partitioned ? { partition_id: build.partitionId! } : {}),
  project_id: build.projectId,
  runner_id: build.runnerId,
  ...(build.pipelineId === undefined || build.pipelineId === null ? {} : { pipeline_id: build.pipelineId }),
  failure_reason: reason
})

/** A BuildDropped's `status`: only a build that did not end failed says how it ended. */
export const endedAs = (status: "failed" | "canceled") => status === "canceled" ? { status } : {}

/** `id = … [AND partition_id = …]`: the whole primary key of one build. */
export const keyMatch = (sql: PgClient.PgClient, table: BuildsTable, key: BuildKey) => {
  if (!table.partitioned) return sql`id = ${key.id}`
  if (key.partitionId === undefined) throw new Error(`build ${key.id} read from ${table.name} without its partition_id`)
  return sql`id = ${key.id} AND partition_id = ${key.partitionId}`
}

/**
 * A page's builds as one jsonb parameter for `jsonb_to_recordset`: key and the lock_version read.
 * One parameter whatever the page size, far from PostgreSQL's 65,535-parameter limit.
 */
const pageRecordset = (sql: PgClient.PgClient, table: BuildsTable, builds: ReadonlyArray<CancelingBuild>) => {
  const rows = builds.map((build) => {
    if (!table.partitioned) return { id: build.id, read_lock_version: build.lockVersion }
    if (build.partitionId === undefined) {
      throw new Error(`build ${build.id} read from ${table.name} without its partition_id`)
    }
    return { id: build.id, partition_id: build.partitionId, read_lock_version: build.lockVersion }
  })
  const shape = table.partitioned
    ? "id bigint, partition_id bigint, read_lock_version integer"
    : "id bigint, read_lock_version integer"
  return sql`jsonb_to_recordset(${sql.json(rows)}) AS r(${sql.literal(shape)})`
}

/** `b.id = r.id [AND b.partition_id = r.partition_id]`: the page's rows matched by their whole key. */
export const keyJoin = (sql: PgClient.PgClient, table: BuildsTable) =>
  sql.literal(table.key.map((column) => `b.${column} = r.${column}`).join(" AND "))

/** `c.id = b.id [AND …]`: a row of the table matched to the claimed rows. */
const claimedJoin = (sql: PgClient.PgClient, table: BuildsTable) =>
  sql.literal(table.key.map((column) => `c.${column} = b.${column}`).join(" AND "))

export const keyString = (
  table: BuildsTable,
  key: { readonly id: number | string; readonly partitionId?: number | string | undefined }
) => table.partitioned ? `${key.id}:${key.partitionId}` : `${key.id}`

/** The keyset order: (created_at, project_id) then the primary key. */
const keysetColumns = (table: BuildsTable) => ["created_at", "project_id", ...table.key].join(", ")

/**
 * `AND (<order>) > (<cursor>)`: the rest of a keyset walk after its last row (nothing on the first
 * page). created_at is compared with its microseconds when the cursor has them.
 */
export const keysetAfter = (
  sql: PgClient.PgClient,
  table: BuildsTable,
  order: ReturnType<PgClient.PgClient["literal"]>,
  after: Option.Option<BuildCursor>
) =>
  Option.match(after, {
    onNone: () => sql``,
    onSome: (c) => {
      const createdAt = c.createdAtExact !== undefined
        ? sql`${c.createdAtExact}::timestamp`
        : sql`${DateTime.toDateUtc(c.createdAt)}`
      const key = table.partitioned ? sql`${c.id}, ${c.partitionId ?? 0}` : sql`${c.id}`
      return sql`AND (${order}) > (${createdAt}, ${c.projectId}, ${key})`
    }
  })

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
  const after = keysetAfter(sql, table, order, options.after)
  return sql<BuildRow>`
    SELECT ${columns(sql, table)} FROM ${sql(table.name)}
    WHERE status = 'canceling' AND type = 'Ci::Build'
      AND created_at < ${cutoff} AND updated_at < ${cutoff} ${after}
    ORDER BY ${order}
    LIMIT ${options.limit}`
}

/**
 * Walks the canceling index from `after` to the first build still stuck (see
 * Builds.revisitWritten): the page query itself with LIMIT 1, so the same ordered index scan that
 * reads the pages, because only an index scan marks entries dead as it meets them
 * (kill_prior_tuple). A bounded range count is not that: on 1 M builds PostgreSQL served a
 * 1000-row range with a bitmap scan, which marks nothing (measured: the next run's first scan still
 * took 642 ms). Exported for the storage test's EXPLAIN.
 */
export const revisitWrittenQuery = (sql: PgClient.PgClient, from: {
  readonly cutoff: DateTime.Utc
  readonly after: Option.Option<BuildCursor>
}, table: BuildsTable = PlainBuilds) => stuckCancelingQuery(sql, { ...from, limit: 1 }, table)

/** A page of builds to fail in one statement (drop-canceling's and the stuck-builds family's). */
export interface DropPage {
  readonly builds: ReadonlyArray<CancelingBuild>
  /** What a build must still match, checked as the statement claims it: `b.status = 'canceling'`, a rule. */
  readonly match: Statement.Fragment
  /**
   * Where the build ends: `failed` with `reason`, or `canceled` (GitLab's `drop!` of a canceling
   * build) with `reason` null, failure_reason then left as it is, as GitLab leaves it.
   */
  readonly status: "failed" | "canceled"
  readonly reason: number | null
  readonly at: Date
  readonly event: (build: CancelingBuild) => DomainEvent
  /**
   * What a statement that fails for good (not a lost connection or a deadlock) answers instead, e.g.
   * the page in halves; absent, the failure is the run's.
   */
  readonly refused?: Effect.Effect<DropManyResult, SqlError | FenceError>
}

/** What every drop of a layer shares: GitLab's tables beside the builds here, and the jobs' relay. */
export interface DropSide {
  readonly tables: TransitionTables
  readonly jobs: typeof TransitionJobRelay.Service
}

/** The side of a drop layer, decided when it is built (on the builds' database). */
export const dropSide = Effect.gen(function*() {
  return { tables: yield* detectTransitionTables, jobs: yield* TransitionJobRelay } satisfies DropSide
})

/**
 * A page in ONE statement, so one round trip and one commit: the fence, one UPDATE … FROM the
 * page's (key, lock_version) with each row's own guard, what GitLab's transition does beside the
 * row (TransitionsSql.ts: its queue rows, its resource, the after-commit jobs into the outbox), and
 * the INSERT of the events of exactly the rows that UPDATE changed, as data-modifying CTEs of a
 * single autocommitted statement (all of it commits or none). A row that changed since it was read
 * (status or lock_version) is not in `dropped`: it stays as it is, gets no event and no side effect,
 * and the caller retries it on its own. Measured against BEGIN, fence, UPDATE, INSERT, COMMIT as
 * five round trips: see BENCHMARKS.md. After the commit the job outbox is relayed (JobOutbox.ts).
 *
 * The rows are claimed first with `FOR UPDATE SKIP LOCKED` (`claimed`), and only claimed rows
 * are updated: a row held by another open transaction is passed over instead of waited for (a
 * plain UPDATE waits for that transaction to end, however long). The claim checks `match` on the
 * row's newest version under the lock this statement then holds, so the UPDATE's own guard needs
 * only the lock_version, and reads the status the build leaves (which side effects apply).
 * `locked` tells those from lost races: page rows that still match their guard in the statement's
 * snapshot but were not claimed. It is read only when fewer rows were claimed than the page holds
 * (a one-time filter: PostgreSQL does not scan at all otherwise). A row changed and committed by
 * another writer in the instant between the snapshot and the claim also lands in `locked`: skipped
 * rather than retried, and the next run reads it as it is then.
 */
export const dropPage = Effect.fnUntraced(function*(
  sql: PgClient.PgClient,
  table: BuildsTable,
  repairEvents: typeof RepairEvents.Service,
  side: DropSide,
  page: DropPage
) {
  const { builds, match, reason, at } = page
  if (builds.length === 0) return { dropped: [], locked: [] } satisfies DropManyResult
  const key = table.partitioned ? sql`b.id::text || ':' || b.partition_id::text` : sql`b.id::text`
  const fence = yield* fencedCte(sql)
  const queues = yield* CurrentTransitionQueues
  const logged = yield* eventsForWrittenCte(
    sql,
    builds.map((build) => ({ key: keyString(table, build), event: page.event(build) })),
    "dropped",
    repairEvents.table
  )
  const claimedColumns = sql.literal(table.key.map((column) => `b.${column}`).join(", "))
  const failureReason = reason === null ? sql`` : sql`failure_reason = ${reason},`
  const statement = sql<{
    readonly fenced: string | number
    readonly keys: ReadonlyArray<string>
    readonly locked: ReadonlyArray<string>
    readonly jobs: string | number
  }>`
    WITH ${fence.ctes},
    page AS (SELECT * FROM ${pageRecordset(sql, table, builds)}),
    claimed AS (
      SELECT ${claimedColumns}, r.read_lock_version, ${fromStatusColumn(sql)}
      FROM ${sql(table.name)} AS b JOIN page r ON ${keyJoin(sql, table)}
      WHERE ${match} AND b.lock_version = r.read_lock_version AND EXISTS (SELECT FROM fenced)
      FOR UPDATE OF b SKIP LOCKED),
    dropped AS (
      UPDATE ${sql(table.name)} AS b SET status = ${page.status}, ${failureReason}
        finished_at = ${at}, updated_at = ${at}, lock_version = b.lock_version + 1, ${dropSetItems(sql)}
      FROM claimed r WHERE ${keyJoin(sql, table)} AND b.lock_version = r.read_lock_version
      RETURNING ${key} AS key, ${droppedColumns(sql, table)}),
    logged AS (${logged})${dropEffects(sql, table, side.tables, queues, "dropped")},
    locked AS (
      SELECT ${key} AS key FROM ${sql(table.name)} AS b JOIN page r ON ${keyJoin(sql, table)}
      WHERE (SELECT count(*) FROM claimed) < (SELECT count(*) FROM page) AND EXISTS (SELECT FROM fenced)
        AND ${match} AND b.lock_version = r.read_lock_version
        AND NOT EXISTS (SELECT FROM claimed c WHERE ${claimedJoin(sql, table)}))
    SELECT (SELECT count(*) FROM fenced) AS fenced,
      (SELECT coalesce(jsonb_agg(key), '[]') FROM dropped) AS keys,
      (SELECT coalesce(jsonb_agg(key), '[]') FROM locked) AS locked,
      ${jobsWritten(sql)} AS jobs`
  const refused = page.refused
  const answer = yield* (refused === undefined ? statement : statement.pipe(
    Effect.catchIf((error) => !isTransientSqlError(error), () => Effect.succeed(undefined))
  ))
  if (answer === undefined) return yield* refused!
  const row = answer[0]!
  if (Number(row.fenced) === 0 && Option.isSome(fence.lost)) return yield* fence.lost.value
  if (row.keys.length > 0) yield* repairEvents.committed(row.keys.length)
  if (Number(row.jobs) > 0) yield* side.jobs.committed
  const won = new Set(row.keys)
  const held = new Set(row.locked)
  // In page order, as the keyset read them.
  return {
    dropped: builds.filter((build) => won.has(keyString(table, build))),
    locked: builds.filter((build) => held.has(keyString(table, build)))
  } satisfies DropManyResult
})

/**
 * One build failed on its own (a retry after its page lost the race, or a doom), in the caller's
 * fenced transaction: claimed `FOR UPDATE SKIP LOCKED` while it matches `guard` (on the table
 * aliased `b`), then updated as a drop (GitLab's `drop!`: `status`, `reason`, and the transition's
 * side effects of TransitionsSql.ts with its jobs into the outbox) or a doom (GitLab's `doom!`:
 * failed / data_integrity_failure, finished_at kept when set, both queue rows deleted, nothing
 * else). Answers how many rows were claimed and updated, whether the row still matched `guard` in
 * the statement's snapshot (claimed none yet matched: another transaction holds it) and how many
 * jobs went into the outbox.
 */
export const failOneBuild = Effect.fnUntraced(function*(
  sql: PgClient.PgClient,
  table: BuildsTable,
  side: DropSide,
  write: {
    readonly build: BuildKey
    readonly guard: Statement.Fragment
    readonly outcome: "dropped" | "doomed"
    readonly status: "failed" | "canceled"
    readonly reason: number | null
    readonly at: Date
  }
) {
  const { at, build, guard } = write
  const dropping = write.outcome === "dropped"
  const failureReason = write.reason === null ? sql`` : sql`failure_reason = ${write.reason},`
  const set = dropping
    ? sql`finished_at = ${at}, ${dropSetItems(sql)},`
    : sql`finished_at = coalesce(b.finished_at, ${at}),`
  const effects = dropping
    ? dropEffects(sql, table, side.tables, yield* CurrentTransitionQueues, "updated")
    : doomEffects(sql, side.tables, "updated")
  const rows = yield* sql<{
    readonly claimed: string | number
    readonly updated: string | number
    readonly matched: boolean
    readonly jobs: string | number
  }>`
    WITH claimed AS (
      SELECT ${sql.literal(table.key.map((column) => `b.${column}`).join(", "))}, ${fromStatusColumn(sql)}
      FROM ${sql(table.name)} AS b WHERE ${keyMatch(sql, table, build)} AND ${guard}
      FOR UPDATE OF b SKIP LOCKED),
    updated AS (
      UPDATE ${sql(table.name)} AS b SET status = ${write.status}, ${failureReason} ${set}
        updated_at = ${at}, lock_version = b.lock_version + 1
      FROM claimed r WHERE ${keyJoin(sql, table)}
      RETURNING ${droppedColumns(sql, table)})${effects}
    SELECT (SELECT count(*) FROM claimed) AS claimed, (SELECT count(*) FROM updated) AS updated,
      EXISTS (SELECT FROM ${sql(table.name)} AS b WHERE ${keyMatch(sql, table, build)} AND ${guard}) AS matched,
      ${dropping ? jobsWritten(sql) : sql`0`} AS jobs`
  const row = rows[0]!
  return { claimed: Number(row.claimed), updated: Number(row.updated), matched: row.matched, jobs: Number(row.jobs) }
})

export const BuildsSql = Layer.effect(
  Builds,
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const events = yield* EventLog
    const repairEvents = yield* RepairEvents
    // Decided once per process: GitLab converts ci_builds to p_ci_builds in a migration, not live.
    const table = yield* detectBuildsTable
    const side = yield* dropSide

    const findStuckCanceling = Effect.fn("Builds.findStuckCanceling")(function*(options: {
      readonly cutoff: DateTime.Utc
      readonly after: Option.Option<BuildCursor>
      readonly limit: number
    }) {
      const rows = yield* stuckCancelingQuery(sql, options, table)
      return rows.map(toBuild)
    })

    const find = Effect.fn("Builds.find")(function*(key: BuildKey) {
      const rows = yield* sql<BuildRow>`SELECT ${columns(sql, table)} FROM ${sql(table.name)} WHERE ${
        keyMatch(sql, table, key)
      }`
      return Option.map(Option.fromNullishOr(rows[0]), toBuild)
    })

    /**
     * Fails a canceling build and appends its event, in one fenced transaction: a drop as GitLab's
     * `drop!` (the reason set decides failed or canceled; the transition's side effects), a doom as
     * its `doom!`. `lockVersion` guarded (drop); only the status guard (doom). The row is claimed
     * with `FOR UPDATE SKIP LOCKED` so a row another transaction holds is never waited for: then
     * nothing changes and, if the row still matched the guard in this statement's snapshot, the
     * build is RowLocked (the transaction, fence write included, rolls back).
     */
    const failBuild = (build: CancelingBuild, now: DateTime.Utc, outcome: "dropped" | "doomed") =>
      Effect.flatMap(CurrentFailureReasonSet, (set) => failBuildWith(build, now, outcome, set))
    const failBuildWith = (
      build: CancelingBuild,
      now: DateTime.Utc,
      outcome: "dropped" | "doomed",
      set: FailureReasonSet
    ) => {
      const end = outcome === "dropped"
        ? cancelingEnd(set)
        : {
          status: "failed" as const,
          written: FailureReason.data_integrity_failure,
          reason: FailureReason.data_integrity_failure
        }
      const lockGuard = outcome === "dropped" ? sql`AND b.lock_version = ${build.lockVersion}` : sql``
      return events.transaction(Effect.gen(function*() {
        yield* fenceWrite(sql)
        const written = yield* failOneBuild(sql, table, side, {
          build,
          guard: sql`b.status = 'canceling' ${lockGuard}`,
          outcome,
          status: end.status,
          reason: end.written,
          at: DateTime.toDateUtc(now)
        })
        if (written.updated === 0) {
          if (written.matched) return yield* new RowLocked({ key: `build:${keyString(table, build)}` })
          return { failed: false, jobs: 0 }
        }
        const fields = buildEventFields(table, build, end.reason)
        yield* events.append(
          outcome === "dropped" ? new BuildDropped({ ...fields, ...endedAs(end.status) }) : new BuildDoomed(fields)
        )
        return { failed: true, jobs: written.jobs }
      })).pipe(
        Effect.tap((written) => written.failed ? repairEvents.committed(1) : Effect.void),
        Effect.tap((written) => written.jobs > 0 ? side.jobs.committed : Effect.void),
        Effect.map((written) => written.failed)
      )
    }

    const dropMany = Effect.fn("Builds.dropMany")(function*(builds: ReadonlyArray<CancelingBuild>, now: DateTime.Utc) {
      const end = cancelingEnd(yield* CurrentFailureReasonSet)
      return yield* dropPage(sql, table, repairEvents, side, {
        builds,
        match: sql`b.status = 'canceling'`,
        status: end.status,
        reason: end.written,
        at: DateTime.toDateUtc(now),
        event: (build) => new BuildDropped({ ...buildEventFields(table, build, end.reason), ...endedAs(end.status) })
      })
    })

    const revisitWritten = Effect.fn("Builds.revisitWritten")(function*(from: {
      readonly cutoff: DateTime.Utc
      readonly after: Option.Option<BuildCursor>
    }) {
      yield* revisitWrittenQuery(sql, from, table)
    })

    const drop = Effect.fn("Builds.drop")((build: CancelingBuild, now: DateTime.Utc) =>
      failBuild(build, now, "dropped")
    )
    const doom = Effect.fn("Builds.doom")((build: CancelingBuild, now: DateTime.Utc) => failBuild(build, now, "doomed"))

    return Builds.of({
      findStuckCanceling,
      find,
      drop,
      dropMany,
      revisitWritten,
      doom,
      retryOrDoom: retryOrDoom({ find, drop, doom })
    })
  })
)
