/**
 * Arbitrary bytes in the deferred list, on real Redis and in memory: whatever the
 * elements hold — random bytes, 0xFF inside otherwise valid JSON, valid jobs with any Unicode in
 * their args — after one pass every element is exactly once in `queue:<q>` (valid ones, as Sidekiq
 * jobs carrying the stored args), in the dead list (byte for byte) or still deferred (at the tail,
 * in order); nothing lost, nothing duplicated, no move journal left, and the limit never exceeded.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { Context, Duration, Effect, Layer, Option, Schema } from "effect"
import { SweeperConfig } from "../../src/config/Config.ts"
import { CurrentRun } from "../../src/domain/Batch.ts"
import { MAX_RESUME_UNLIMITED, parseDeferred, workerKeys } from "../../src/domain/ConcurrencyLimit.ts"
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

const Arg = Schema.Union([Schema.String, Schema.Int, Schema.Boolean, Schema.Null])
/** One deferred element as generated: random bytes, a valid job, or a valid job with one byte replaced by 0xFF. */
const Element = Schema.Union([
  Schema.Struct({ kind: Schema.Literal("bytes"), bytes: Schema.Uint8Array }),
  Schema.Struct({ kind: Schema.Literal("job"), args: Schema.Array(Arg).check(Schema.isMaxLength(4)) }),
  Schema.Struct({
    kind: Schema.Literal("corrupt"),
    args: Schema.Array(Arg).check(Schema.isMaxLength(4)),
    at: Schema.Int.check(Schema.isBetween({ minimum: 0, maximum: 1000 }))
  })
])
type Element = typeof Element.Type

const Case = {
  limit: Schema.Int.check(Schema.isBetween({ minimum: -1, maximum: 8 })),
  executing: Schema.Int.check(Schema.isBetween({ minimum: 0, maximum: 6 })),
  elements: Schema.Array(Element).check(Schema.isMaxLength(25))
}
type Case = { readonly [K in keyof typeof Case]: (typeof Case)[K]["Type"] }

const bytesOf = (element: Element, i: number): Buffer => {
  switch (element.kind) {
    case "bytes":
      return Buffer.from(element.bytes)
    case "job":
      // `i` makes every valid element distinct, so "exactly once" is checkable by args.
      return Buffer.from(
        JSON.stringify({ args: [i, ...element.args], context: { "meta.caller_id": "c" }, buffered_at: 1772366400 + i })
      )
    case "corrupt": {
      const valid = Buffer.from(JSON.stringify({ args: [i, ...element.args] }))
      valid[element.at % valid.length] = 0xff
      return valid
    }
  }
}

class Keys extends Context.Service<Keys, {
  flush: Effect.Effect<void>
  rpush(key: string, values: ReadonlyArray<Buffer>): Effect.Effect<void>
  set(key: string, value: string): Effect.Effect<void>
  hset(key: string, fields: Record<string, string>): Effect.Effect<void>
  list(key: string): Effect.Effect<ReadonlyArray<Buffer>>
  exists(key: string): Effect.Effect<boolean>
}>()("test/programs/ConcurrencyLimitResume.bytes/Keys") {}

const KeysMemory = Layer.effect(
  Keys,
  Effect.map(MemoryRedis, (redis) =>
    Keys.of({
      flush: Effect.sync(() => redis.flushAll()),
      rpush: (key, values) => Effect.sync(() => void (values.length > 0 && redis.rpush(key, ...values))),
      set: (key, value) => Effect.sync(() => void redis.set(key, value)),
      hset: (key, fields) => Effect.sync(() => void redis.hset(key, fields)),
      list: (key) => Effect.sync(() => redis.lrangeBuffer(key, 0, -1)),
      exists: (key) => Effect.sync(() => redis.exists(key))
    }))
)

const KeysRedis = Layer.effect(
  Keys,
  Effect.map(Redis, ({ client }) =>
    Keys.of({
      flush: Effect.promise(() => client.flushdb()).pipe(Effect.asVoid),
      rpush: (key, values) =>
        Effect.promise(async () => void (values.length > 0 && await client.rpush(key, ...values))),
      set: (key, value) => Effect.promise(() => client.set(key, value)).pipe(Effect.asVoid),
      hset: (key, fields) => Effect.promise(() => client.hset(key, fields)).pipe(Effect.asVoid),
      list: (key) => Effect.promise(() => client.lrangeBuffer(key, 0, -1)),
      exists: (key) => Effect.promise(async () => (await client.exists(key)) === 1)
    }))
)

