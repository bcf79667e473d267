/**
 * One contract for JobStatus, run against the memory implementation (MemoryRedis, TestClock) and
 * the real one (a fresh Redis database). Expiry is driven by `expire`, so each backend ages its keys
 * the way it really can.
 */
import { assert, describe, it } from "@effect/vitest"
import { Context, Duration, Effect, Layer } from "effect"
import { TestClock } from "effect/testing"
import { DEFAULT_JOB_STATUS_TTL, EXPORT_JOB_STATUS_TTL, jobStatusKey } from "../../src/domain/SidekiqStatus.ts"
import { JobStatusMemory } from "../../src/layers/memory/JobStatusMemory.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { JobStatusRedis } from "../../src/layers/redis/JobStatusRedis.ts"
import { QueuesMetadataRedis, Redis } from "../../src/layers/redis/Redis.ts"
import { JobStatus } from "../../src/services/JobStatus.ts"
import { RedisTest } from "../support/redis.ts"
import { RedisTopologyTest, scanKeys, topologies } from "../support/redisTopology.ts"

/** What the contract needs from a backend besides the service: raw key access and a way to age keys. */
class Backend extends Context.Service<Backend, {
  readonly ttlOf: (key: string) => Effect.Effect<number>
  readonly exists: (key: string) => Effect.Effect<boolean>
  /** Lets `seconds` pass for the keys' TTLs. */
  readonly elapse: (seconds: number) => Effect.Effect<void>
}>()("test/layers/JobStatus/Backend") {}

const MemoryBackend = Layer.effect(
  Backend,
  Effect.gen(function*() {
    const store = yield* MemoryRedis
    return Backend.of({
      ttlOf: (key) => Effect.sync(() => Math.round(store.pttl(key) / 1000)),
      exists: (key) => Effect.sync(() => store.exists(key)),
      elapse: (seconds) => TestClock.adjust(Duration.seconds(seconds))
    })
  })
)

/** Real Redis expires on its own clock: shorten the TTLs instead of waiting. */
const RedisBackend = Layer.effect(
  Backend,
  Effect.gen(function*() {
    const redis = yield* QueuesMetadataRedis
    const prefix = jobStatusKey("")
    return Backend.of({
      ttlOf: (key) => Effect.orDie(redis.use("ttl", (c) => c.ttl(key))),
      exists: (key) => Effect.orDie(redis.use("exists", (c) => c.exists(key))).pipe(Effect.map((n) => n === 1)),
      elapse: (seconds) =>
        Effect.orDie(redis.use("elapse", async (c) => {
          for (const key of await scanKeys(c, `${prefix}*`)) {
            const ttl = await c.pttl(key)
            if (ttl < 0) continue
            if (ttl <= seconds * 1000) await c.del(key)
            else await c.pexpire(key, ttl - seconds * 1000)
          }
        }))
    })
  })
)

const contract = (name: string, layer: () => Layer.Layer<JobStatus | Backend>) =>
  describe(`JobStatus contract: ${name}`, () => {
    const test = (title: string, body: Effect.Effect<void, unknown, JobStatus | Backend>) =>
      it.effect(title, () => body.pipe(Effect.provide(layer())))

    test(
      "track writes gitlab-sidekiq-status:<jid> = 1 with the TTL asked for",
      Effect.gen(function*() {
        const status = yield* JobStatus
        const backend = yield* Backend
        yield* status.track("default", DEFAULT_JOB_STATUS_TTL)
        yield* status.track("export", EXPORT_JOB_STATUS_TTL)
        assert.isTrue(yield* backend.exists(jobStatusKey("default")))
        assert.strictEqual(yield* backend.ttlOf(jobStatusKey("default")), 1800)
        assert.strictEqual(yield* backend.ttlOf(jobStatusKey("export")), 21600)
      })
    )

    test(
      "absent (never tracked) and untracked jids are completed; tracked ones are not",
      Effect.gen(function*() {
        const status = yield* JobStatus
        yield* status.track("running", DEFAULT_JOB_STATUS_TTL)
        yield* status.track("finished", DEFAULT_JOB_STATUS_TTL)
        yield* status.untrack("finished")
        assert.deepStrictEqual(yield* status.completedJids(["never", "running", "finished"]), ["never", "finished"])
      })
    )

    test(
      "an expired key counts as completed, one about to expire does not",
      Effect.gen(function*() {
        const status = yield* JobStatus
        const backend = yield* Backend
        yield* status.track("short", Duration.seconds(60))
        yield* status.track("long", Duration.seconds(120))
        yield* backend.elapse(59)
        assert.deepStrictEqual(yield* status.completedJids(["short", "long"]), [])
        yield* backend.elapse(2)
        assert.deepStrictEqual(yield* status.completedJids(["short", "long"]), ["short"])
      })
    )

    test(
      "keeps the input order",
      Effect.gen(function*() {
        const status = yield* JobStatus
        yield* status.track("b", DEFAULT_JOB_STATUS_TTL)
        assert.deepStrictEqual(yield* status.completedJids(["z", "b", "a", "m"]), ["z", "a", "m"])
        assert.deepStrictEqual(yield* status.completedJids(["m", "a", "b", "z"]), ["m", "a", "z"])
      })
    )

    test(
      "empty input gives empty output",
      Effect.gen(function*() {
        const status = yield* JobStatus
        assert.deepStrictEqual(yield* status.completedJids([]), [])
      })
    )

    test(
      "2500 jids (more than one look-up slice): exactly the untracked ones, in order",
      Effect.gen(function*() {
        const status = yield* JobStatus
        const jids = Array.from({ length: 2500 }, (_, i) => `jid-${String(i).padStart(4, "0")}`)
        const tracked = new Set(jids.filter((_, i) => i % 3 === 0 || i === 999 || i === 1000 || i === 2499))
        yield* Effect.forEach([...tracked], (jid) => status.track(jid, EXPORT_JOB_STATUS_TTL), {
          concurrency: 50,
          discard: true
        })
        const completed = yield* status.completedJids(jids)
        assert.deepStrictEqual(completed, jids.filter((jid) => !tracked.has(jid)))
      })
    )
  })

