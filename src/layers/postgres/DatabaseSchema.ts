/**
 * Who owns which tables. GitLab owns its tables; Sweeper owns only `sweeper_*` tables.
 * In `gitlab` mode Sweeper never runs DDL on GitLab's tables; in `standalone` mode (empty database:
 * embedded, demos, tests) it creates the platform tables itself and records each one it created in
 * `sweeper_schema_ownership`, which is how a later start tells its own tables from GitLab's.
 *
 * Also here: which table builds live in (`p_ci_builds`, GitLab ≥ 16, LIST-partitioned on
 * `partition_id`, or the older plain `ci_builds`) and the start-up check of every column a batch uses.
 */
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import * as SqlClient from "effect/sql/SqlClient"
import type { SqlError } from "effect/sql/SqlError"

export type SchemaMode = "gitlab" | "standalone"

export const OWNERSHIP_TABLE = "sweeper_schema_ownership"
export const MIGRATIONS_TABLE = "sweeper_migrations"

export class SchemaNotMigrated extends Schema.TaggedError<SchemaNotMigrated>()("SchemaNotMigrated", {
  pending: Schema.Array(Schema.String)
}) {
  override get message() {
    return `Sweeper's tables are missing or out of date (pending: ${this.pending.join(", ")}): run \`sweeper migrate\``
  }
}

export class MissingColumn extends Schema.TaggedError<MissingColumn>()("MissingColumn", {
  table: Schema.String,
  column: Schema.String,
  expected: Schema.String,
  /** The column's type family when it exists with the wrong type; absent when it does not exist. */
  found: Schema.optionalKey(Schema.String)
}) {
  override get message() {
    return this.found === undefined
      ? `column ${this.table}.${this.column} is missing (a batch needs it as ${this.expected})`
      : `column ${this.table}.${this.column} is ${this.found}, a batch needs ${this.expected}`
  }
}

const exists = (sql: SqlClient.SqlClient, relation: string) =>
  Effect.map(
    sql<{ found: boolean }>`SELECT to_regclass(${relation}) IS NOT NULL AS found`,
    (rows) => rows[0]?.found === true
  )

/**
 * Sweeper created `table` if its ownership record says so, or (databases migrated before the record
 * existed) if Sweeper's platform-tables migration is recorded as applied.
 */
const createdBySweeper = (sql: SqlClient.SqlClient, table: string) =>
  Effect.gen(function*() {
    if (yield* exists(sql, OWNERSHIP_TABLE)) {
      const owned = yield* sql<{ n: string }>`SELECT count(*) AS n FROM ${
        sql(OWNERSHIP_TABLE)
      } WHERE table_name = ${table}`
      if (Number(owned[0]?.n ?? 0) > 0) return true
    }
    if (yield* exists(sql, MIGRATIONS_TABLE)) {
      const legacy = yield* sql<{ n: string }>`SELECT count(*) AS n FROM ${sql(MIGRATIONS_TABLE)}
        WHERE migration_id = 1 AND name = 'platform_tables'`
      return Number(legacy[0]?.n ?? 0) > 0
    }
    return false
  })

/**
 * `SWEEPER_SCHEMA` when set; else gitlab when the database's marker table exists and Sweeper did
 * not create it, standalone when it is Sweeper's or absent.
 */
const detectModeBy = (
  configured: Option.Option<SchemaMode>,
  markerTable: (sql: SqlClient.SqlClient) => Effect.Effect<string, SqlError>
) =>
  Effect.gen(function*() {
    if (Option.isSome(configured)) return { mode: configured.value, source: "SWEEPER_SCHEMA" as const }
    const sql = yield* SqlClient.SqlClient
    const marker = yield* markerTable(sql)
    const gitlab = (yield* exists(sql, marker)) && !(yield* createdBySweeper(sql, marker))
    return { mode: gitlab ? "gitlab" as const : "standalone" as const, source: "detected" as const }
  })

/** Main's mode, told by `project_export_jobs`. */
export const detectSchemaMode = (configured: Option.Option<SchemaMode>) =>
  detectModeBy(configured, () => Effect.succeed("project_export_jobs"))

/** A separate ci database's mode, told by its builds table (GitLab's ci database has one it made). */
export const detectCiSchemaMode = (configured: Option.Option<SchemaMode>) =>
  detectModeBy(
    configured,
    (sql) => Effect.map(exists(sql, "p_ci_builds"), (found) => found ? "p_ci_builds" : "ci_builds")
  )

