/**
 * What a decomposed GitLab costs a ci repair: drop-canceling-builds on one database against the same
 * run on main + ci, where each page's events go through ci's outbox and the relay to main's ledger
 * (src/layers/postgres/Outbox.ts). Both on fresh databases of the local PostgreSQL server, the same
 * seed (BENCH_ROWS builds, every 100th stuck in canceling), the production layers (App.ts's
 * DatabaseBackends), alternating single/decomposed BENCH_ROUNDS times (2). Prints builds/s, the
 * best and the median of each, and their ratios.
 *
 *   npm run bench -- detail/decomposed
 *   BENCH_ROWS=100000 BENCH_ROUNDS=5 npm run bench -- detail/decomposed
 */
import { NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Context, Duration, Effect, Layer, Option, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import { performance } from "node:perf_hooks"
import { SweeperConfig, TuningFromConfig } from "../../src/config/Config.ts"
import { CiDatabase, MainDatabaseLive, onClient } from "../../src/layers/postgres/Databases.ts"
import { migrateWith } from "../../src/layers/postgres/Migrations.ts"
import { layerServer } from "../../src/layers/postgres/Postgres.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { JobQueueRedis } from "../../src/layers/redis/JobQueueRedis.ts"
import { LeaseRedis } from "../../src/layers/redis/LeaseRedis.ts"
import { Redis } from "../../src/layers/redis/Redis.ts"
import { DropCancelingBuilds } from "../../src/programs/DropCancelingBuilds.ts"
import { seedBuildsWithStuckCanceling } from "../../src/simulator/Fixtures.ts"
import { DatabaseBackends } from "../../src/supervisor/App.ts"
import { startingAt } from "../../src/supervisor/Clocks.ts"
import { runBatch } from "../../src/supervisor/RunGuard.ts"
import { benchDatabase, benchRedis, envInt, redisUrl } from "../support/harness.ts"
import { BenchLogging } from "../support/logging.ts"

const ROWS = envInt("BENCH_ROWS", 200_000)
/** Alternations of single and decomposed (a loaded machine's figures scatter: take several). */
const ROUNDS = envInt("BENCH_ROUNDS", 2)
const STUCK_EVERY = 100
const NOW = new Date("2026-01-01T05:00:00Z")

const clientOn = (url: string) =>
  Effect.map(Layer.build(layerServer(Redacted.make(url))), (context) => Context.get(context, PgClient.PgClient))

const program = Effect.gen(function*() {
  yield* benchRedis
  console.log(`drop-canceling-builds, ${ROWS.toLocaleString("en")} builds (1 in ${STUCK_EVERY} stuck) per run\n`)
  const figures: Record<string, Array<number>> = { single: [], decomposed: [] }
  for (let round = 0; round < ROUNDS; round++) {
    for (const layout of ["single", "decomposed"] as const) figures[layout]!.push(yield* measure(layout))
  }
  const best = (list: Array<number>) => Math.max(...list)
  const median = (list: Array<number>) => {
    const sorted = [...list].sort((a, b) => a - b)
    const middle = Math.floor(sorted.length / 2)
    return sorted.length % 2 === 1 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2
  }
  for (const [what, of] of [["best", best], ["median", median]] as const) {
    console.log(
      `${what === "best" ? "\n" : ""}builds/s ${what} of ${ROUNDS}: single ${of(figures.single!).toFixed(0)}, ` +
        `decomposed ${of(figures.decomposed!).toFixed(0)}; decomposed/single ${
          (of(figures.decomposed!) / of(figures.single!)).toFixed(3)
        }`
    )
  }
})

/** builds/s of one run on a fresh layout. */
const measure = (layout: "single" | "decomposed") =>
  Effect.scoped(Effect.gen(function*() {
    const mainUrl = (yield* benchDatabase(undefined)).url
    const ciUrl = layout === "single" ? mainUrl : (yield* benchDatabase(undefined)).url
    const main = yield* clientOn(mainUrl)
    const ci = yield* clientOn(ciUrl)
    const decomposed = layout === "decomposed"
    yield* onClient(main)(migrateWith(Option.none(), { decomposed }))
    if (decomposed) yield* onClient(ci)(migrateWith(Option.none(), { database: "ci", decomposed }))
    yield* onClient(ci)(seedBuildsWithStuckCanceling({ rows: ROWS, stuckEvery: STUCK_EVERY, now: NOW }))
    yield* ci`ANALYZE ci_builds`
    const Clients = Layer.mergeAll(
      Layer.succeed(PgClient.PgClient, main),
      Layer.succeed(SqlClient.SqlClient, main),
      Layer.succeed(CiDatabase, CiDatabase.of({ sql: ci, decomposed }))
    )
    const Platform = Layer.mergeAll(DatabaseBackends(), LeaseRedis, TuningFromConfig).pipe(
      Layer.provideMerge(JobQueueRedis.pipe(Layer.provide(Redis.layerSingle(Redacted.make(redisUrl))))),
      Layer.provideMerge(MetricsPrometheus),
      Layer.provideMerge(MainDatabaseLive.pipe(Layer.provideMerge(Clients))),
      Layer.provideMerge(Layer.mergeAll(Redis.layerSingle(Redacted.make(redisUrl)), SweeperConfig.layerWith({})))
    )
    return yield* Effect.gen(function*() {
      const start = performance.now()
      const result = yield* runBatch(DropCancelingBuilds, { trigger: "manual" }).pipe(startingAt(NOW))
      const seconds = (performance.now() - start) / 1000
      const dropped = (result.summary as { dropped: number }).dropped
      const events = yield* main<{ n: string }>`SELECT count(*) AS n FROM sweeper_events WHERE type = 'BuildDropped'`
      console.log(
        `${layout.padEnd(10)} ${result.outcome}: ${dropped} dropped in ${seconds.toFixed(2)} s ` +
          `(${(dropped / seconds).toFixed(0)} builds/s), ${Number(events[0]!.n)} BuildDropped in main`
      )
      return dropped / seconds
    }).pipe(Effect.provide(Platform))
  }))

program.pipe(Effect.scoped, Effect.provide(BenchLogging), Effect.timeout(Duration.minutes(30)), NodeRuntime.runMain)
