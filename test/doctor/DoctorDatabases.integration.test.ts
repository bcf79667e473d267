/**
 * `sweeper doctor` per database connection and the start-up refusal of a layout that cannot work,
 * through the real CLI on two real databases of the local server: GitLab's decomposed layout (both
 * databases hold every table, the copy a database does not keep write-locked by GitLab's trigger),
 * a table writable in both, a table in neither, one database, two embedded databases, CI_DATABASE_URL
 * naming main's own or a database that cannot be reached, and a role lacking a privilege.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Redacted, type Scope } from "effect"
import type { SqlClient } from "effect/sql"
import { randomBytes } from "node:crypto"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import type { DoctorReport } from "../../src/doctor/Doctor.ts"
import { layerServer } from "../../src/layers/postgres/Postgres.ts"
import { runCli } from "../support/cli.ts"
import { createGitLabSchema, type GitLabLayout, lockWrites } from "../support/gitlabSchema.ts"
import { adminUrl, freshDatabaseNamed } from "../support/postgres.ts"
import { freshRedisUrl } from "../support/redis.ts"

const onDatabase = <A, E>(
  url: string,
  effect: Effect.Effect<A, E, PgClient.PgClient | SqlClient.SqlClient | Scope.Scope>
) => Effect.scoped(Effect.provide(effect, layerServer(Redacted.make(url))))

const admin = PgClient.layer({ url: Redacted.make(adminUrl), maxConnections: 1 })

/** A fresh empty database `dr_<role>_<random>`, dropped when the scope closes. */
const database = (role: string) => Effect.map(freshDatabaseNamed(`dr_${role}`), ({ url }) => url)

const MAIN_TABLES = ["namespaces", "projects", "issues", "project_export_jobs", "project_relation_exports"]
const RUNNERS = ["ci_runners", "ci_runner_projects", "ci_runner_namespaces"]
/** The main tables Sweeper needs, in the order doctor lists them. */
const MAIN_HELD = ["project_export_jobs", "project_relation_exports", "namespaces", "projects"]

const CLI_TIMEOUT = 150_000
const cli = (args: ReadonlyArray<string>, env: Record<string, string>, timeout = CLI_TIMEOUT) =>
  Effect.promise(() => runCli(args, env, timeout))

const envOf = (main: string, ci: string | undefined, redis: string) => ({
  DATABASE_URL: main,
  ...(ci === undefined ? {} : { CI_DATABASE_URL: ci }),
  REDIS_URL: redis,
  SWEEPER_DATA_DIR: join(tmpdir(), "sweeper-doctor-databases-it")
})

const tableNames = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  const rows = yield* sql<{ name: string }>`SELECT table_name AS name FROM information_schema.tables
    WHERE table_schema = 'public' ORDER BY table_name`
  return rows.map((row) => row.name)
})

/** The tables Sweeper created in a database (none before it migrates). */
const sweeperTables = (url: string) =>
  Effect.map(onDatabase(url, tableNames), (names) => names.filter((name) => name.startsWith("sweeper_")))

/** `sweeper migrate`, which must succeed (Sweeper's tables go to main). */
const migrated = (env: Record<string, string>) =>
  Effect.gen(function*() {
    const result = yield* cli(["migrate"], env)
    assert.strictEqual(result.code, 0, result.stderr)
  })

/**
 * The command fails with exit 2 and exactly this line on stderr, nothing on stdout. `start` logs
 * that it is starting (a JSON line) before it checks: the refusal is its one other line.
 */
const refused = (args: ReadonlyArray<string>, env: Record<string, string>, line: string) =>
  Effect.gen(function*() {
    const result = yield* cli(args, env)
    assert.strictEqual(result.code, 2, `${args.join(" ")}: ${result.stderr}`)
    assert.strictEqual(result.stdout, "")
    const lines = result.stderr.trim().split("\n").filter((l) =>
      !(args[0] === "start" && l.includes("Sweeper starting"))
    )
    assert.deepStrictEqual(lines, [`sweeper: ${line}`], result.stderr)
  })

const doctorJson = (env: Record<string, string>) =>
  Effect.gen(function*() {
    const result = yield* cli(["doctor", "--json"], env)
    assert.strictEqual(result.code, 0, result.stderr)
    return JSON.parse(result.stdout) as DoctorReport
  })

/** Two databases laid out as GitLab lays them out (`layout` for both), each locking the other's tables. */
const decomposedGitLab = (layout: GitLabLayout) =>
  Effect.gen(function*() {
    const main = yield* database("main")
    const ci = yield* database("ci")
    const builds = layout.partitioned ? "p_ci_builds" : "ci_builds"
    yield* onDatabase(
      main,
      Effect.andThen(createGitLabSchema(layout), lockWrites([builds, ...(layout.runners === true ? RUNNERS : [])]))
    )
    yield* onDatabase(ci, Effect.andThen(createGitLabSchema(layout), lockWrites(MAIN_TABLES)))
    return { main, ci }
  })

