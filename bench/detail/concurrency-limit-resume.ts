/**
 * concurrency-limit-resume draining a large backlog: 50,000 jobs deferred for one worker (GitLab's
 * `{args, context, buffered_at}` elements, RPUSHed in pipelined chunks) whose limit is 0 —
 * unlimited, i.e. up to MAX_RESUME_UNLIMITED (5000) resumed per pass — plus a few fresh executing
 * trackers, then the batch through the run guard with the real layers (Redis, PostgreSQL event log)
 * and a budget long enough to drain the list. With limit 0 the passes run back to back (no
 * RESCHEDULE_DELAY), so the wall time is the passes themselves; the per-pass figures show their parts.
 *
 *   npm run bench -- concurrency-limit-resume
 *   BENCH_JOBS=10000 npm run bench -- concurrency-limit-resume
 *   (BENCH_DATABASE_URL, BENCH_REDIS_URL: admin database and Redis database, defaults …/test and …/12)
 */
import { NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Duration, Effect, Layer, Redacted } from "effect"
import type { Redis as IORedis } from "ioredis"
import { performance } from "node:perf_hooks"
import { SweeperConfig } from "../../src/config/Config.ts"
import { MAX_RESUME_UNLIMITED, workerKeys } from "../../src/domain/ConcurrencyLimit.ts"
import type { ConcurrencyLimitResumeSummary } from "../../src/domain/ConcurrencyLimit.ts"
import { queueKey } from "../../src/domain/Sidekiq.ts"
import { EventLogSql } from "../../src/layers/postgres/EventLogSql.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { ConcurrencyLimitsRedis } from "../../src/layers/redis/ConcurrencyLimitsRedis.ts"
import { LeaseRedis } from "../../src/layers/redis/LeaseRedis.ts"
import { Redis } from "../../src/layers/redis/Redis.ts"
import { ConcurrencyLimitResume } from "../../src/programs/ConcurrencyLimitResume.ts"
import { ConcurrencyLimits } from "../../src/services/ConcurrencyLimits.ts"
import { runBatch } from "../../src/supervisor/RunGuard.ts"
import {
  adminUrl,
  benchDatabase,
  benchRedis,
  collectGarbage,
  countingRedisCommands,
  envInt,
  fmt,
  formatCommands,
  line,
  maxRss,
  mb,
  memoryNow,
  migratedDatabase,
  percentile,
  redisUrl,
  samplingMemory,
  Stopwatch,
  timed
} from "../support/harness.ts"
import { BenchLogging } from "../support/logging.ts"

const JOBS = envInt("BENCH_JOBS", 50_000)
const WORKER = "Releases::CreateEvidenceWorker"
const QUEUE = "default"
const TRACKERS = 10
const PUSH_CHUNK = 1_000
const PUSHES_PER_PIPELINE = 10
/** Long enough for every pass: one per second plus the passes themselves, with room to spare. */
const BUDGET = Duration.seconds(Math.ceil(JOBS / MAX_RESUME_UNLIMITED) * 3 + 60)

const keys = workerKeys(WORKER)

/** Element i as GitLab's ConcurrencyLimit::QueueManager writes it. */
const element = (i: number, bufferedAt: number) =>
  JSON.stringify({
    args: [i, `gid://gitlab/Release/${i}`],
    context: {
      "meta.user": "root",
      "meta.project": `gitlab-org/project-${i % 100}`,
      "meta.root_namespace": "gitlab-org",
      "meta.caller_id": "Releases::CreateService",
      "meta.feature_category": "release_evidence",
      "meta.client_id": "user/1"
    },
    buffered_at: bufferedAt
  })

const seed = (redis: IORedis) =>
  Effect.promise(async () => {
    const nowSeconds = Date.now() / 1000
    let bytes = 0
    let i = 0
    while (i < JOBS) {
      const pipeline = redis.pipeline()
      for (let p = 0; p < PUSHES_PER_PIPELINE && i < JOBS; p++) {
        const chunk: Array<string> = []
        for (let c = 0; c < PUSH_CHUNK && i < JOBS; c++, i++) {
          const value = element(i, nowSeconds - 600 + i / 1000)
          bytes += value.length
          chunk.push(value)
        }
        pipeline.rpush(keys.deferred, ...chunk)
      }
      const results = await pipeline.exec()
      const failed = results?.find(([error]) => error !== null)
      if (failed !== undefined) throw failed[0]
    }
    // A few jobs of the worker running now (fresh trackers: the pass scans them, removes none).
    const trackers: Record<string, string> = {}
    for (let t = 0; t < TRACKERS; t++) {
      trackers[`gitlab-sidekiq-${t}:1234:ab12:tid:t${t}`] = String(Math.floor(nowSeconds) - 5)
    }
    await redis.hset(keys.executing, trackers)
    return bytes
  })

