/**
 * The resume pass's invariants for random limits, load and deferred lists (with unparsable
 * elements among them): never more than the free capacity, nothing with the breaker open, FIFO,
 * and no job lost or duplicated — every element ends up exactly once in the Sidekiq queue, the
 * deferred list or the dead list. Many runs on the memory platform, fewer on real Redis.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { Clock, Context, Duration, Effect, Layer, Option, Schema } from "effect"
import { SweeperConfig } from "../../src/config/Config.ts"
import { CurrentRun } from "../../src/domain/Batch.ts"
import { MAX_RESUME_UNLIMITED, workerKeys } from "../../src/domain/ConcurrencyLimit.ts"
import { queueKey, type SidekiqJob } from "../../src/domain/Sidekiq.ts"
import { EventLogMemory } from "../../src/layers/memory/EventLogMemory.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { ConcurrencyLimitsRedis } from "../../src/layers/redis/ConcurrencyLimitsRedis.ts"
import { LeaseRedis } from "../../src/layers/redis/LeaseRedis.ts"
import { Redis } from "../../src/layers/redis/Redis.ts"
import { resumeWorker } from "../../src/programs/ConcurrencyLimitResume.ts"
import { MemoryPlatform } from "../support/memory.ts"
import { RedisTest } from "../support/redis.ts"

const W = "Releases::CreateEvidenceWorker"
const K = workerKeys(W)

const Case = {
  limit: Schema.Int.check(Schema.isBetween({ minimum: -2, maximum: 10 })),
  executing: Schema.Int.check(Schema.isBetween({ minimum: 0, maximum: 10 })),
  pending: Schema.Int.check(Schema.isBetween({ minimum: 0, maximum: 5 })),
  /** true: a deferred job, false: an unparsable element. */
  queue: Schema.Array(Schema.Boolean).check(Schema.isMaxLength(30)),
  /** The limit comes from Redis `current_limit` rather than configuration. */
  viaRedis: Schema.Boolean
}
type Case = { readonly [K in keyof typeof Case]: (typeof Case)[K]["Type"] }

/** The raw keys, whichever backend holds them. */
class Keys extends Context.Service<Keys, {
  flush: Effect.Effect<void>
  rpush(key: string, ...values: ReadonlyArray<string>): Effect.Effect<void>
  hset(key: string, fields: Record<string, string>): Effect.Effect<void>
  set(key: string, value: string): Effect.Effect<void>
  lrange(key: string): Effect.Effect<ReadonlyArray<string>>
}>()("test/programs/ConcurrencyLimitResume.property/Keys") {}

const KeysMemory = Layer.effect(
  Keys,
  Effect.map(MemoryRedis, (redis) =>
    Keys.of({
      flush: Effect.sync(() => redis.flushAll()),
      rpush: (key, ...values) => Effect.sync(() => void redis.rpush(key, ...values)),
      hset: (key, fields) => Effect.sync(() => void redis.hset(key, fields)),
      set: (key, value) => Effect.sync(() => void redis.set(key, value)),
      lrange: (key) => Effect.sync(() => redis.lrange(key, 0, -1))
    }))
)

const KeysRedis = Layer.effect(
  Keys,
  Effect.map(Redis, ({ client }) =>
    Keys.of({
      flush: Effect.promise(() => client.flushdb()).pipe(Effect.asVoid),
      rpush: (key, ...values) => Effect.promise(() => client.rpush(key, ...values)).pipe(Effect.asVoid),
      hset: (key, fields) => Effect.promise(() => client.hset(key, fields)).pipe(Effect.asVoid),
      set: (key, value) => Effect.promise(() => client.set(key, value)).pipe(Effect.asVoid),
      lrange: (key) => Effect.promise(() => client.lrange(key, 0, -1))
    }))
)

const good = (i: number) =>
  JSON.stringify({ args: [i], context: { "meta.caller_id": `c${i}` }, buffered_at: 1772366400 + i })
const bad = (i: number) => (i % 2 === 0 ? `{"args":${i}` : JSON.stringify({ context: {}, id: i }))

/**
 * One pass only: a budget shorter than RESCHEDULE_DELAY never schedules a second for a positive
 * limit, and with limit 0 (back to back) the first pass already takes the whole list (≤ 30 elements,
 * far under MAX_RESUME_UNLIMITED), so there is nothing left for a second.
 */
