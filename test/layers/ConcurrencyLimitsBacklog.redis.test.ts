/**
 * concurrency-limit-resume's backlog on a real Redis holding 1 M SharedState keys: one sample
 * issues a bounded number of commands (at most SWEEP.calls SCANs, three reads per worker read) and
 * finishes quickly, where a whole-keyspace discovery (what every sample did before) takes thousands
 * of SCANs; a sample before the sweep is through says it is stale; a second sample within
 * SWEEP.every scans nothing; more workers with jobs deferred than MAX_WORKERS is reported as capped.
 */
import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect, Layer } from "effect"
import { SweeperConfig } from "../../src/config/Config.ts"
import { workerKeys } from "../../src/domain/ConcurrencyLimit.ts"
import { ConcurrencyLimitsRedis } from "../../src/layers/redis/ConcurrencyLimitsRedis.ts"
import { type RedisClient, SharedStateRedis } from "../../src/layers/redis/Redis.ts"
import { concurrencyLimitResumeBacklog, MAX_WORKERS, SWEEP } from "../../src/programs/ConcurrencyLimitResumeBacklog.ts"
import { ConcurrencyLimits } from "../../src/services/ConcurrencyLimits.ts"
import { RedisTopologyTest } from "../support/redisTopology.ts"

const KEYS = 1_000_000
const CONFIGURED = "Releases::CreateEvidenceWorker"

const Under = (concurrencyLimits: Record<string, { limit: number; queue: string }>) =>
  ConcurrencyLimitsRedis.pipe(
    Layer.provideMerge(RedisTopologyTest("single")),
    Layer.provideMerge(SweeperConfig.layerWith({ concurrencyLimits }))
  )

const client = Effect.map(SharedStateRedis, (redis) => redis.client as RedisClient & { eval: Function })
const call = <A>(f: (c: any) => Promise<A>) => Effect.flatMap(client, (c) => Effect.promise(() => f(c)))

/** 1 M filler keys, 100 k per script (each a few hundred ms of one Redis of our own). */
const FILL = `for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do redis.call('SET', 'filler:' .. i, 'x') end return 1`
const fill = Effect.forEach(
  Array.from({ length: KEYS / 100_000 }, (_, i) => i * 100_000),
  (start) => call((c) => c.eval(FILL, 0, start + 1, start + 100_000)),
  { discard: true }
)

/** Calls per command since the last reset (INFO commandstats), without the INFO itself. */
const commandCalls = call(async (c) => {
  const info: string = await c.info("commandstats")
  const calls: Record<string, number> = {}
  for (const m of info.matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm)) calls[m[1]!] = Number(m[2])
  delete calls.info
  return calls
})
const resetStats = call((c) => c.config("RESETSTAT"))
const timed = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.gen(function*() {
    const start = performance.now()
    const value = yield* effect
    return { value, ms: performance.now() - start }
  })

const deferred = (worker: string, n: number) =>
  call((c) =>
    c.rpush(
      workerKeys(worker).deferred,
      ...Array.from({ length: n }, (_, i) => JSON.stringify({ args: [i], buffered_at: Date.now() / 1000 - 600 }))
    )
  )

describe("concurrency-limit-resume backlog on 1 M SharedState keys", () => {
  it.live(
    "a sample costs a bounded number of commands, says it is stale until a sweep is through",
    () =>
      Effect.gen(function*() {
        yield* fill
        yield* deferred(CONFIGURED, 3)
        // Workers nobody configured: only a keyspace discovery finds them (and the run skips them).
        for (const worker of ["A::OneWorker", "B::TwoWorker"]) yield* deferred(worker, 2)
        assert.isAtLeast(yield* call<number>((c) => c.dbsize()), KEYS)

        yield* resetStats
        const first = yield* timed(concurrencyLimitResumeBacklog)
        const calls = yield* commandCalls
        // The reader's own commands (server-wide counts: another test on the same server could add others).
        const total = ["scan", "llen", "get", "lrange"].reduce((sum, command) => sum + (calls[command] ?? 0), 0)
        console.log(`backlog sample on ${KEYS} keys: ${first.ms.toFixed(0)} ms, commands ${JSON.stringify(calls)}`)
        assert.isAtMost(calls.scan ?? 0, SWEEP.calls)
        assert.isAtMost(total, SWEEP.calls + 3 * MAX_WORKERS)
        assert.isBelow(first.ms, 2_000)
        assert.deepStrictEqual(first.value.parts.map((p) => [p.label, p.count]), [[CONFIGURED, 3]])
        assert.isTrue(first.value.stale)
        assert.include(first.value.note, "still sweeping the keyspace")

        // Within SWEEP.every: no SCAN at all, the known workers read again.
        yield* resetStats
        yield* concurrencyLimitResumeBacklog
        assert.isUndefined((yield* commandCalls).scan)

        // The sweep, carried across samples, gets through: the figure is fresh and the discovered
        // workers' jobs are noted as left alone by the run.
        const limits = yield* ConcurrencyLimits
        let samples = 1
        while ((yield* limits.knownDeferredWorkers({ ...SWEEP, every: Duration.zero })).completeAt === null) samples++
        console.log(`a whole sweep of ${KEYS} keys took ${samples} samples of at most ${SWEEP.calls} SCANs`)
        assert.isAtMost(samples, Math.ceil(KEYS / (SWEEP.calls * SWEEP.count)) + 2)
        const fresh = yield* concurrencyLimitResumeBacklog
        assert.isFalse(fresh.stale)
        assert.include(fresh.note, "2 with jobs deferred but no limit set")

        // What each sample cost before: the whole-keyspace discovery.
        yield* resetStats
        const whole = yield* timed(limits.workersWithDeferredJobs)
        const wholeScans = (yield* commandCalls).scan ?? 0
        console.log(
          `whole-keyspace discovery (the old per-sample read): ${whole.ms.toFixed(0)} ms, ${wholeScans} SCANs`
        )
        assert.isAbove(wholeScans, 10 * SWEEP.calls)
      }).pipe(Effect.provide(Under({ [CONFIGURED]: { limit: 3, queue: "default" } }))),
    120_000
  )

  it.live(
    "more workers with jobs deferred than MAX_WORKERS: the figure says it is capped",
    () =>
      Effect.gen(function*() {
        const workers = Array.from({ length: MAX_WORKERS + 10 }, (_, i) => `Load::Worker${String(i).padStart(3, "0")}`)
        // Configured workers with nothing deferred are not "more than read".
        for (const worker of workers.slice(0, 2)) yield* deferred(worker, 1)
        const few = yield* concurrencyLimitResumeBacklog
        assert.isFalse(few.capped)
        assert.strictEqual(few.parts.length, 2)
        for (const worker of workers.slice(2)) yield* deferred(worker, 1)
        const reading = yield* concurrencyLimitResumeBacklog
        assert.isTrue(reading.capped)
        assert.strictEqual(reading.parts.reduce((sum, p) => sum + p.count, 0), MAX_WORKERS)
        assert.include(reading.note, `${MAX_WORKERS + 10} workers with jobs deferred, the first ${MAX_WORKERS} read`)
      }).pipe(
        Effect.provide(Under(Object.fromEntries(
          Array.from({ length: MAX_WORKERS + 10 }, (_, i) => [`Load::Worker${String(i).padStart(3, "0")}`, {
            limit: 1,
            queue: "default"
          }])
        )))
      ),
    60_000
  )
})