/**
 * Instrumentation around the real ConcurrencyLimits: every pass starts with `limitOf` and ends with
 * the last call before the 1 s delay (after the move and its event), so a pass's time is from one to
 * the other; `resume` (read the list head, build the jobs, the MOVE script) is timed on its own.
 */
const passes: Array<number> = []
const resumeTime = new Stopwatch(true)
let passStart: number | undefined
let lastEnd = 0

const closePass = () => {
  if (passStart !== undefined) passes.push(lastEnd - passStart)
  passStart = undefined
}

const InstrumentedLimits = Layer.effect(
  ConcurrencyLimits,
  Effect.gen(function*() {
    const real = yield* ConcurrencyLimits
    const track = <A, E, R>(effect: Effect.Effect<A, E, R>, starts = false) =>
      Effect.suspend(() => {
        if (starts) {
          closePass()
          passStart = performance.now()
        }
        return Effect.ensuring(effect, Effect.sync(() => void (lastEnd = performance.now())))
      })
    return ConcurrencyLimits.of({
      workersWithDeferredJobs: real.workersWithDeferredJobs,
      knownDeferredWorkers: real.knownDeferredWorkers,
      oldestDeferred: real.oldestDeferred,
      deferredDigests: real.deferredDigests,
      limitOf: (worker) => track(real.limitOf(worker), true),
      queueSize: (worker) => track(real.queueSize(worker)),
      currentConcurrency: (worker) => track(real.currentConcurrency(worker)),
      cleanupStaleTrackers: (worker) => track(real.cleanupStaleTrackers(worker)),
      recordMoves: real.recordMoves,
      recoverMove: (worker) => track(real.recoverMove(worker)),
      resume: (request) => track(resumeTime.time(real.resume(request)))
    })
  })
).pipe(Layer.provide(ConcurrencyLimitsRedis))

/** EVAL with 3 keys is the BEGIN_MOVE script; the rest are labelled by their first key's kind. */
const commandLabel = (context: { readonly command: string; readonly args: ReadonlyArray<string> }) =>
  context.command === "eval"
    ? (context.args[1] === "3" ? "eval BEGIN_MOVE" : `eval ${context.args[1]} keys`)
    : context.command

const stats = (samples: ReadonlyArray<number>) => {
  const sorted = [...samples].sort((a, b) => a - b)
  const mean = sorted.reduce((sum, x) => sum + x, 0) / Math.max(sorted.length, 1)
  return `min ${sorted[0]?.toFixed(1)}, median ${percentile(sorted, 0.5).toFixed(1)}, mean ${mean.toFixed(1)}, ` +
    `p90 ${percentile(sorted, 0.9).toFixed(1)}, max ${sorted.at(-1)?.toFixed(1)} ms`
}

