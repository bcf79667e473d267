/**
 * The scans the batches run on PostgreSQL, the indexes that serve them, and how to build a missing
 * one without blocking GitLab. Sweeper never creates these on GitLab's tables by itself:
 * `sweeper doctor` EXPLAINs each scan on this database and prints the statements; only
 * `sweeper doctor --apply-indexes` runs them, one at a time, outside any transaction.
 *
 * Partitioned `p_ci_builds`: PostgreSQL refuses CREATE INDEX CONCURRENTLY on a partitioned parent,
 * and a plain CREATE INDEX on it locks every partition against writes for the whole build. GitLab's
 * own helper (`add_concurrent_partitioned_index`) builds the index concurrently on each partition,
 * then creates it on the parent, which attaches the existing ones. We do the same steps explicitly:
 * `CREATE INDEX CONCURRENTLY` on each partition, then `CREATE INDEX … ON ONLY p_ci_builds` (catalog
 * only: an invalid parent index that scans nothing) and `ALTER INDEX … ATTACH PARTITION` for each
 * partition's index (catalog only; the parent index turns valid once every partition is attached;
 * attaching one already attached does nothing). Partitions GitLab creates later get the index from
 * the parent automatically.
 */
import type { PgClient } from "@effect/sql-pg"
import type * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import type * as Statement from "effect/sql/Statement"
import { cancelingCutoff, DROP_BATCH_SIZE } from "../domain/Build.ts"
import { EVENT_RETENTION, PRUNE_PAGE_SIZE, pruneCutoff } from "../domain/Retention.ts"
import {
  PENDING_OUTDATED,
  PENDING_STUCK,
  PENDING_WAITING_FOR_ACK,
  RUNNING_OUTDATED,
  SCHEDULED_OUTDATED
} from "../domain/StuckBuilds.ts"
import { stuckCancelingQuery } from "../layers/postgres/BuildsSql.ts"
import type { BuildsTable } from "../layers/postgres/DatabaseSchema.ts"
import { prunePageQuery } from "../layers/postgres/EventRetentionSql.ts"
import { enqueuedJobsQuery } from "../layers/postgres/ExportJobsSql.ts"
import { existingIdsQuery } from "../layers/postgres/PlatformRecordsSql.ts"
import { stuckPageQuery } from "../layers/postgres/StuckBuildsSql.ts"
import { DropPendingBuilds } from "../programs/DropPendingBuilds.ts"
import { DropRunningBuilds } from "../programs/DropRunningBuilds.ts"
import { DropScheduledBuilds } from "../programs/DropScheduledBuilds.ts"

/** An index a scan wants: `CREATE INDEX <name> ON <table> (<columns>) WHERE <where>`. */
export interface IndexSpec {
  readonly name: string
  readonly table: string
  readonly columns: string
  readonly where?: string | undefined
}

export interface Scan {
  readonly batch: string
  readonly table: string
  readonly description: string
  readonly query: (sql: PgClient.PgClient, now: DateTime.Utc) => Statement.Statement<any>
  /**
   * The column that makes the scan small: an index serves it only if it narrows on this column
   * (index condition or partial predicate). GitLab's index on `updated_at` narrows the canceling
   * scan by `updated_at < cutoff`, which on a real database is nearly every build: not served.
   */
  readonly selectiveOn: string
  /** Absent: the primary key serves it on every GitLab database. */
  readonly wants: Option.Option<IndexSpec>
}

const CANCELING = "status = 'canceling' AND type = 'Ci::Build'"

/** The canceling walk's index, for either builds layout (keyset order: created_at, project_id, key). */
export const cancelingIndex = (builds: BuildsTable): IndexSpec =>
  builds.partitioned
    ? {
      name: "index_p_ci_builds_canceling_on_created_at_project_id",
      table: "p_ci_builds",
      columns: "created_at, project_id, id, partition_id",
      where: CANCELING
    }
    : {
      name: "index_ci_builds_canceling_on_created_at_project_id_id",
      table: "ci_builds",
      columns: "created_at, project_id, id",
      where: CANCELING
    }

export const exportJobsIndex: IndexSpec = {
  name: "index_project_export_jobs_on_status_queued_or_started",
  table: "project_export_jobs",
  columns: "id",
  where: "status IN (0, 1)"
}

export const eventsOccurredAtIndex: IndexSpec = {
  name: "index_sweeper_events_on_occurred_at",
  table: "sweeper_events",
  columns: "occurred_at"
}