const onePass = Effect.provideService(CurrentRun, {
  runId: null,
  batch: null,
  dryRun: false,
  budget: Option.some(Duration.millis(500)),
  fence: Option.none()
})

const checkCase = (c: Case) =>
  Effect.gen(function*() {
    const keys = yield* Keys
    yield* keys.flush
    const elements = c.queue.map((isGood, i) => (isGood ? good(i) : bad(i)))
    if (elements.length > 0) yield* keys.rpush(K.deferred, ...elements)
    const nowSeconds = (yield* Clock.currentTimeMillis) / 1000
    for (let t = 0; t < c.executing; t++) {
      yield* keys.hset(K.executing, { [`host:${t}:x:tid:t${t}`]: String(nowSeconds) })
    }
    if (c.pending > 0) yield* keys.set(K.pendingResumed, String(c.pending))
    if (c.viaRedis) yield* keys.set(K.currentLimit, String(c.limit))

    yield* onePass(resumeWorker(W))

    const current = c.executing + c.pending
    const resumed = (yield* keys.lrange(queueKey("default"))).toReversed().map((raw) => JSON.parse(raw) as SidekiqJob)
    const deferred = yield* keys.lrange(K.deferred)
    const dead = yield* keys.lrange(K.dead)
    const goodIds = c.queue.flatMap((isGood, i) => (isGood ? [i] : []))
    const capacity = c.limit > 0 ? Math.max(c.limit - current, 0) : c.limit === 0 ? MAX_RESUME_UNLIMITED : 0

    if (c.limit > 0) assert.isAtMost(resumed.length, Math.max(c.limit - current, 0))
    if (c.limit < 0) {
      assert.lengthOf(resumed, 0)
      assert.deepStrictEqual(deferred, elements)
    }
    // Capacity is used when there are jobs to use it for.
    assert.strictEqual(resumed.length, Math.min(capacity, goodIds.length))
    // FIFO: the first-buffered jobs, in buffering order (the order Sidekiq will run them).
    assert.deepStrictEqual(resumed.map((job) => job.args[0]), goodIds.slice(0, resumed.length))
    for (const job of resumed) assert.strictEqual(job.concurrency_limit_resume, true)
    // Nothing lost, nothing duplicated: every element is in exactly one place, the order kept.
    const resumedElements = resumed.map((job) => good(job.args[0] as number))
    assert.deepStrictEqual([...dead, ...resumedElements, ...deferred].toSorted(), [...elements].toSorted())
    assert.deepStrictEqual(
      [...resumedElements, ...deferred.filter((e) => goodIds.some((i) => good(i) === e))],
      goodIds.map(good)
    )
    assert.deepStrictEqual(
      [...dead, ...deferred.filter((e) => !goodIds.some((i) => good(i) === e))],
      c.queue.flatMap((isGood, i) => (isGood ? [] : [bad(i)]))
    )
  })

/** Configuration holds a different limit when Redis overrides it, so the override must win. */
const configFor = (c: Case) => ({ concurrencyLimits: { [W]: { limit: c.viaRedis ? 3 : c.limit, queue: "default" } } })

describe("concurrency-limit-resume properties (memory)", () => {
  it.effect.prop("capacity, breaker, FIFO and conservation of jobs", Case, (c) =>
    checkCase(c).pipe(
      Effect.provide(KeysMemory.pipe(Layer.provideMerge(MemoryPlatform(configFor(c)))))
    ), { arbitrary: { runs: 300 } })
})

// Real Redis: one connection for all runs, flushed per run; the limit always comes from Redis here
// (configuration is fixed for the layer), which the memory runs show is equivalent.
const RedisPlatform = Layer.mergeAll(ConcurrencyLimitsRedis, LeaseRedis, KeysRedis, MetricsPrometheus).pipe(
  Layer.provideMerge(RedisTest),
  Layer.provideMerge(EventLogMemory),
  Layer.provideMerge(SweeperConfig.layerWith({ concurrencyLimits: { [W]: { limit: 3, queue: "default" } } }))
)

layer(RedisPlatform, { excludeTestServices: true, timeout: "30 seconds" })(
  "concurrency-limit-resume properties (real Redis)",
  (it) => {
    it.effect.prop(
      "capacity, breaker, FIFO and conservation of jobs",
      Case,
      (c) => checkCase({ ...c, viaRedis: true }),
      {
        arbitrary: { runs: 60 }
      }
    )
  }
)
