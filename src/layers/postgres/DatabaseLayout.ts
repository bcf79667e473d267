/**
 * Where GitLab's tables are, as each configured connection sees them, and the start-up check that
 * refuses a layout Sweeper cannot work on: a table a batch needs held by neither database, by both,
 * or by the wrong one (domain/Databases.ts decides; this file asks PostgreSQL). Also where each
 * table's columns are checked: on the database that holds it, so a ci table is checked on ci.
 */
import { PgClient } from "@effect/sql-pg"
import * as Effect from "effect/Effect"
import * as Schema from "effect/Schema"
import * as SqlClient from "effect/sql/SqlClient"
import {
  DATABASE_NAMES,
  type DatabaseName,
  databaseOfTable,
  describeLayoutProblem,
  type LayoutProblem,
  layoutProblems,
  RUNNER_TABLES,
  type TableHolding,
  WRITE_LOCK_TRIGGER_PREFIX
} from "../../domain/Databases.ts"
import { CiDatabase, onClient } from "./Databases.ts"
import { type BuildsTable, checkColumnsOf, detectBuildsTable, requiredColumns } from "./DatabaseSchema.ts"

export class UnusableLayout extends Schema.TaggedError<UnusableLayout>()("UnusableLayout", {
  table: Schema.String,
  heldBy: Schema.Array(Schema.Literals(["main", "ci"])),
  lockedIn: Schema.Array(Schema.Literals(["main", "ci"])),
  expected: Schema.Literals(["main", "ci"]),
  decomposed: Schema.Boolean
}) {
  override get message() {
    return describeLayoutProblem(this)
  }
}

/** The table names as one text parameter: the same statement on PostgreSQL and PGlite. */
const names = (tables: ReadonlyArray<string>) => tables.join(",")

/**
 * Per table, on the connection in context: whether Sweeper's unqualified name resolves to it
 * (search_path) and whether GitLab's write-lock trigger on it is enabled (any tgenabled but 'D').
 */
export const tableHoldings = (tables: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql<{ name: string; present: boolean; locked: boolean }>`
      SELECT t.name, to_regclass(t.name) IS NOT NULL AS present,
        EXISTS (SELECT FROM pg_trigger g WHERE g.tgrelid = to_regclass(t.name)
          AND g.tgname = ${WRITE_LOCK_TRIGGER_PREFIX} || t.name AND g.tgenabled <> 'D') AS locked
      FROM unnest(string_to_array(${names(tables)}, ',')) AS t(name)`
    return rows.map((row): TableHolding => ({ table: row.name, exists: row.present, writeLocked: row.locked }))
  })

export interface TablePrivilege {
  readonly table: string
  readonly select: boolean
  readonly update: boolean
}

/** What this connection's role may do on each of these tables that exists here. */
export const tablePrivileges = (tables: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    return yield* sql<TablePrivilege>`
      SELECT t.name AS "table", has_table_privilege(to_regclass(t.name), 'SELECT') AS "select",
        has_table_privilege(to_regclass(t.name), 'UPDATE') AS "update"
      FROM unnest(string_to_array(${names(tables)}, ',')) AS t(name) WHERE to_regclass(t.name) IS NOT NULL`
  })

/** Every connection's view of the tables Sweeper uses, and the verdict on it. */
export interface LayoutSurvey {
  readonly decomposed: boolean
  readonly builds: BuildsTable
  readonly holdings: Partial<Record<DatabaseName, ReadonlyArray<TableHolding>>>
  readonly problems: ReadonlyArray<LayoutProblem>
}

/** The client of each configured connection: main's, and ci's when it is a database of its own. */
const connections = Effect.gen(function*() {
  const main = yield* PgClient.PgClient
  const ci = yield* CiDatabase
  const clients: { readonly main: PgClient.PgClient; readonly ci?: PgClient.PgClient } = ci.decomposed
    ? { main, ci: ci.sql }
    : { main }
  return clients
})

/**
 * Asks every connection which of the needed and runner tables it holds. Builds are p_ci_builds
 * when the database that keeps ci's tables has it (ci when decomposed), else ci_builds.
 */
export const surveyLayout = Effect.gen(function*() {
  const clients = yield* connections
  const builds = yield* onClient(clients.ci ?? clients.main)(detectBuildsTable)
  const needed = requiredColumns(builds).map(([table]) => table)
  const tables = [...needed, ...RUNNER_TABLES]
  const holdings: Partial<Record<DatabaseName, ReadonlyArray<TableHolding>>> = {
    main: yield* onClient(clients.main)(tableHoldings(tables)),
    ...(clients.ci === undefined ? {} : { ci: yield* onClient(clients.ci)(tableHoldings(tables)) })
  }
  const problems = layoutProblems(needed, holdings, RUNNER_TABLES)
  return { decomposed: clients.ci !== undefined, builds, holdings, problems } satisfies LayoutSurvey
})

/** The layout, refused with its first problem in one line. */
export const refuseUnusableLayout = Effect.gen(function*() {
  const survey = yield* surveyLayout
  const problem = survey.problems[0]
  if (problem !== undefined) return yield* new UnusableLayout(problem)
  return survey
})

/**
 * The start-up check (and doctor's): refuses the layout with its first problem in one line, then
 * checks every column a batch uses on the database holding its table. One database: exactly the
 * column check it always was (a write-locked copy aside).
 */
export const checkLayout = Effect.gen(function*() {
  const survey = yield* refuseUnusableLayout
  const clients = yield* connections
  const required = requiredColumns(survey.builds)
  let checked = 0
  for (const database of DATABASE_NAMES) {
    const client = clients[database]
    if (client === undefined) continue
    const own = required.filter(([table]) => databaseOfTable(table, survey.decomposed) === database)
    checked += yield* onClient(client)(checkColumnsOf(own))
  }
  return { checked, builds: survey.builds, survey }
})