/**
 * Where builds are read and written. Partitioned: `p_ci_builds`, whose primary key is
 * `(id, partition_id)`, so every statement names a build by both. The key columns are listed here
 * once, so every query (page, re-read, update) is built from the same description.
 */
export interface BuildsTable {
  readonly name: "p_ci_builds" | "ci_builds"
  readonly partitioned: boolean
  /** The columns that identify one build: the primary key. */
  readonly key: ReadonlyArray<"id" | "partition_id">
}

export const PartitionedBuilds: BuildsTable = { name: "p_ci_builds", partitioned: true, key: ["id", "partition_id"] }
export const PlainBuilds: BuildsTable = { name: "ci_builds", partitioned: false, key: ["id"] }

export const detectBuildsTable = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  return (yield* exists(sql, "p_ci_builds")) ? PartitionedBuilds : PlainBuilds
})

/** Type families: what a batch relies on, not the exact width (GitLab moved ids from int to bigint). */
export type TypeFamily = "integer" | "text" | "timestamp" | "boolean"

const FAMILIES: Record<string, TypeFamily> = {
  smallint: "integer",
  integer: "integer",
  bigint: "integer",
  text: "text",
  "character varying": "text",
  character: "text",
  "timestamp without time zone": "timestamp",
  "timestamp with time zone": "timestamp",
  boolean: "boolean"
}

/** Every column a batch reads or writes, by table. */
export const requiredColumns = (
  builds: BuildsTable
): ReadonlyArray<readonly [string, ReadonlyArray<readonly [string, TypeFamily]>]> => [
  ["project_export_jobs", [["id", "integer"], ["project_id", "integer"], ["jid", "text"], ["status", "integer"], [
    "created_at",
    "timestamp"
  ], ["updated_at", "timestamp"]]],
  ["project_relation_exports", [["project_export_job_id", "integer"]]],
  ["namespaces", [["id", "integer"]]],
  ["projects", [["id", "integer"]]],
  [builds.name, [
    ["id", "integer"],
    ...(builds.partitioned ? [["partition_id", "integer"] as const] : []),
    ["project_id", "integer"],
    ["runner_id", "integer"],
    ["type", "text"],
    ["status", "text"],
    ["failure_reason", "integer"],
    ["lock_version", "integer"],
    ["created_at", "timestamp"],
    ["updated_at", "timestamp"],
    ["finished_at", "timestamp"],
    // drop-scheduled-builds: when a delayed build was due.
    ["scheduled_at", "timestamp"],
    // A drop's transition side effects: the pipeline to process, processed as GitLab's before_save
    // sets it (true for a retried build), the resource group whose resource it frees.
    ["commit_id", "integer"],
    ["processed", "boolean"],
    ["retried", "boolean"],
    ["resource_group_id", "integer"]
  ]]
]

type RequiredColumns = ReturnType<typeof requiredColumns>

/**
 * Fails with the first missing (or wrongly typed) column of these tables on the database in
 * context, naming table and column; else the number of columns checked.
 */
export const checkColumnsOf = (required: RequiredColumns) =>
  Effect.gen(function*() {
    if (required.length === 0) return 0
    const sql = yield* SqlClient.SqlClient
    // current_schemas(false): the tables Sweeper's unqualified names resolve to (search_path).
    const rows = yield* sql<{ table_name: string; column_name: string; data_type: string }>`
      SELECT c.table_name, c.column_name, c.data_type FROM information_schema.columns c
      WHERE c.table_schema = ANY (current_schemas(false))
        AND ${sql.in("c.table_name", required.map(([table]) => table))}`
    let checked = 0
    for (const [table, columns] of required) {
      for (const [column, expected] of columns) {
        const row = rows.find((r) => r.table_name === table && r.column_name === column)
        if (row === undefined) return yield* new MissingColumn({ table, column, expected })
        const found = FAMILIES[row.data_type] ?? row.data_type
        if (found !== expected) return yield* new MissingColumn({ table, column, expected, found })
        checked++
      }
    }
    return checked
  })

/** Every column a batch uses, all on the database in context (one database; DatabaseLayout checks two). */
export const checkColumns = Effect.gen(function*() {
  const builds = yield* detectBuildsTable
  return { checked: yield* checkColumnsOf(requiredColumns(builds)), builds }
})