/** Every SQL scan of every batch; batches not listed here only use Redis. */
export const scans = (builds: BuildsTable): ReadonlyArray<Scan> => [
  {
    batch: "stuck-export-jobs",
    table: "project_export_jobs",
    description: "queued/started export jobs, by id",
    query: (sql) => enqueuedJobsQuery(sql),
    selectiveOn: "status",
    wants: Option.some(exportJobsIndex)
  },
  {
    batch: "drop-canceling-builds",
    table: builds.name,
    description: `a page of ${DROP_BATCH_SIZE} stuck canceling builds, keyset order`,
    query: (sql, now) =>
      stuckCancelingQuery(sql, { cutoff: cancelingCutoff(now), after: Option.none(), limit: DROP_BATCH_SIZE }, builds),
    selectiveOn: "status",
    wants: Option.some(cancelingIndex(builds))
  },
  ...[DropPendingBuilds, DropRunningBuilds, DropScheduledBuilds].flatMap((batch, i) =>
    [[PENDING_OUTDATED, PENDING_WAITING_FOR_ACK, PENDING_STUCK], [RUNNING_OUTDATED], [SCHEDULED_OUTDATED]][i]!.map((
      rule
    ) => ({
      batch: batch.name,
      table: builds.name,
      description: `a page of ${DROP_BATCH_SIZE} ${rule.status} builds (${rule.stuckType}), keyset order`,
      query: (sql: PgClient.PgClient, now: DateTime.Utc) =>
        stuckPageQuery(sql, { rule, now, after: Option.none(), limit: DROP_BATCH_SIZE }, builds),
      selectiveOn: "status",
      // GitLab's own (status, created_at, project_id) index serves these walks: doctor reports a
      // database without it, and leaves the fix (restoring GitLab's index) to the operator.
      wants: Option.none<IndexSpec>()
    }))
  ),
  {
    // Sweeper's own table: migration 0004's online step builds this index (concurrently) in both
    // schema modes, so doctor only recommends it on a database whose migrations have not run.
    batch: "prune-events",
    table: "sweeper_events",
    description: `a page of ${PRUNE_PAGE_SIZE} events older than the retention cutoff, oldest first`,
    query: (sql, now) => prunePageQuery(sql, pruneCutoff(now, now, EVENT_RETENTION), [], PRUNE_PAGE_SIZE),
    selectiveOn: "occurred_at",
    wants: Option.some(eventsOccurredAtIndex)
  },
  {
    batch: "reschedule-stuck-issue-rebalances",
    table: "namespaces",
    description: "namespaces that still exist, by primary key",
    query: (sql) => existingIdsQuery(sql, "namespaces", [1, 2, 3]),
    selectiveOn: "id",
    wants: Option.none()
  },
  {
    batch: "reschedule-stuck-issue-rebalances",
    table: "projects",
    description: "projects that still exist, by primary key",
    query: (sql) => existingIdsQuery(sql, "projects", [1, 2, 3]),
    selectiveOn: "id",
    wants: Option.none()
  }
]

export const REDIS_ONLY_BATCHES = ["delete-stale-direct-uploads", "concurrency-limit-resume"] as const

export interface Partition {
  /** Schema-qualified, e.g. `gitlab_partitions_dynamic.ci_builds_101`. */
  readonly qualified: string
  readonly schema: string
  readonly name: string
}

/** The partitions of `table` (empty when it is not partitioned), in partition order. */
export const partitionsOf = (sql: PgClient.PgClient, table: string) =>
  Effect.map(
    sql<{ schema: string; name: string }>`
      SELECT n.nspname AS schema, c.relname AS name FROM pg_inherits i
      JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE i.inhparent = to_regclass(${table}) ORDER BY c.relname`,
    (rows) =>
      rows.map((r) => ({ schema: r.schema, name: r.name, qualified: `${quoteIdent(r.schema)}.${quoteIdent(r.name)}` }))
  )

const quoteIdent = (name: string) => /^[a-z_][a-z0-9_]*$/.test(name) ? name : `"${name.replace(/"/g, "\"\"")}"`

const where = (spec: IndexSpec) => spec.where === undefined ? "" : ` WHERE ${spec.where}`

/** PostgreSQL truncates identifiers at 63 bytes; keep a partition's index name inside that. */
const partitionIndexName = (spec: IndexSpec, partition: Partition) =>
  `index_${partition.name}_${spec.name.replace(/^index_p_ci_builds_/, "")}`.slice(0, 63)

/**
 * The exact statements that build `spec` without blocking writes, in order. A plain table: one
 * CREATE INDEX CONCURRENTLY. A partitioned one: see the header.
 */
