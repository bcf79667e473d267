import { assert, describe, it } from "@effect/vitest"
import {
  databaseOfTable,
  databaseOfWrites,
  describeLayoutProblem,
  layoutProblems,
  RUNNER_TABLES,
  type TableHolding
} from "../../src/domain/Databases.ts"

const NEEDED = ["p_ci_builds", "project_export_jobs", "project_relation_exports", "projects", "namespaces"]
const CI = new Set(["p_ci_builds", ...RUNNER_TABLES])

/** A copy of every table, GitLab's trigger on those the database does not keep (a decomposed GitLab). */
const gitlabCopies = (database: "main" | "ci", tables = [...NEEDED, ...RUNNER_TABLES]): Array<TableHolding> =>
  tables.map((table) => ({ table, exists: true, writeLocked: CI.has(table) !== (database === "ci") }))

const set = (holdings: Array<TableHolding>, table: string, change: Partial<TableHolding>) =>
  holdings.map((holding) => holding.table === table ? { ...holding, ...change } : holding)

const lines = (...args: Parameters<typeof layoutProblems>) => layoutProblems(...args).map(describeLayoutProblem)

describe("Databases: which database holds which table", () => {
  it("gitlab_schema decides: ci tables in ci, the rest (and Sweeper's own) in main", () => {
    assert.deepStrictEqual(
      ["ci_builds", "p_ci_builds", "ci_runners", "projects", "sweeper_events"].map((table) => databaseOfTable(table)),
      ["ci", "ci", "ci", "main", "main"]
    )
    // With one database (ci = main) every table is in it, named main.
    assert.strictEqual(databaseOfTable("ci_builds", false), "main")
    assert.strictEqual(databaseOfWrites({ tables: ["ci_builds", "p_ci_builds", "sweeper_events"] }), "ci")
    assert.strictEqual(databaseOfWrites({ tables: ["project_export_jobs", "sweeper_events"] }), "main")
  })

  it("GitLab's decomposed layout (both hold every table, the other copy write-locked) has no problem", () => {
    assert.deepStrictEqual(
      layoutProblems(NEEDED, { main: gitlabCopies("main"), ci: gitlabCopies("ci") }, RUNNER_TABLES),
      []
    )
    // Only the tables each database keeps, no copies: as good.
    const own = (database: "main" | "ci") =>
      gitlabCopies(database).map((holding) => ({ ...holding, exists: !holding.writeLocked, writeLocked: false }))
    assert.deepStrictEqual(layoutProblems(NEEDED, { main: own("main"), ci: own("ci") }, RUNNER_TABLES), [])
  })

  it("a table writable in both, in neither, or only in the wrong one is refused, one line naming it", () => {
    const main = gitlabCopies("main")
    const ci = gitlabCopies("ci")
    assert.deepStrictEqual(lines(NEEDED, { main: set(main, "p_ci_builds", { writeLocked: false }), ci }), [
      "p_ci_builds is writable in both main and ci (expected only in ci)"
    ])
    assert.deepStrictEqual(
      lines(NEEDED, {
        main: set(main, "p_ci_builds", { exists: false }),
        ci: set(ci, "p_ci_builds", { exists: false })
      }),
      ["p_ci_builds is held by no database (expected in ci)"]
    )
    assert.deepStrictEqual(lines(NEEDED, { main, ci: set(ci, "p_ci_builds", { writeLocked: true }) }), [
      "p_ci_builds is held by no database: write-locked in main and ci (expected writable in ci)"
    ])
    assert.deepStrictEqual(
      lines(NEEDED, {
        main: set(main, "projects", { writeLocked: true }),
        ci: set(ci, "projects", { writeLocked: false })
      }),
      ["projects is held by ci, but GitLab keeps it in main"]
    )
  })

  it("runner tables may be absent anywhere, but a present one is held by ci alone", () => {
    const main = gitlabCopies("main", NEEDED)
    const ci = gitlabCopies("ci", NEEDED)
    assert.deepStrictEqual(lines(NEEDED, { main, ci }, RUNNER_TABLES), [])
    const runnersIn = (database: "main" | "ci"): Array<TableHolding> =>
      RUNNER_TABLES.map((table) => ({ table, exists: true, writeLocked: database === "main" }))
    assert.deepStrictEqual(
      lines(NEEDED, { main: [...main, ...runnersIn("ci")], ci: [...ci, ...runnersIn("ci")] }, RUNNER_TABLES),
      RUNNER_TABLES.map((table) => `${table} is writable in both main and ci (expected only in ci)`)
    )
    assert.deepStrictEqual(
      lines(NEEDED, { main: [...main, { table: "ci_runners", exists: true, writeLocked: false }], ci }, RUNNER_TABLES),
      ["ci_runners is held by main, but GitLab keeps it in ci"]
    )
  })

  it("one database: only a write-locked copy is a problem (a missing table is the column check's to name)", () => {
    const all = NEEDED.map((table) => ({ table, exists: true, writeLocked: false }))
    assert.deepStrictEqual(layoutProblems(NEEDED, { main: all }, RUNNER_TABLES), [])
    assert.deepStrictEqual(layoutProblems(NEEDED, { main: set(all, "projects", { exists: false }) }), [])
    assert.deepStrictEqual(lines(NEEDED, { main: gitlabCopies("main") }, RUNNER_TABLES), [
      "p_ci_builds is write-locked in this database: a decomposed GitLab writes it in its ci database "
      + "(DATABASE_URL names main's, CI_DATABASE_URL ci's)",
      ...RUNNER_TABLES.map((table) =>
        `${table} is write-locked in this database: a decomposed GitLab writes it in its ci database `
        + "(DATABASE_URL names main's, CI_DATABASE_URL ci's)"
      )
    ])
  })
})
