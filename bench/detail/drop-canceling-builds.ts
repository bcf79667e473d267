/**
 * drop-canceling-builds on a realistic table: a fresh database on the local PostgreSQL server with
 * 1,000,000 ci_builds rows (≈1% stuck in canceling), the page query's plan and timing, then the batch
 * itself through the run guard with the real layers (PostgreSQL + Redis). Prints figures only.
 *
 *   npm run bench -- drop-canceling-builds
 *   BENCH_ROWS=200000 BENCH_DATABASE_URL=postgres://… BENCH_REDIS_URL=redis://…/12 npm run bench -- drop-canceling-builds
 */
import { NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { DateTime, Duration, Effect, Layer, Option, Redacted } from "effect"
import { performance } from "node:perf_hooks"
import { SweeperConfig } from "../../src/config/Config.ts"
import { cancelingCutoff, DROP_BATCH_SIZE } from "../../src/domain/Build.ts"
import { BuildsSql, stuckCancelingQuery } from "../../src/layers/postgres/BuildsSql.ts"
import { EventLogSql } from "../../src/layers/postgres/EventLogSql.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { LeaseRedis } from "../../src/layers/redis/LeaseRedis.ts"
import { Redis } from "../../src/layers/redis/Redis.ts"
import { DropCancelingBuilds } from "../../src/programs/DropCancelingBuilds.ts"
import { seedBuildsWithStuckCanceling } from "../../src/simulator/Fixtures.ts"
import { startingAt } from "../../src/supervisor/Clocks.ts"
import { runBatch } from "../../src/supervisor/RunGuard.ts"
import { adminUrl, benchDatabase, benchRedis, migratedDatabase, redisUrl, timed } from "../support/harness.ts"
import { BenchLogging } from "../support/logging.ts"

const ROWS = Number(process.env.BENCH_ROWS ?? 1_000_000)
/** Every STUCK_EVERY-th row is a stuck canceling build. */
const STUCK_EVERY = 100
const NOW = new Date("2026-01-01T05:00:00Z")
/** Each drop commits its own transaction, so commit latency (WAL fsync) dominates; `off` shows the rest. */
const SYNCHRONOUS_COMMIT = process.env.BENCH_SYNCHRONOUS_COMMIT

// Finished builds over the 60 days before NOW, a few running, every 100th build stuck in
// canceling for more than an hour; canceling bridges and fresh canceling builds must stay untouched
// (the simulator's bulk fixture, the same one the side-by-side scenario seeds).
const seed = seedBuildsWithStuckCanceling({ rows: ROWS, stuckEvery: STUCK_EVERY, now: NOW })

const counts = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  const rows = yield* sql<{ status: string; type: string; n: string }>`
    SELECT status, type, count(*) AS n FROM ci_builds GROUP BY status, type ORDER BY count(*) DESC`
  return rows.map((r) => `${r.status}${r.type === "Ci::Build" ? "" : ` (${r.type})`}=${Number(r.n)}`).join(", ")
})

const explain = (after: Parameters<typeof stuckCancelingQuery>[1]["after"]) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const query = stuckCancelingQuery(sql, {
      cutoff: cancelingCutoff(DateTime.fromDateUnsafe(NOW)),
      after,
      limit: DROP_BATCH_SIZE
    })
    const plan = yield* sql<{ "QUERY PLAN": string }>`EXPLAIN (ANALYZE, BUFFERS) ${query}`
    return plan.map((row) => `    ${row["QUERY PLAN"]}`).join("\n")
  })