const onePass = Effect.provideService(CurrentRun, {
  runId: null,
  batch: null,
  dryRun: false,
  budget: Option.some(Duration.millis(500)),
  fence: Option.none()
})

const hex = (bytes: Uint8Array) => Buffer.from(bytes).toString("hex")

const checkCase = (c: Case) =>
  Effect.gen(function*() {
    const keys = yield* Keys
    yield* keys.flush
    const elements = c.elements.map(bytesOf)
    yield* keys.rpush(K.deferred, elements)
    for (let t = 0; t < c.executing; t++) {
      yield* keys.hset(K.executing, { [`host:${t}:x:tid:t${t}`]: String(Date.now() / 1000) })
    }
    yield* keys.set(K.currentLimit, String(c.limit))

    yield* onePass(resumeWorker(W))

    const valid = elements.map((bytes) => Option.isSome(parseDeferred(bytes)))
    // The generator's intent agrees with the decoder: jobs are valid, corrupted ones never are.
    c.elements.forEach((element, i) => {
      if (element.kind === "job") assert.isTrue(valid[i], `job ${i} valid`)
      if (element.kind === "corrupt") assert.isFalse(valid[i], `corrupt ${i} invalid`)
    })
    const queued = (yield* keys.list(queueKey("default"))).toReversed().map((b) =>
      JSON.parse(b.toString("utf8")) as SidekiqJob
    )
    const dead = yield* keys.list(K.dead)
    const deferred = yield* keys.list(K.deferred)

    // Nothing lost, nothing duplicated: taken from the head in order, each to its one place.
    const taken = elements.length - deferred.length
    assert.deepStrictEqual(deferred.map(hex), elements.slice(taken).map(hex), "the rest still deferred, in order")
    const head = elements.slice(0, taken)
    assert.deepStrictEqual(
      dead.map(hex),
      head.filter((_, i) => !valid[i]).map(hex),
      "invalid ones in the dead list, byte for byte"
    )
    const expectedJobs = head.filter((_, i) => valid[i]).map((b) =>
      (JSON.parse(b.toString("utf8")) as { args: Array<unknown> }).args
    )
    assert.deepStrictEqual(
      queued.map((job) => job.args),
      expectedJobs,
      "valid ones in the queue with their stored args, FIFO"
    )
    assert.strictEqual(new Set(queued.map((job) => job.jid)).size, queued.length)
    assert.isFalse(yield* keys.exists(K.journal), "no move journal left")

    // The limit: never more than the free capacity, nothing with the breaker open, and no valid
    // job left behind while capacity remained.
    const capacity = c.limit > 0 ? Math.max(c.limit - c.executing, 0) : c.limit === 0 ? MAX_RESUME_UNLIMITED : 0
    assert.isAtMost(queued.length, capacity)
    if (c.limit < 0) assert.strictEqual(taken, 0)
    const validTotal = valid.filter(Boolean).length
    assert.strictEqual(queued.length, Math.min(capacity, validTotal))
  })

const configFor = { concurrencyLimits: { [W]: { limit: 3, queue: "default" } } }

describe("concurrency-limit-resume over arbitrary bytes (memory)", () => {
  it.effect.prop(
    "every element once: queue, dead list (byte-exact) or still deferred",
    Case,
    (c) => checkCase(c).pipe(Effect.provide(KeysMemory.pipe(Layer.provideMerge(MemoryPlatform(configFor))))),
    { arbitrary: { runs: 200 } }
  )
})

const RedisPlatform = Layer.mergeAll(ConcurrencyLimitsRedis, LeaseRedis, KeysRedis, MetricsPrometheus).pipe(
  Layer.provideMerge(RedisTest),
  Layer.provideMerge(EventLogMemory),
  Layer.provideMerge(SweeperConfig.layerWith(configFor))
)

layer(RedisPlatform, { excludeTestServices: true, timeout: "60 seconds" })(
  "concurrency-limit-resume over arbitrary bytes (real Redis)",
  (it) => {
    it.effect.prop("every element once: queue, dead list (byte-exact) or still deferred", Case, checkCase, {
      arbitrary: { runs: 60 }
    })
  }
)