describe("sweeper doctor per database connection; a layout that cannot work is refused", () => {
  it.live(
    "GitLab's decomposed layout: ok, each connection naming what it holds and its write-locked copies",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const { ci, main } = yield* decomposedGitLab({ partitioned: true, runners: true })
        const env = envOf(main, ci, yield* freshRedisUrl)
        yield* migrated(env)
        const report = yield* doctorJson(env)
        assert.deepStrictEqual(report.problems, [])
        assert.isTrue(report.ok)
        const { databases } = report
        assert.isTrue(databases.decomposed)
        // A drop's side tables and its job outbox are checked on ci, where the builds are.
        assert.strictEqual(report.transitions.database, "ci")
        assert.deepStrictEqual(report.transitions.tables.filter((t) => !t.held), [])
        assert.deepStrictEqual(
          databases.connections.map((c) => [c.database, c.reachable, c.role, c.holds, c.writeLocked]),
          [
            ["main", true, "postgres", MAIN_HELD, ["p_ci_builds", ...RUNNERS]],
            ["ci", true, "postgres", ["p_ci_builds", ...RUNNERS], MAIN_HELD]
          ]
        )
        assert.deepStrictEqual(databases.connections.map((c) => [c.database, c.privileges]), [
          ["main", [{ table: "project_export_jobs", select: true, update: true }]],
          ["ci", [{ table: "p_ci_builds", select: true, update: true }]]
        ])
        assert.strictEqual(databases.connections[1]!.backend, ci)
        // The builds scans are explained where builds are written: on ci.
        assert.deepStrictEqual(
          [...new Set(report.scans.map((s) => `${s.table}@${s.database}`))],
          [
            "project_export_jobs@main",
            "p_ci_builds@ci",
            "sweeper_events@main",
            "namespaces@main",
            "projects@main"
          ]
        )
        assert.isTrue(report.scans.every((s) => s.served))

        const human = yield* cli(["doctor"], env)
        assert.strictEqual(human.code, 0, human.stderr)
        const text = human.stdout
        assert.include(text, "Databases  main and ci, two databases")
        assert.include(text, `  main ${main}: reachable, as role postgres`)
        assert.include(text, `  ci   ${ci}: reachable, as role postgres`)
        assert.include(text, "    holds: p_ci_builds, ci_runners, ci_runner_projects, ci_runner_namespaces")
        assert.include(text, "    p_ci_builds: SELECT, UPDATE")
        assert.include(text, "  drop-canceling-builds: p_ci_builds (ci), ")
        assert.include(text, "  stuck-export-jobs: project_export_jobs (main), ")
        assert.include(
          text,
          "  layout: ok: every table Sweeper needs is writable in the one database GitLab keeps it in"
        )
        assert.strictEqual(text.trim().split("\n").at(-1), "OK")

        // Start-up takes it too: a batch of main's runs.
        const run = yield* cli(["run", "stuck-export-jobs"], env)
        assert.strictEqual(run.code, 0, run.stderr)
      })),
    600_000
  )

  it.live(
    "ci_builds writable in both databases: migrate, doctor, run and start refuse with one line naming it (exit 2)",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const main = yield* database("main")
        const ci = yield* database("ci")
        // GitLab's layout, but main's copy of ci_builds has no write-lock trigger.
        yield* onDatabase(main, Effect.andThen(createGitLabSchema({ partitioned: false }), lockWrites([])))
        yield* onDatabase(ci, Effect.andThen(createGitLabSchema({ partitioned: false }), lockWrites(MAIN_TABLES)))
        const env = envOf(main, ci, yield* freshRedisUrl)
        const line = "ci_builds is writable in both main and ci (expected only in ci)"
        // Refused before any DDL: migrate (alone or as start and run begin), and the read-only doctor.
        for (const args of [["migrate"], ["doctor"], ["run", "drop-canceling-builds"], ["start"]]) {
          yield* refused(args, env, line)
        }
        assert.deepStrictEqual([...(yield* sweeperTables(main)), ...(yield* sweeperTables(ci))], [])

        // A disabled trigger locks nothing: the same refusal once main's copy is "locked" that way.
        yield* onDatabase(
          main,
          Effect.andThen(
            lockWrites(["ci_builds"]),
            Effect.flatMap(PgClient.PgClient, (sql) =>
              sql.unsafe(`ALTER TABLE ci_builds DISABLE TRIGGER gitlab_schema_write_trigger_for_ci_builds`))
          )
        )
        yield* refused(["doctor"], env, line)
        yield* onDatabase(
          main,
          Effect.flatMap(PgClient.PgClient, (sql) =>
            sql.unsafe(`ALTER TABLE ci_builds ENABLE TRIGGER gitlab_schema_write_trigger_for_ci_builds`))
        )
        yield* migrated(env)
        const report = yield* doctorJson(env)
        assert.isTrue(report.ok)
        assert.strictEqual(report.postgres.buildsTable, "ci_builds")
        assert.deepStrictEqual(
          report.databases.connections.map((c) =>
            c.writeLocked
          ),
          [["ci_builds"], MAIN_HELD]
        )
      })),
    600_000
  )

  it.live(
    "CI_DATABASE_URL naming a database without ci_builds, main lacking it too: refused, one line",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const main = yield* database("main")
        const ci = yield* database("ci")
        yield* onDatabase(
          main,
          Effect.andThen(
            createGitLabSchema({ partitioned: false }),
            Effect.flatMap(PgClient.PgClient, (sql) => sql.unsafe(`DROP TABLE ci_builds`))
          )
        )
        const env = envOf(main, ci, yield* freshRedisUrl)
        const line = "ci_builds is held by no database (expected in ci)"
        // Not migrated first: an empty ci database would get Sweeper's own platform tables.
        for (const args of [["migrate"], ["migrate", "--plan"], ["doctor"], ["run", "stuck-export-jobs"]]) {
          yield* refused(args, env, line)
        }
        assert.deepStrictEqual(yield* sweeperTables(ci), [])
        assert.deepStrictEqual(yield* onDatabase(ci, tableNames), [])
      })),
    600_000
  )

  it.live(
    "one database: unchanged (one connection holding everything); a write-locked copy there is refused",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const main = yield* database("main")
        yield* onDatabase(main, createGitLabSchema({ partitioned: true, runners: true }))
        const env = envOf(main, undefined, yield* freshRedisUrl)
        yield* migrated(env)
        const report = yield* doctorJson(env)
        assert.isTrue(report.ok)
        assert.strictEqual(report.postgres.columnsChecked, 25)
        assert.isFalse(report.databases.decomposed)
        assert.deepStrictEqual(report.databases.connections.map((c) => [c.database, c.holds, c.writeLocked]), [
          ["main", [...MAIN_HELD, "p_ci_builds", ...RUNNERS], []]
        ])
        assert.deepStrictEqual(report.databases.connections[0]!.privileges.map((p) => p.table), [
          "p_ci_builds",
          "project_export_jobs"
        ])
        assert.isTrue(report.scans.every((s) => s.database === "main"))
        assert.strictEqual(report.databases.layout, "ok: one database (ci's tables are in main)")

        // This is one database of a decomposed GitLab (its ci tables locked): naming only it is refused.
        yield* onDatabase(main, lockWrites(["p_ci_builds"]))
        yield* refused(
          ["doctor"],
          env,
          "p_ci_builds is write-locked in this database: a decomposed GitLab writes it in its ci database "
            + "(DATABASE_URL names main's, CI_DATABASE_URL ci's)"
        )
      })),
    600_000
  )

  it.live(
    "two embedded databases (SWEEPER_EMBEDDED_CI_DATABASE): each platform table where GitLab keeps it, ok",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const dataDir = mkdtempSync(join(tmpdir(), "sweeper-doctor-embedded-ci-"))
        yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(dataDir, { recursive: true, force: true })))
        const report = yield* doctorJson({ SWEEPER_DATA_DIR: dataDir, SWEEPER_EMBEDDED_CI_DATABASE: "true" })
        assert.isTrue(report.ok)
        assert.deepStrictEqual(report.databases.connections.map((c) => [c.database, c.holds, c.writeLocked]), [
          ["main", MAIN_HELD, []],
          ["ci", ["ci_builds"], []]
        ])
        assert.strictEqual(
          report.databases.connections[1]!.backend,
          `embedded PGlite (${join(dataDir, "ci", "pgdata")})`
        )
      })),
    600_000
  )

  it.live(
    "CI_DATABASE_URL naming main's own database another way: one database",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const main = yield* database("main")
        yield* onDatabase(main, createGitLabSchema({ partitioned: false }))
        const sameOther = new URL(main)
        sameOther.searchParams.set("application_name", "sweeper-ci")
        const env = envOf(main, sameOther.toString(), yield* freshRedisUrl)
        yield* migrated(env)
        const report = yield* doctorJson(env)
        assert.isTrue(report.ok)
        assert.isFalse(report.databases.decomposed)
        assert.deepStrictEqual(report.databases.connections.map((c) => c.database), ["main"])
        assert.strictEqual(report.postgres.buildsTable, "ci_builds")

        // A ci database that cannot be reached: one line naming its host, never its password (exit 3).
        const absent = new URL(main)
        absent.pathname = `${absent.pathname}_absent`
        for (const unreachable of ["postgres://postgres:s3cret@127.0.0.1:1/ci", absent.toString()]) {
          const result = yield* cli(["doctor"], { ...env, CI_DATABASE_URL: unreachable })
          assert.strictEqual(result.code, 3, result.stderr)
          const lines = result.stderr.trim().split("\n")
          assert.lengthOf(lines, 1, result.stderr)
          assert.match(lines[0]!, new RegExp(`^sweeper: cannot reach PostgreSQL at ${new URL(unreachable).host}: `))
          assert.notInclude(result.stderr, "s3cret")
        }
      })),
    600_000
  )

  it.live(
    "a role without UPDATE on the builds table in ci: doctor names the privilege it lacks (exit 1)",
    () =>
      Effect.scoped(Effect.gen(function*() {
        // The role outlives both databases' scopes: dropped after them (its grants go with them).
        const role = `dr_role_${randomBytes(4).toString("hex")}`
        yield* Effect.acquireRelease(
          Effect.flatMap(PgClient.PgClient, (sql) => sql.unsafe(`CREATE ROLE ${role} LOGIN`)).pipe(
            Effect.provide(admin),
            Effect.orDie
          ),
          () =>
            Effect.flatMap(PgClient.PgClient, (sql) => sql.unsafe(`DROP ROLE IF EXISTS ${role}`)).pipe(
              Effect.provide(admin),
              Effect.orDie
            )
        )
        const { ci, main } = yield* decomposedGitLab({ partitioned: false })
        const env = envOf(main, ci, yield* freshRedisUrl)
        yield* migrated(env)
        // Everything (Sweeper's own tables included, as the role that migrated would have), except
        // UPDATE on ci's builds table.
        const grant = (url: string, revoke: ReadonlyArray<string>) =>
          onDatabase(
            url,
            Effect.flatMap(PgClient.PgClient, (sql) =>
              Effect.forEach([
                `GRANT ALL ON ALL TABLES IN SCHEMA public TO ${role}`,
                `GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO ${role}`,
                ...revoke
              ], (statement) => sql.unsafe(statement)))
          )
        yield* grant(main, [])
        yield* grant(ci, [`REVOKE UPDATE ON ci_builds FROM ${role}`])
        const as = (url: string) => {
          const withRole = new URL(url)
          withRole.username = role
          return withRole.toString()
        }
        const result = yield* cli(["doctor", "--json"], { ...env, DATABASE_URL: as(main), CI_DATABASE_URL: as(ci) })
        assert.strictEqual(result.code, 1, result.stderr)
        const report = JSON.parse(result.stdout) as DoctorReport
        assert.deepStrictEqual(report.databases.connections.map((c) => [c.database, c.role, c.privileges]), [
          ["main", role, [{ table: "project_export_jobs", select: true, update: true }]],
          ["ci", role, [{ table: "ci_builds", select: true, update: false }]]
        ])
        assert.deepStrictEqual(report.problems, [`role ${role} on ci lacks UPDATE on ci_builds`])
      })),
    600_000
  )

  it.live(
    "every connection carries the configured session timeouts; one that is off is a problem",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const { ci, main } = yield* decomposedGitLab({ partitioned: true, runners: true })
        const env = {
          ...envOf(main, ci, yield* freshRedisUrl),
          SWEEPER_PG_STATEMENT_TIMEOUT: "45 seconds",
          SWEEPER_PG_LOCK_TIMEOUT: "7 seconds",
          SWEEPER_PG_IDLE_IN_TRANSACTION_TIMEOUT: "50 seconds"
        }
        yield* migrated(env)
        const report = yield* doctorJson(env)
        const timeouts = { statement: "45s", lock: "7s", idleInTransaction: "50s" }
        assert.deepStrictEqual(report.databases.connections.map((c) => [c.database, c.timeouts]), [
          ["main", timeouts],
          ["ci", timeouts]
        ])
        const human = yield* cli(["doctor"], env)
        assert.include(human.stdout, "    timeouts: statement 45s, lock 7s, idle in transaction 50s")

        // Nothing sent and nothing set on the server or the role: off, which doctor calls a problem.
        const off = yield* cli(["doctor", "--json"], { ...env, SWEEPER_PG_LOCK_TIMEOUT: "0 seconds" })
        assert.strictEqual(off.code, 1, off.stderr)
        const offReport = JSON.parse(off.stdout) as DoctorReport
        assert.deepStrictEqual(offReport.problems, [
          "lock_timeout is off on main: set SWEEPER_PG_LOCK_TIMEOUT, or set it on role postgres",
          "lock_timeout is off on ci: set SWEEPER_PG_LOCK_TIMEOUT, or set it on role postgres"
        ])
      })),
    600_000
  )
})
