/**
 * `sweeper doctor`'s view of each database connection: main, and ci when it is a database of its
 * own. Per connection: where it points (password redacted), the role it connects as and what that
 * role may do on the GitLab tables its batches write, which of GitLab's tables it holds and which
 * it has only write-locked copies of, and the session timeouts its sessions carry; then the layout
 * verdict. A layout that cannot work never gets here: the start-up check
 * (DatabaseLayout.checkLayout) refuses it in one line first.
 */
import type { PgClient } from "@effect/sql-pg"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import type { SweeperSettings } from "../config/Config.ts"
import { type DatabaseName, databaseOfTable, GITLAB_SCHEMAS, holds } from "../domain/Databases.ts"
import { type LayoutSurvey, type TablePrivilege, tablePrivileges } from "../layers/postgres/DatabaseLayout.ts"
import { onClient } from "../layers/postgres/Databases.ts"
import { batches } from "../programs/index.ts"
import { describeCiDatabase, describeMainDatabase } from "../supervisor/App.ts"

export interface ConnectionReport {
  readonly database: DatabaseName
  /** Its URL with the password redacted (or the embedded database's directory). */
  readonly backend: string
  /** Always true in a printed report: an unreachable database stops doctor with one line (exit 3). */
  readonly reachable: boolean
  readonly role: string
  /** The GitLab tables it holds: present and writable. */
  readonly holds: ReadonlyArray<string>
  /** The GitLab tables it has only a copy of, write-locked by GitLab's trigger. */
  readonly writeLocked: ReadonlyArray<string>
  /** SELECT and UPDATE on each GitLab table its batches write. */
  readonly privileges: ReadonlyArray<TablePrivilege>
  /**
   * The session timeouts in force on Sweeper's connections, as PostgreSQL shows them (`0` = off);
   * absent on the embedded database, which is Sweeper's own.
   */
  readonly timeouts?: SessionTimeouts
}

export interface SessionTimeouts {
  readonly statement: string
  readonly lock: string
  readonly idleInTransaction: string
}

/** Each timeout's PostgreSQL setting and the variable that sets it. */
const TIMEOUT_SETTINGS = [
  ["statement", "statement_timeout", "SWEEPER_PG_STATEMENT_TIMEOUT"],
  ["lock", "lock_timeout", "SWEEPER_PG_LOCK_TIMEOUT"],
  ["idleInTransaction", "idle_in_transaction_session_timeout", "SWEEPER_PG_IDLE_IN_TRANSACTION_TIMEOUT"]
] as const

const sessionTimeouts = (client: PgClient.PgClient) =>
  Effect.map(
    client<SessionTimeouts>`SELECT current_setting('statement_timeout') AS statement,
      current_setting('lock_timeout') AS lock,
      current_setting('idle_in_transaction_session_timeout') AS "idleInTransaction"`,
    (rows) => rows[0]!
  )

export interface DatabasesReport {
  /** Two databases (CI_DATABASE_URL or the embedded ci database, not naming main's own). */
  readonly decomposed: boolean
  readonly connections: ReadonlyArray<ConnectionReport>
  /** Every table a batch needs held by the one database that keeps it: checked at start-up. */
  readonly layout: string
}

/** The GitLab tables the registered batches write, builds named as this database has them. */
const writtenTables = (builds: string) => {
  const written = batches.flatMap((batch) => batch.writes?.tables ?? [])
  // A build batch lists both names; it writes the one this GitLab has.
  const gitlab = written.filter((table) => GITLAB_SCHEMAS[table] !== undefined)
    .map((table) => table === "ci_builds" || table === "p_ci_builds" ? builds : table)
  return [...new Set(gitlab)]
}