export const createStatements = (spec: IndexSpec, partitions: ReadonlyArray<Partition>): ReadonlyArray<string> => {
  if (partitions.length === 0) {
    return [`CREATE INDEX CONCURRENTLY IF NOT EXISTS ${spec.name} ON ${spec.table} (${spec.columns})${where(spec)}`]
  }
  return [
    ...partitions.map((p) =>
      `CREATE INDEX CONCURRENTLY IF NOT EXISTS ${partitionIndexName(spec, p)} ON ${p.qualified} (${spec.columns})${
        where(spec)
      }`
    ),
    `CREATE INDEX IF NOT EXISTS ${spec.name} ON ONLY ${spec.table} (${spec.columns})${where(spec)}`,
    ...partitions.map((p) =>
      `ALTER INDEX ${spec.name} ATTACH PARTITION ${quoteIdent(p.schema)}.${partitionIndexName(spec, p)}`
    )
  ]
}

interface PlanNode {
  readonly "Node Type": string
  readonly "Relation Name"?: string
  readonly "Index Name"?: string
  readonly "Index Cond"?: string
  readonly Plans?: ReadonlyArray<PlanNode>
}

const walk = (node: PlanNode): ReadonlyArray<PlanNode> => [node, ...(node.Plans ?? []).flatMap(walk)]

export interface ScanVerdict {
  /** The plan PostgreSQL picks today (EXPLAIN, no ANALYZE), as text. */
  readonly plan: ReadonlyArray<string>
  /** Indexes that serve the scan when the table is large (sequential scans priced out). */
  readonly servedBy: ReadonlyArray<string>
  readonly served: boolean
}

/**
 * EXPLAINs `scan` twice: as planned today (shown), and with sequential scans priced out, which is how
 * the planner treats a large table. The scan is served when every read of its table then goes
 * through an index that narrows on the scan's selective column (its leading column, in the index
 * condition, or in its partial predicate). A full walk of the primary key, or an index narrowing on something that
 * selects most rows, does not count. A small table's plan is a sequential scan either way.
 */
export const judgeScan = (sql: PgClient.PgClient, scan: Scan, now: DateTime.Utc, relations: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const text = yield* sql<{ "QUERY PLAN": string }>`EXPLAIN ${scan.query(sql, now)}`
    const json = yield* sql.withTransaction(Effect.gen(function*() {
      yield* sql`SET LOCAL enable_seqscan = off`
      return yield* sql<{ "QUERY PLAN": unknown }>`EXPLAIN (FORMAT JSON) ${scan.query(sql, now)}`
    }))
    const raw = json[0]?.["QUERY PLAN"]
    const parsed = (typeof raw === "string" ? JSON.parse(raw) : raw) as ReadonlyArray<{ readonly Plan: PlanNode }>
    const nodes = walk(parsed[0]!.Plan)
    const used = nodes.filter((n) => n["Index Name"] !== undefined)
    const catalog = new Map(
      used.length === 0 ? [] : (yield* sql<{ name: string; predicate: string | null; leading: string | null }>`
      SELECT c.relname AS name, pg_get_expr(i.indpred, i.indrelid) AS predicate, a.attname AS leading FROM pg_index i
      JOIN pg_class c ON c.oid = i.indexrelid
      LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
      WHERE ${sql.in("c.relname", used.map((n) => n["Index Name"]!))}`).map((r) => [r.name, r] as const)
    )
    const mentions = (expression: string | null | undefined) =>
      expression !== undefined && expression !== null && new RegExp(`\\b${scan.selectiveOn}\\b`).test(expression)
    // PostgreSQL also accepts a condition on a later column of an index (and then reads all of it):
    // only a condition on the leading column, or a partial predicate, keeps the read small.
    const narrowing = (node: PlanNode) => {
      const index = catalog.get(node["Index Name"] ?? "")
      return index !== undefined &&
        (mentions(index.predicate) || (index.leading === scan.selectiveOn && mentions(node["Index Cond"])))
    }
    // Every node that reads the table: scans of it (by relation name) and bitmap index scans.
    const reads = nodes.filter((n) =>
      (n["Relation Name"] !== undefined && relations.includes(n["Relation Name"])) ||
      n["Node Type"] === "Bitmap Index Scan"
    )
    const served = reads.some((n) => n["Index Name"] !== undefined) &&
      reads.every((n) => n["Node Type"] === "Bitmap Heap Scan" || (n["Index Name"] !== undefined && narrowing(n)))
    return {
      plan: text.map((r) => r["QUERY PLAN"]),
      servedBy: served ? [...new Set(used.filter(narrowing).map((n) => n["Index Name"]!))] : [],
      served
    } satisfies ScanVerdict
  })
