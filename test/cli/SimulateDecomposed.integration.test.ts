/**
 * `sweeper simulate` on a decomposed GitLab: DATABASE_URL and CI_DATABASE_URL name two databases on
 * the test server. The simulator puts every build in ci and none in main (exports, projects stay in
 * main); one run each of drop-canceling-builds and stuck-export-jobs then fails the stuck builds in
 * ci and the dead exports in main, and both repairs' events land in main's event log. A real
 * GitLab's ci database is refused as its main database is.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, layer } from "@effect/vitest"
import { Effect, Redacted } from "effect"
import { randomBytes } from "node:crypto"
import { ExportJobStatus } from "../../src/domain/ExportJob.ts"
import { layerServer } from "../../src/layers/postgres/Postgres.ts"
import { runCli } from "../support/cli.ts"
import { createGitLabSchema } from "../support/gitlabSchema.ts"
import { adminUrl, databaseUrl } from "../support/postgres.ts"
import { RedisTest, TestRedisUrl } from "../support/redis.ts"

const admin = PgClient.layer({ url: Redacted.make(adminUrl), maxConnections: 1 })

/** Two fresh, empty databases (main and ci) on the test server, dropped when the scope closes. */
const freshPair = Effect.acquireRelease(
  Effect.gen(function*() {
    const prefix = `sim_${randomBytes(5).toString("hex")}`
    const sql = yield* PgClient.PgClient
    yield* sql.unsafe(`CREATE DATABASE ${prefix}_main`)
    yield* sql.unsafe(`CREATE DATABASE ${prefix}_ci`)
    return { prefix, main: databaseUrl(`${prefix}_main`), ci: databaseUrl(`${prefix}_ci`) }
  }).pipe(Effect.provide(admin)),
  ({ prefix }) =>
    Effect.gen(function*() {
      const sql = yield* PgClient.PgClient
      yield* sql.unsafe(`DROP DATABASE IF EXISTS ${prefix}_main WITH (FORCE)`)
      yield* sql.unsafe(`DROP DATABASE IF EXISTS ${prefix}_ci WITH (FORCE)`)
    }).pipe(Effect.provide(admin), Effect.orDie)
).pipe(Effect.orDie)

/** A query on one database of the pair (its own short-lived client). */
const on = <A, E>(url: string, query: (sql: PgClient.PgClient) => Effect.Effect<A, E>) =>
  Effect.scoped(Effect.flatMap(PgClient.PgClient, query).pipe(Effect.provide(layerServer(Redacted.make(url)))))

/** Build rows in a database by status; none when it has no builds table at all. */
const buildsByStatus = (url: string) =>
  on(url, (sql) =>
    Effect.gen(function*() {
      const [found] = yield* sql<{ table: string | null }>`SELECT to_regclass('ci_builds')::text AS table`
      if (found?.table === null || found?.table === undefined) return {}
      const rows = yield* sql<{ status: string; n: string }>`SELECT status, count(*) AS n FROM ci_builds GROUP BY 1`
      return Object.fromEntries(rows.map((row) => [row.status, Number(row.n)]))
    }))

const total = (counts: Record<string, number>) => Object.values(counts).reduce((a, b) => a + b, 0)

