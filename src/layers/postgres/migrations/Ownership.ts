/**
 * What the standalone migrations share: the platform tables Sweeper may create, the record of those it
 * did create, and the rule that creates one only where it is absent and belongs.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as SqlClient from "effect/sql/SqlClient"
import { type DatabaseName, databaseOfTable } from "../../../domain/Databases.ts"
import { OWNERSHIP_TABLE } from "../DatabaseSchema.ts"

export const PLATFORM_TABLES = [
  "namespaces",
  "projects",
  "issues",
  "project_export_jobs",
  "project_relation_exports",
  "ci_builds"
] as const

export const createOwnershipTable = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE TABLE IF NOT EXISTS ${sql(OWNERSHIP_TABLE)} (
    table_name text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
  )`
})

/**
 * Which platform tables a standalone database gets: all of them when ci and main are one database;
 * in a decomposed layout each database only those GitLab keeps there (its gitlab_schema's), so
 * exactly one database holds each table, as in a decomposed GitLab.
 */
export const PlatformTablesOf = Context.Reference<"all" | DatabaseName>("sweeper/layers/postgres/PlatformTablesOf", {
  defaultValue: () => "all"
})

/**
 * Creates `table` with `create` and then its `indexes`, only when the table does not exist yet and
 * belongs in this database, and records that Sweeper created it. An existing table (someone
 * else's) is left exactly as it is.
 */
export const ownTable = (
  table: string,
  create: Effect.Effect<unknown, unknown, SqlClient.SqlClient>,
  indexes: ReadonlyArray<Effect.Effect<unknown, unknown, SqlClient.SqlClient>> = []
) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const here = yield* PlatformTablesOf
    if (here !== "all" && databaseOfTable(table) !== here) return
    const found = yield* sql<{ found: boolean }>`SELECT to_regclass(${table}) IS NOT NULL AS found`
    if (found[0]?.found === true) return
    yield* create
    for (const index of indexes) yield* index
    yield* sql`INSERT INTO ${sql(OWNERSHIP_TABLE)} (table_name) VALUES (${table}) ON CONFLICT DO NOTHING`
  })
