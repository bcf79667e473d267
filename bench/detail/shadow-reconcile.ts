/**
 * Shadow mode's own cost on a realistic table: 1,000,000 ci_builds rows (≈1% stuck in canceling,
 * failed builds throughout 60 days), GitLab's index on (status, created_at, project_id), and
 * drop-canceling-builds and drop-running-builds in shadow beside their plain dry runs. Prints the
 * dry run, the first shadow run (recording ≈10,000 proposals), GitLab's worker played (half the
 * stuck builds failed as Sweeper would, a quarter canceled), the judging shadow run (≈10,000
 * proposals read back by primary key), and drop-running-builds' gitlabOnly read with its plan.
 *
 *   npm run bench -- detail/shadow-reconcile
 *   BENCH_ROWS=200000 npm run bench -- detail/shadow-reconcile
 */
import { NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Duration, Effect, Layer, Redacted } from "effect"
import { performance } from "node:perf_hooks"
import { SweeperConfig, TuningFromConfig } from "../../src/config/Config.ts"
import type { Batch } from "../../src/domain/Batch.ts"
import { MainDatabaseLive, SingleDatabase } from "../../src/layers/postgres/Databases.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { Redis } from "../../src/layers/redis/Redis.ts"
import { DropCancelingBuilds } from "../../src/programs/DropCancelingBuilds.ts"
import { DropRunningBuilds } from "../../src/programs/DropRunningBuilds.ts"
import { seedBuildsWithStuckCanceling } from "../../src/simulator/Fixtures.ts"
import { RedisServices, ShadowLayers, SqlBackends } from "../../src/supervisor/App.ts"
import { startingAt } from "../../src/supervisor/Clocks.ts"
import { runBatch } from "../../src/supervisor/RunGuard.ts"
import { adminUrl, benchDatabase, benchRedis, migratedDatabase, redisUrl, timed } from "../support/harness.ts"
import { BenchLogging } from "../support/logging.ts"

const ROWS = Number(process.env.BENCH_ROWS ?? 1_000_000)
const STUCK_EVERY = 100
const NOW = new Date("2026-01-01T05:00:00Z")

const program = Effect.gen(function*() {
  const { name, url } = yield* benchDatabase(undefined)
  yield* benchRedis
  console.log(`database ${name} on ${new URL(adminUrl).host}, ${ROWS.toLocaleString("en")} rows\n`)
  const store = Redacted.make(redisUrl)
  const Platform = ShadowLayers.pipe(
    Layer.provideMerge(Layer.mergeAll(SqlBackends, TuningFromConfig)),
    Layer.provideMerge(RedisServices),
    Layer.provideMerge(MetricsPrometheus),
    Layer.provideMerge(Layer.mergeAll(SingleDatabase, MainDatabaseLive)),
    Layer.provideMerge(
      Layer.mergeAll(
        migratedDatabase(url),
        Redis.layerStores({ sharedState: store, queues: store, queuesMetadata: store }),
        SweeperConfig.layerWith({ node: "bench" })
      )
    )
  )

  yield* Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    yield* timed(
      "seed (generate_series)",
      seedBuildsWithStuckCanceling({ rows: ROWS, stuckEvery: STUCK_EVERY, now: NOW })
    )
    // GitLab's own index, which the gitlabOnly read goes through (p_ci_builds_status_created_at_project_id_idx).
    yield* timed(
      "GitLab's (status, created_at, project_id) index",
      sql`CREATE INDEX ci_builds_status_created_at_project_id_idx ON ci_builds (status, created_at, project_id)
        WHERE type = 'Ci::Build'`
    )
    yield* timed("ANALYZE ci_builds", sql`ANALYZE ci_builds`)

    const run = <S, E, R>(label: string, batch: Batch<S, E, R>, shadow: boolean) =>
      Effect.gen(function*() {
        const start = performance.now()
        const result = yield* runBatch(shadow ? { ...batch, mode: "shadow" as const } : batch, {
          trigger: "manual",
          dryRun: !shadow
        }).pipe(startingAt(NOW))
        const seconds = (performance.now() - start) / 1000
        const summary = result.summary as { shadow?: unknown; dropped?: number } | null
        console.log(
          `${label.padEnd(44)} ${seconds.toFixed(2).padStart(7)} s  ${result.outcome}  dropped=${summary?.dropped}${
            summary?.shadow === undefined ? "" : `  ${JSON.stringify(summary.shadow)}`
          }${result.error === undefined ? "" : `  ${result.error}`}`
        )
      })

    console.log("")
    yield* run("drop-canceling-builds, plain dry run", DropCancelingBuilds, false)
    yield* run("drop-canceling-builds, shadow (records)", DropCancelingBuilds, true)
    yield* timed(
      "GitLab's worker played (½ failed/3, ¼ canceled)",
      sql`UPDATE ci_builds SET status = CASE WHEN (id / ${STUCK_EVERY}) % 4 IN (0, 1) THEN 'failed' ELSE 'canceled' END,
          failure_reason = CASE WHEN (id / ${STUCK_EVERY}) % 4 IN (0, 1) THEN 3 ELSE failure_reason END
        WHERE (id / ${STUCK_EVERY}) % 4 <> 3
          AND id IN (SELECT substring(entity FROM 7)::bigint FROM sweeper_shadow_candidates)`
    )
    yield* sql`UPDATE sweeper_shadow_candidates SET due_at = ${new Date(NOW.getTime() - 1000)} WHERE verdict IS NULL`
    yield* run("drop-canceling-builds, shadow (judges)", DropCancelingBuilds, true)
    yield* run("drop-running-builds, plain dry run", DropRunningBuilds, false)
    yield* run("drop-running-builds, shadow (gitlabOnly read)", DropRunningBuilds, true)

    const plan = yield* sql<{ "QUERY PLAN": string }>`EXPLAIN (ANALYZE, BUFFERS)
      SELECT id, failure_reason, finished_at, started_at FROM (
        SELECT id, failure_reason, finished_at, started_at, updated_at FROM ci_builds
        WHERE status = 'failed' AND type = 'Ci::Build' AND created_at >= ${new Date(NOW.getTime() - 7 * 86_400_000)}
        ORDER BY created_at DESC LIMIT 5000) recent
      WHERE failure_reason IN (3) AND coalesce(finished_at, updated_at) >= ${new Date(NOW.getTime() - 86_400_000)}`
    console.log("\nEXPLAIN (ANALYZE, BUFFERS) the gitlabOnly read:")
    console.log(plan.map((row) => `    ${row["QUERY PLAN"]}`).join("\n"))
    const ledger = yield* sql<{ verdict: string | null; n: string }>`SELECT verdict, count(*) AS n
      FROM sweeper_shadow_candidates GROUP BY verdict ORDER BY verdict`
    console.log(`\nledger: ${ledger.map((r) => `${r.verdict ?? "open"}=${r.n}`).join(", ")}`)
    console.log(`peak RSS ${(process.resourceUsage().maxRSS / 1024).toFixed(0)} MB`)
  }).pipe(Effect.provide(Platform))
})

program.pipe(
  Effect.scoped,
  Effect.provide(BenchLogging),
  Effect.timeout(Duration.minutes(30)),
  NodeRuntime.runMain
)