layer(RedisTest, { excludeTestServices: true })("sweeper simulate on a decomposed GitLab (main + ci)", (it) => {
  it.effect(
    "builds go to ci and none to main; one run each fails them in ci and the exports in main, events in main",
    () =>
      Effect.gen(function*() {
        const pair = yield* freshPair
        const env = { DATABASE_URL: pair.main, CI_DATABASE_URL: pair.ci, REDIS_URL: yield* TestRedisUrl }

        const simulated = yield* Effect.promise(() =>
          runCli(["simulate", "--scenario", "builds,exports", "--rate", "2", "--duration", "2s"], env, 120_000)
        )
        assert.strictEqual(simulated.code, 0, simulated.stderr)
        const made = JSON.parse(simulated.stdout.trim().split("\n").at(-1)!) as Record<string, number>
        assert.isAtLeast(made.ticks!, 1)
        assert.isAtLeast(made.stuckExports!, 1)
        // Per tick: `rate` stuck canceling builds, one pending for two days, one running stale, one delayed.
        assert.strictEqual(made.stuckBuilds, 5 * made.ticks!, simulated.stderr.slice(-4000))

        // Every build the simulator made is in ci; main holds none.
        const ciBefore = yield* buildsByStatus(pair.ci)
        assert.strictEqual(total(ciBefore), made.stuckBuilds! + made.healthyBuilds!, JSON.stringify(ciBefore))
        assert.strictEqual(total(yield* buildsByStatus(pair.main)), 0, "no build in main")
        // Per tick `rate` builds stuck in canceling for two hours (and `rate / 2` canceling for ten minutes).
        const stuckCanceling = 2 * made.ticks!
        const exportsBefore = yield* on(
          pair.main,
          (sql) => sql<{ n: string }>`SELECT count(*) AS n FROM project_export_jobs`
        )
        assert.strictEqual(Number(exportsBefore[0]!.n), made.stuckExports! + made.healthyExports!)

        for (const batch of ["drop-canceling-builds", "stuck-export-jobs"]) {
          const run = yield* Effect.promise(() => runCli(["run", batch, "--json"], env, 120_000))
          assert.strictEqual(run.code, 0, `${batch}: ${run.stdout}\n${run.stderr}`)
        }

        // The stuck canceling builds are failed in ci; the recent ones still cancel; main still has none.
        const ciAfter = yield* buildsByStatus(pair.ci)
        assert.strictEqual(ciAfter.failed, stuckCanceling, JSON.stringify(ciAfter))
        assert.strictEqual(ciAfter.canceling, (ciBefore.canceling ?? 0) - stuckCanceling, JSON.stringify(ciAfter))
        assert.strictEqual(total(yield* buildsByStatus(pair.main)), 0, "no build in main after the runs")

        // The dead exports are failed in main.
        const [exports] = yield* on(
          pair.main,
          (sql) =>
            sql<{ failed: string }>`SELECT count(*) FILTER (WHERE status = ${ExportJobStatus.failed}) AS failed
              FROM project_export_jobs`
        )
        assert.strictEqual(Number(exports!.failed), made.stuckExports)

        // Both repairs' events are in main's event log.
        const events = yield* on(
          pair.main,
          (sql) =>
            sql<{ type: string; n: string }>`SELECT type, count(*) AS n FROM sweeper_events
              WHERE type IN ('BuildDropped', 'ExportJobFailed') GROUP BY 1`
        )
        const byType = Object.fromEntries(events.map((row) => [row.type, Number(row.n)]))
        assert.strictEqual(byType.BuildDropped, stuckCanceling, JSON.stringify(byType))
        assert.strictEqual(byType.ExportJobFailed, made.stuckExports, JSON.stringify(byType))
      }).pipe(Effect.scoped),
    300_000
  )

  it.effect(
    "refuses a real GitLab's ci database (CI_DATABASE_URL) before writing anything in either",
    () =>
      Effect.gen(function*() {
        const pair = yield* freshPair
        yield* on(pair.ci, (sql) =>
          createGitLabSchema({ partitioned: true }).pipe(Effect.provideService(PgClient.PgClient, sql)))
        const tables = (url: string) =>
          on(url, (sql) =>
            Effect.map(
              sql<{ name: string }>`SELECT table_name AS name FROM information_schema.tables
                WHERE table_schema = 'public' ORDER BY 1`,
              (rows) =>
                rows.map((row) => row.name)
            ))
        const ciBefore = yield* tables(pair.ci)
        const result = yield* Effect.promise(() =>
          runCli(["simulate", "--duration", "1s"], {
            DATABASE_URL: pair.main,
            CI_DATABASE_URL: pair.ci,
            REDIS_URL: "redis://127.0.0.1:1/0"
          })
        )
        assert.strictEqual(result.code, 2, result.stderr)
        const lines = result.stderr.split("\n").filter((l) => l.startsWith("sweeper:"))
        assert.lengthOf(lines, 1, result.stderr)
        assert.include(lines[0], "CI_DATABASE_URL")
        assert.include(lines[0], "gitlab schema mode")
        assert.deepStrictEqual(yield* tables(pair.main), [], "no table created in main")
        assert.deepStrictEqual(yield* tables(pair.ci), ciBefore, "no table created in ci")
      }).pipe(Effect.scoped),
    120_000
  )
})