const program = Effect.gen(function*() {
  const database = yield* benchDatabase(process.env.BENCH_SYNCHRONOUS_COMMIT)
  const redis = yield* benchRedis
  console.log(
    `database ${database.name} on ${new URL(adminUrl).host}, redis ${redisUrl}, ${
      fmt(JOBS)
    } deferred jobs of ${WORKER} (limit 0)\n`
  )

  const Platform = Layer.mergeAll(InstrumentedLimits, LeaseRedis, MetricsPrometheus).pipe(
    Layer.provideMerge(EventLogSql),
    Layer.provideMerge(Layer.mergeAll(
      migratedDatabase(database.url),
      Redis.layerSingle(Redacted.make(redisUrl)),
      SweeperConfig.layerWith({ node: "bench", concurrencyLimits: { [WORKER]: { limit: 0, queue: QUEUE } } })
    ))
  )

  const bytes = yield* timed(`seed (pipelined RPUSH, ${PUSH_CHUNK} × ${PUSHES_PER_PIPELINE})`, seed(redis))
  const listBytes = yield* Effect.promise(() => redis.memory("USAGE", keys.deferred, "SAMPLES", 0))
  line("deferred list LLEN", yield* Effect.promise(() => redis.llen(keys.deferred)))
  line("  elements / MEMORY USAGE", `${mb(bytes)} / ${mb(Number(listBytes))}`)

  yield* Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    collectGarbage()
    const before = memoryNow()
    const cpu = process.cpuUsage()
    const start = performance.now()
    const [[result, commands], peak] = yield* runBatch(ConcurrencyLimitResume, { trigger: "manual", budget: BUDGET })
      .pipe(
        (run) => countingRedisCommands(run, commandLabel),
        samplingMemory(20)
      )
    const seconds = (performance.now() - start) / 1000
    const cpuUsed = process.cpuUsage(cpu)
    closePass()

    const summary = result.summary as ConcurrencyLimitResumeSummary | null
    const resumed = summary?.resumedJobs ?? 0
    const events = yield* sql<{ n: string; jobs: string }>`
      SELECT count(*) AS n, coalesce(sum((data->>'count')::int), 0) AS jobs FROM sweeper_events
      WHERE run_id = ${result.runId} AND type = 'ConcurrencyLimitJobsResumed'`
    const left = yield* Effect.promise(() => redis.llen(keys.deferred))
    const queued = yield* Effect.promise(() => redis.llen(queueKey(QUEUE)))
    const firstOut = yield* Effect.promise(() => redis.lindex(queueKey(QUEUE), -1))
    const pendingResumed = yield* Effect.promise(() => redis.get(keys.pendingResumed))
    const passTotal = passes.reduce((sum, ms) => sum + ms, 0)

    console.log(
      `\nrun ${result.runId}: ${result.outcome}${result.reason ? ` (${result.reason})` : ""}${
        result.error ? ` ${result.error}` : ""
      }`
    )
    line("summary", JSON.stringify(summary))
    line("wall time", `${seconds.toFixed(2)} s (budget ${Duration.format(BUDGET)})`)
    line("jobs moved", resumed)
    line("jobs moved/s (wall)", fmt(resumed / seconds))
    line(
      "passes",
      `${passes.length} (${fmt(Number(events[0]!.n))} ConcurrencyLimitJobsResumed events, ${
        fmt(Number(events[0]!.jobs))
      } jobs)`
    )
    line(
      "wall time outside passes (limit 0: no delays)",
      `${Math.max(seconds - passTotal / 1000, 0).toFixed(2)} s of ${seconds.toFixed(1)} s`
    )
    line("per pass (limit … move … event … LLEN)", stats(passes))
    line("  of which resume() (LRANGE, decode, the five move steps)", stats(resumeTime.samples))
    const move = commands.get("eval BEGIN_MOVE")
    if (move !== undefined) {
      line("  of which the BEGIN_MOVE script (EVAL)", `${(move.ms / move.calls).toFixed(1)} ms avg over ${move.calls}`)
    }
    line(
      "time in passes, total",
      `${(passTotal / 1000).toFixed(2)} s → ${fmt(resumed / (passTotal / 1000))} jobs/s without the delays`
    )
    line("Redis round trips", formatCommands(commands))
    line("deferred list left / queue:default LLEN", `${fmt(left)} / ${fmt(queued)}`)
    line(
      "first job Sidekiq pops (RPOP end)",
      firstOut === null ? "-" : `args ${JSON.stringify((JSON.parse(firstOut) as { args: unknown }).args)}`
    )
    line("pending_resumed", pendingResumed ?? "-")
    line("process CPU (user+sys)", `${((cpuUsed.user + cpuUsed.system) / 1e6).toFixed(2)} s`)
    line("RSS / heap used before the run (after GC)", `${mb(before.rss)} / ${mb(before.heapUsed)}`)
    line("peak RSS / heap used during the run", `${mb(peak.rss)} / ${mb(peak.heapUsed)}`)
    line("process peak RSS (whole process)", mb(maxRss()))
    console.log("")
  }).pipe(Effect.provide(Platform))
})

program.pipe(
  Effect.scoped,
  // Sweeper logs as in production (Info, JSON lines into a scratch file: support/logging.ts).
  Effect.provide(BenchLogging),
  Effect.timeout(Duration.minutes(30)),
  NodeRuntime.runMain
)
