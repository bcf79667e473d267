/**
 * Which of GitLab's databases a table lives in. GitLab.com, Dedicated and every self-managed
 * installation since 17.0 configure two connections, `main` and `ci`, which may point at one
 * database or two (a decomposed GitLab). Every table has a `gitlab_schema` (GitLab's
 * `db/docs/<table>.yml`): `gitlab_ci` tables are kept in the ci database, `gitlab_main` ones in main.
 * Sweeper's own tables (`sweeper_*`: events, runs, fences) live in main, except the two that must sit
 * beside a ci write in the same transaction: the ci database's lease fences and its event outbox.
 *
 * In a decomposed GitLab both databases hold the whole structure, but each table is written in one
 * only: GitLab locks writes to the other copy with a trigger named
 * `gitlab_schema_write_trigger_for_<table>`. So a database *holds* a table when the table exists
 * there and is not write-locked.
 */
export type DatabaseName = "main" | "ci"

export const DATABASE_NAMES: ReadonlyArray<DatabaseName> = ["main", "ci"]

export type GitlabSchema = "gitlab_main" | "gitlab_ci"

/** The gitlab_schema of every GitLab table Sweeper reads or writes (GitLab's db/docs). */
export const GITLAB_SCHEMAS: Readonly<Record<string, GitlabSchema>> = {
  namespaces: "gitlab_main",
  projects: "gitlab_main",
  issues: "gitlab_main",
  project_export_jobs: "gitlab_main",
  project_relation_exports: "gitlab_main",
  ci_builds: "gitlab_ci",
  p_ci_builds: "gitlab_ci",
  ci_runners: "gitlab_ci",
  ci_runner_projects: "gitlab_ci",
  ci_runner_namespaces: "gitlab_ci"
}

/** The prefix of GitLab's write-lock trigger on a table's copy in the database that does not hold it. */
export const WRITE_LOCK_TRIGGER_PREFIX = "gitlab_schema_write_trigger_for_"

/** The database a table is kept in: its gitlab_schema's; Sweeper's own and unknown tables are main's. */
export const databaseOfTable = (table: string): DatabaseName => GITLAB_SCHEMAS[table] === "gitlab_ci" ? "ci" : "main"

/**
 * The database a batch repairs: where the GitLab tables it writes live. A batch that writes only
 * Sweeper's own tables (its events) repairs Redis or objects, and its database writes are main's.
 */
export const databaseOfWrites = (
  // BatchWrites' `tables`, by shape: Batch.ts reaches Health.ts, which asks this file.
  writes: { readonly tables?: ReadonlyArray<string> | undefined } | undefined
): DatabaseName => {
  const gitlabTables = (writes?.tables ?? []).filter((table) => GITLAB_SCHEMAS[table] !== undefined)
  return gitlabTables.some((table) => databaseOfTable(table) === "ci") ? "ci" : "main"
}

/** Where each of these tables is held (exists and is not write-locked), as one database reports it. */
export interface TableHolding {
  readonly table: string
  readonly exists: boolean
  readonly writeLocked: boolean
}

export const holds = (holding: TableHolding) => holding.exists && !holding.writeLocked

/** A GitLab table a batch needs, held by neither database or by both: the configuration is refused. */
export interface LayoutProblem {
  readonly table: string
  readonly heldBy: ReadonlyArray<DatabaseName>
  /** The database its gitlab_schema says should hold it. */
  readonly expected: DatabaseName
}

/**
 * Checks that every needed table is held by exactly the database its gitlab_schema names. With
 * one database (ci = main) only `main` is given and every table must be held there.
 */
export const layoutProblems = (
  needed: ReadonlyArray<string>,
  reports: Partial<Record<DatabaseName, ReadonlyArray<TableHolding>>>
): ReadonlyArray<LayoutProblem> => {
  const decomposed = reports.ci !== undefined
  const problems: Array<LayoutProblem> = []
  for (const table of needed) {
    const heldBy = DATABASE_NAMES.filter((database) =>
      (reports[database] ?? []).some((holding) => holding.table === table && holds(holding))
    )
    const expected = decomposed ? databaseOfTable(table) : "main"
    if (heldBy.length !== 1 || heldBy[0] !== expected) problems.push({ table, heldBy, expected })
  }
  return problems
}

/** One line for a layout problem (`sweeper doctor`, start-up). */
export const describeLayoutProblem = (problem: LayoutProblem) =>
  problem.heldBy.length === 0
    ? `${problem.table} is held by no database (expected in ${problem.expected})`
    : problem.heldBy.length > 1
    ? `${problem.table} is writable in both main and ci (expected only in ${problem.expected})`
    : `${problem.table} is held by ${problem.heldBy[0]}, but GitLab keeps it in ${problem.expected}`
