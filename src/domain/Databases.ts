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
  ci_runner_namespaces: "gitlab_ci",
  ci_pipelines: "gitlab_ci",
  p_ci_pipelines: "gitlab_ci",
  ci_pending_builds: "gitlab_ci",
  ci_running_builds: "gitlab_ci",
  ci_builds_runner_session: "gitlab_ci",
  ci_resource_groups: "gitlab_ci",
  ci_resources: "gitlab_ci"
}

/** The prefix of GitLab's write-lock trigger on a table's copy in the database that does not hold it. */
export const WRITE_LOCK_TRIGGER_PREFIX = "gitlab_schema_write_trigger_for_"

/**
 * The database a table is kept in: its gitlab_schema's when ci is a database of its own
 * (`decomposed`, the default); Sweeper's own and unknown tables are main's, and with one database
 * every table is in it, named main.
 */
export const databaseOfTable = (table: string, decomposed = true): DatabaseName =>
  decomposed && GITLAB_SCHEMAS[table] === "gitlab_ci" ? "ci" : "main"

/**
 * The database a batch repairs: where the GitLab tables it writes live. A batch that writes only
 * Sweeper's own tables (its events) repairs Redis or objects, and its database writes are main's.
 */
export const databaseOfWrites = (
  // BatchWrites' `tables`, by shape: Batch.ts reaches Health.ts, which asks this file.
  writes: { readonly tables?: ReadonlyArray<string> | undefined } | undefined,
  decomposed = true
): DatabaseName => {
  const gitlabTables = (writes?.tables ?? []).filter((table) => GITLAB_SCHEMAS[table] !== undefined)
  return gitlabTables.some((table) => databaseOfTable(table, decomposed) === "ci") ? "ci" : "main"
}

/** Where each of these tables is held (exists and is not write-locked), as one database reports it. */
export interface TableHolding {
  readonly table: string
  readonly exists: boolean
  readonly writeLocked: boolean
}

export const holds = (holding: TableHolding) => holding.exists && !holding.writeLocked

/**
 * GitLab's runner tables: `build.stuck?` reads them when they exist (the stuck-builds family adapts
 * when they do not), so they need not be anywhere; but a present one must be held by ci alone.
 */
export const RUNNER_TABLES: ReadonlyArray<string> = ["ci_runners", "ci_runner_projects", "ci_runner_namespaces"]

/** A GitLab table Sweeper uses, held where it cannot work: the configuration is refused. */
export interface LayoutProblem {
  readonly table: string
  /** The databases where it exists and is writable. */
  readonly heldBy: ReadonlyArray<DatabaseName>
  /** The databases where it exists behind GitLab's write-lock trigger. */
  readonly lockedIn: ReadonlyArray<DatabaseName>
  /** The database its gitlab_schema says should hold it (main when there is one database). */
  readonly expected: DatabaseName
  /** Two databases were configured (and they are not the same one). */
  readonly decomposed: boolean
}

/**
 * Checks that every needed table is held by exactly the database its gitlab_schema names, and that
 * an optional one, when held anywhere, is held there alone. With one database (ci = main) only
 * `main` is reported, and only a write-locked copy is a problem: it means this is one database of
 * a decomposed GitLab. A missing table there is left to the column check, which names the column.
 */
export const layoutProblems = (
  needed: ReadonlyArray<string>,
  reports: Partial<Record<DatabaseName, ReadonlyArray<TableHolding>>>,
  optional: ReadonlyArray<string> = []
): ReadonlyArray<LayoutProblem> => {
  const decomposed = reports.ci !== undefined
  const problems: Array<LayoutProblem> = []
  const where = (table: string, test: (holding: TableHolding) => boolean) =>
    DATABASE_NAMES.filter((database) =>
      (reports[database] ?? []).some((holding) => holding.table === table && test(holding))
    )
  for (const table of [...needed, ...optional]) {
    const heldBy = where(table, holds)
    const lockedIn = where(table, (holding) => holding.exists && holding.writeLocked)
    const expected = databaseOfTable(table, decomposed)
    const problem = { table, heldBy, lockedIn, expected, decomposed }
    if (!decomposed) {
      if (lockedIn.length > 0) problems.push(problem)
      continue
    }
    const wellHeld = heldBy.length === 1 && heldBy[0] === expected
    const absentAndOptional = heldBy.length === 0 && optional.includes(table) && !needed.includes(table)
    if (!wellHeld && !absentAndOptional) problems.push(problem)
  }
  return problems
}

/** One line for a layout problem (`sweeper doctor`, start-up), naming the table. */
export const describeLayoutProblem = (problem: LayoutProblem): string => {
  const { expected, heldBy, lockedIn, table } = problem
  if (!problem.decomposed) {
    return `${table} is write-locked in this database: a decomposed GitLab writes it in its ${
      databaseOfTable(table)
    } database (DATABASE_URL names main's, CI_DATABASE_URL ci's)`
  }
  if (heldBy.length === 0) {
    return lockedIn.length === 0
      ? `${table} is held by no database (expected in ${expected})`
      : `${table} is held by no database: write-locked in ${lockedIn.join(" and ")} (expected writable in ${expected})`
  }
  return heldBy.length > 1
    ? `${table} is writable in both main and ci (expected only in ${expected})`
    : `${table} is held by ${heldBy[0]}, but GitLab keeps it in ${expected}`
}