contract("memory", () => Layer.mergeAll(JobStatusMemory, MemoryBackend).pipe(Layer.provideMerge(MemoryRedis.layer)))
for (const topology of topologies) {
  contract(
    `redis ${topology}`,
    () => Layer.mergeAll(JobStatusRedis, RedisBackend).pipe(Layer.provideMerge(RedisTopologyTest(topology)))
  )
}

/** Counts the commands sent through the Redis service, by operation name. */
/** Counts `use` calls (each awaits its replies: one round trip) and the client commands inside them. */
const countingRedis = (calls: Array<string>, commands: Array<string>) =>
  Layer.effect(
    QueuesMetadataRedis,
    Effect.map(Redis, (redis) =>
      QueuesMetadataRedis.of({
        ...redis,
        use: (operation, f) =>
          Effect.suspend(() => {
            calls.push(operation)
            return redis.use(operation, (client) =>
              f(
                new Proxy(client, {
                  get: (target, property) => {
                    const value = Reflect.get(target, property, target)
                    if (typeof value !== "function") return value
                    return (...args: Array<unknown>) => {
                      commands.push(String(property))
                      return value.apply(target, args)
                    }
                  }
                })
              ))
          })
      }))
  ).pipe(Layer.provide(RedisTest))

describe("JobStatusRedis round trips", () => {
  it.effect("empty input makes no Redis call; 2500 jids are three MGETs sent together; 25,000 two windows of MGETs", () => {
    const calls: Array<string> = []
    const commands: Array<string> = []
    return Effect.gen(function*() {
      const status = yield* JobStatus
      assert.deepStrictEqual(yield* status.completedJids([]), [])
      assert.deepStrictEqual(calls, [])
      const jids = Array.from({ length: 2500 }, (_, i) => `jid-${i}`)
      assert.lengthOf(yield* status.completedJids(jids), 2500)
      assert.deepStrictEqual(calls, ["jobStatus.mget"])
      assert.deepStrictEqual(commands, ["mget", "mget", "mget"])
      calls.length = 0
      commands.length = 0
      // Two still have their status key, in different windows: replies are matched to their jids.
      const many = Array.from({ length: 25_000 }, (_, i) => `jid-${i}`)
      yield* status.track(many[7_000]!, Duration.minutes(5))
      yield* status.track(many[21_001]!, Duration.minutes(5))
      calls.length = 0
      commands.length = 0
      const completed = yield* status.completedJids(many)
      assert.strictEqual(completed.length, 24_998)
      assert.notInclude(completed, many[7_000])
      assert.notInclude(completed, many[21_001])
      assert.deepStrictEqual(completed.slice(6_999, 7_001), [many[6_999], many[7_001]])
      assert.deepStrictEqual(calls, ["jobStatus.mget", "jobStatus.mget"])
      assert.lengthOf(commands, 25)
      assert.isTrue(commands.every((command) => command === "mget"))
    }).pipe(Effect.provide(JobStatusRedis.pipe(Layer.provide(countingRedis(calls, commands)))))
  })
})