const connectionReport = (
  database: DatabaseName,
  backend: string,
  client: PgClient.PgClient,
  survey: LayoutSurvey,
  server: boolean
) =>
  Effect.gen(function*() {
    const holdings = survey.holdings[database] ?? []
    const mine = writtenTables(survey.builds.name).filter((table) =>
      databaseOfTable(table, survey.decomposed) === database
    )
    const rows = yield* client<{ role: string }>`SELECT current_user AS role`
    const privileges = yield* onClient(client)(tablePrivileges(mine))
    const timeouts = server ? { timeouts: yield* sessionTimeouts(client) } : {}
    return {
      database,
      backend,
      reachable: true,
      role: rows[0]?.role ?? "?",
      holds: holdings.filter(holds).map((holding) => holding.table),
      writeLocked: holdings.filter((holding) => holding.exists && holding.writeLocked).map((holding) => holding.table),
      privileges,
      ...timeouts
    } satisfies ConnectionReport
  })

export const gatherDatabases = (
  settings: SweeperSettings,
  clients: { readonly main: PgClient.PgClient; readonly ci: PgClient.PgClient },
  survey: LayoutSurvey
) =>
  Effect.gen(function*() {
    const server = Option.isSome(settings.databaseUrl)
    const connections = [yield* connectionReport("main", describeMainDatabase(settings), clients.main, survey, server)]
    const ciBackend = describeCiDatabase(settings)
    if (survey.decomposed && Option.isSome(ciBackend)) {
      connections.push(yield* connectionReport("ci", ciBackend.value, clients.ci, survey, server))
    }
    const layout = survey.decomposed
      ? "ok: every table Sweeper needs is writable in the one database GitLab keeps it in"
      : "ok: one database (ci's tables are in main)"
    return { decomposed: survey.decomposed, connections, layout } satisfies DatabasesReport
  })

/** What a connection's role lacks on the tables its batches write: doctor problems. */
export const privilegeProblems = (report: DatabasesReport): ReadonlyArray<string> =>
  report.connections.flatMap((connection) =>
    connection.privileges.flatMap((privilege) => {
      const lacking = [...(privilege.select ? [] : ["SELECT"]), ...(privilege.update ? [] : ["UPDATE"])]
      return lacking.length === 0
        ? []
        : [`role ${connection.role} on ${connection.database} lacks ${lacking.join(" and ")} on ${privilege.table}`]
    })
  )

/**
 * A timeout that is off on a GitLab database: a statement of Sweeper's could then run, wait for a
 * lock, or hold a transaction open (and vacuum back) without end. Doctor problems.
 */
export const timeoutProblems = (report: DatabasesReport): ReadonlyArray<string> =>
  report.connections.flatMap((connection) =>
    TIMEOUT_SETTINGS.flatMap(([field, setting, variable]) => {
      const value = connection.timeouts?.[field]
      return value === "0"
        ? [`${setting} is off on ${connection.database}: set ${variable}, or set it on role ${connection.role}`]
        : []
    })
  )

const list = (tables: ReadonlyArray<string>) => tables.length === 0 ? "none" : tables.join(", ")

export const renderDatabases = (report: DatabasesReport): ReadonlyArray<string> => [
  `Databases  ${report.decomposed ? "main and ci, two databases" : "one database for main and ci"}`,
  ...report.connections.flatMap((connection) => [
    `  ${connection.database.padEnd(5)}${connection.backend}: ${
      connection.reachable ? "reachable" : "UNREACHABLE"
    }, as role ${connection.role}`,
    `    holds: ${list(connection.holds)}`,
    ...(connection.writeLocked.length === 0 ? [] : [`    write-locked copies: ${list(connection.writeLocked)}`]),
    ...connection.privileges.map((privilege) =>
      `    ${privilege.table}: ${privilege.select ? "SELECT" : "no SELECT"}, ${
        privilege.update ? "UPDATE" : "no UPDATE"
      }`
    ),
    ...(connection.timeouts === undefined ? [] : [
      `    timeouts: statement ${connection.timeouts.statement}, lock ${connection.timeouts.lock}, ` +
      `idle in transaction ${connection.timeouts.idleInTransaction}`
    ])
  ]),
  `  layout: ${report.layout}`
]