const program = Effect.gen(function*() {
  const { name, url } = yield* benchDatabase(SYNCHRONOUS_COMMIT)
  yield* benchRedis
  console.log(
    `database ${name} on ${new URL(adminUrl).host}, redis ${redisUrl}, ${ROWS.toLocaleString("en")} rows` +
      `${SYNCHRONOUS_COMMIT === undefined ? "" : `, synchronous_commit=${SYNCHRONOUS_COMMIT}`}\n`
  )

  const Database = migratedDatabase(url)
  // Exactly the production layers drop-canceling-builds runs on (see supervisor/App.ts).
  const Platform = Layer.mergeAll(BuildsSql, LeaseRedis, MetricsPrometheus).pipe(
    Layer.provideMerge(EventLogSql),
    Layer.provideMerge(
      Layer.mergeAll(Database, Redis.layerSingle(Redacted.make(redisUrl)), SweeperConfig.layerWith({ node: "bench" }))
    )
  )

  yield* Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    yield* timed("seed (generate_series)", seed)
    yield* timed("ANALYZE ci_builds", sql`ANALYZE ci_builds`)
    const size = yield* sql<{ table: string; index: string }>`
      SELECT pg_size_pretty(pg_table_size('ci_builds')) AS table,
        pg_size_pretty(pg_relation_size('index_ci_builds_canceling_on_created_at_project_id_id')) AS index`
    console.log(`ci_builds ${size[0]!.table}, canceling partial index ${size[0]!.index}`)
    console.log(`rows: ${yield* counts}\n`)

    console.log("EXPLAIN (ANALYZE, BUFFERS) first page:")
    console.log(yield* explain(Option.none()))
    const middle = yield* sql<{ id: string; project_id: string; created_at: Date; created_at_exact: string }>`
      SELECT id, project_id, created_at, to_char(created_at, 'YYYY-MM-DD HH24:MI:SS.US') AS created_at_exact FROM ci_builds WHERE status = 'canceling' AND type = 'Ci::Build'
      ORDER BY created_at, project_id, id OFFSET ${Math.floor(ROWS / STUCK_EVERY / 2)} LIMIT 1`
    if (middle[0] !== undefined) {
      console.log("\nEXPLAIN (ANALYZE, BUFFERS) a page in the middle of the walk (keyset):")
      console.log(
        yield* explain(Option.some({
          createdAt: DateTime.fromDateUnsafe(middle[0].created_at),
          projectId: Number(middle[0].project_id),
          id: Number(middle[0].id),
          createdAtExact: middle[0].created_at_exact
        }))
      )
    }

    const cpu = process.cpuUsage()
    const start = performance.now()
    const result = yield* runBatch(DropCancelingBuilds, { trigger: "manual" }).pipe(startingAt(NOW))
    const seconds = (performance.now() - start) / 1000
    const cpuUsed = process.cpuUsage(cpu)
    const summary = result.summary as { dropped: number; doomed: number; batches: number } | null
    const events = yield* sql<{ n: string }>`SELECT count(*) AS n FROM sweeper_events WHERE run_id = ${result.runId}`
    const left = yield* sql<{ n: string }>`SELECT count(*) AS n FROM ci_builds
      WHERE status = 'canceling' AND type = 'Ci::Build' AND created_at < ${new Date(NOW.getTime() - 3_600_000)}
        AND updated_at < ${new Date(NOW.getTime() - 3_600_000)}`

    console.log(
      `\nrun ${result.runId}: ${result.outcome}${result.reason ? ` (${result.reason})` : ""}${
        result.error ? ` ${result.error}` : ""
      }`
    )
    console.log(`summary                            ${JSON.stringify(summary)}`)
    console.log(`wall time                          ${seconds.toFixed(2)} s`)
    if (summary !== null) {
      console.log(`builds/s                           ${((summary.dropped + summary.doomed) / seconds).toFixed(0)}`)
      console.log(`batches (pages of ${DROP_BATCH_SIZE})             ${summary.batches}`)
    }
    console.log(`events recorded for the run        ${Number(events[0]!.n)}`)
    console.log(`stuck builds left                  ${Number(left[0]!.n)}`)
    console.log(`process CPU (user+sys)             ${((cpuUsed.user + cpuUsed.system) / 1e6).toFixed(2)} s`)
    console.log(`peak RSS                           ${(process.resourceUsage().maxRSS / 1024).toFixed(0)} MB`)
  }).pipe(Effect.provide(Platform))
})

program.pipe(
  Effect.scoped,
  // Sweeper logs as in production (Info, JSON lines into a scratch file: support/logging.ts).
  Effect.provide(BenchLogging),
  Effect.timeout(Duration.minutes(30)),
  NodeRuntime.runMain
)
