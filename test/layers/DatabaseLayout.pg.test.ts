/**
 * Which tables each connection holds, asked of real PostgreSQL (two databases of the local server
 * laid out as a decomposed GitLab lays them out), and the start-up check: a table held where it
 * cannot work is refused naming it, and columns are checked on the database that holds each table,
 * not on the write-locked copy beside it.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Layer, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import { checkLayout, tableHoldings, UnusableLayout } from "../../src/layers/postgres/DatabaseLayout.ts"
import { CiDatabase } from "../../src/layers/postgres/Databases.ts"
import { MissingColumn } from "../../src/layers/postgres/DatabaseSchema.ts"
import { layerServer } from "../../src/layers/postgres/Postgres.ts"
import { createGitLabSchema, lockWrites } from "../support/gitlabSchema.ts"
import { freshDatabaseNamed } from "../support/postgres.ts"

const MAIN_TABLES = ["namespaces", "projects", "issues", "project_export_jobs", "project_relation_exports"]
const RUNNERS = ["ci_runners", "ci_runner_projects", "ci_runner_namespaces"]

/** A client on a fresh database of its own (closed, and the database dropped, with the scope). */
const freshClient = (prefix: string) =>
  Effect.gen(function*() {
    const { url } = yield* freshDatabaseNamed(prefix)
    return Context.get(yield* Layer.build(layerServer(Redacted.make(url))), PgClient.PgClient)
  })

const on = <A, E>(client: PgClient.PgClient, effect: Effect.Effect<A, E, PgClient.PgClient | SqlClient.SqlClient>) =>
  effect.pipe(Effect.provideService(PgClient.PgClient, client), Effect.provideService(SqlClient.SqlClient, client))

/** GitLab's decomposed layout: both hold every table, each locking the copies it does not own. */
const decomposedGitLab = Effect.gen(function*() {
  const main = yield* freshClient("dr_lmain")
  const ci = yield* freshClient("dr_lci")
  yield* on(
    main,
    Effect.andThen(createGitLabSchema({ partitioned: true, runners: true }), lockWrites(["p_ci_builds", ...RUNNERS]))
  )
  yield* on(ci, Effect.andThen(createGitLabSchema({ partitioned: true, runners: true }), lockWrites(MAIN_TABLES)))
  return { main, ci }
})

/** checkLayout with main's client as PgClient and ci's as CiDatabase. */
const checkBoth = (main: PgClient.PgClient, ci: PgClient.PgClient) =>
  checkLayout.pipe(Effect.provideService(CiDatabase, CiDatabase.of({ sql: ci, decomposed: true })), (e) => on(main, e))

describe("Database layout: which connection holds which table", () => {
  it.live("tableHoldings: present on the search path, and locked only by GitLab's enabled trigger", () =>
    Effect.scoped(Effect.gen(function*() {
      const { main } = yield* decomposedGitLab
      const tables = ["projects", "p_ci_builds", "ci_runners", "ci_job_artifacts"]
      assert.deepStrictEqual(yield* on(main, tableHoldings(tables)), [
        { table: "projects", exists: true, writeLocked: false },
        { table: "p_ci_builds", exists: true, writeLocked: true },
        { table: "ci_runners", exists: true, writeLocked: true },
        { table: "ci_job_artifacts", exists: false, writeLocked: false }
      ])
      yield* on(
        main,
        Effect.flatMap(PgClient.PgClient, (sql) =>
          Effect.all([
            sql.unsafe(`ALTER TABLE ci_runners DISABLE TRIGGER gitlab_schema_write_trigger_for_ci_runners`),
            // Another trigger by another name locks nothing GitLab knows of.
            sql.unsafe(`CREATE TRIGGER some_audit BEFORE UPDATE ON projects
              FOR EACH STATEMENT EXECUTE FUNCTION gitlab_schema_prevent_write()`)
          ]))
      )
      assert.deepStrictEqual(
        (yield* on(main, tableHoldings(tables))).map((h) => [h.table, h.writeLocked]),
        [["projects", false], ["p_ci_builds", true], ["ci_runners", false], ["ci_job_artifacts", false]]
      )
    })))

  it.live("columns are checked on the database holding each table, not on the write-locked copy", () =>
    Effect.scoped(Effect.gen(function*() {
      const { ci, main } = yield* decomposedGitLab
      const ok = yield* checkBoth(main, ci)
      assert.strictEqual(ok.checked, 25)
      assert.strictEqual(ok.builds.name, "p_ci_builds")
      assert.deepStrictEqual(ok.survey.problems, [])

      // main's locked copy of builds may lag behind (GitLab migrates both, but it is never read).
      yield* on(
        main,
        Effect.flatMap(PgClient.PgClient, (sql) => sql.unsafe(`ALTER TABLE p_ci_builds DROP COLUMN failure_reason`))
      )
      assert.strictEqual((yield* checkBoth(main, ci)).checked, 25)
      // ci's copy is the one the batches write.
      yield* on(
        ci,
        Effect.flatMap(PgClient.PgClient, (sql) => sql.unsafe(`ALTER TABLE p_ci_builds DROP COLUMN failure_reason`))
      )
      const missing = yield* Effect.flip(checkBoth(main, ci))
      assert.instanceOf(missing, MissingColumn)
      assert.strictEqual(missing.message, "column p_ci_builds.failure_reason is missing (a batch needs it as integer)")
    })))

  it.live("a table writable in both is refused naming it, before any column is checked", () =>
    Effect.scoped(Effect.gen(function*() {
      const { ci, main } = yield* decomposedGitLab
      yield* on(
        ci,
        Effect.flatMap(
          PgClient.PgClient,
          (sql) => sql.unsafe(`DROP TRIGGER gitlab_schema_write_trigger_for_project_export_jobs ON project_export_jobs`)
        )
      )
      const refused = yield* Effect.flip(checkBoth(main, ci))
      assert.instanceOf(refused, UnusableLayout)
      assert.strictEqual(refused.message, "project_export_jobs is writable in both main and ci (expected only in main)")
    })))
})
