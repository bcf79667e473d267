/**
 * ConcurrencyLimits over the in-memory Redis, same keys and bytes as ConcurrencyLimitsRedis: the
 * shared `makeConcurrencyLimits` over MemoryRedis commands. Each protocol step is one synchronous
 * step, which is what its Lua script is on Redis; the steps stay separate, as on split stores, so
 * the crash tests exercise the same protocol here. A command the in-memory Redis refuses (WRONGTYPE)
 * fails as a RedisError, as on Redis.
 */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { SweeperConfig } from "../../config/Config.ts"
import { processWorkKey } from "../../domain/ConcurrencyLimit.ts"
import { RedisError } from "../../domain/Errors.ts"
import { queueKey, QUEUES_SET } from "../../domain/Sidekiq.ts"
import { ConcurrencyLimits } from "../../services/ConcurrencyLimits.ts"
import { type ConcurrencyLimitStore, makeConcurrencyLimits } from "../protocols/ConcurrencyLimitsShared.ts"
import { MemoryRedis, type MemoryRedisStore } from "./MemoryRedis.ts"

const command = <A>(operation: string, f: () => A): Effect.Effect<A, RedisError> =>
  Effect.try({ try: f, catch: (cause) => new RedisError({ operation, cause }) })

const sameBytes = (a: Uint8Array, b: Uint8Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(b)

/** The primitives over the in-memory store (exported for the contract suite's fault injection). */
export const makeMemoryStore = (redis: MemoryRedisStore): ConcurrencyLimitStore => ({
  scan: (cursor, match, count) => command("concurrency_limit.scan", () => redis.scan(cursor, match, count)),
  llen: (key) => command("concurrency_limit.llen", () => redis.llen(key)),
  lrange: (key, start, stop) => command("concurrency_limit.lrange", () => redis.lrangeBuffer(key, start, stop)),
  beginMove: ({ deadTtlSeconds, expected, header, journalTtlSeconds, keys, payloads }) =>
    command("concurrency_limit.begin_move", () => {
      if (redis.exists(keys.journal)) return "busy" as const
      const head = redis.lrangeBuffer(keys.deferred, 0, expected.length - 1)
      if (head.length !== expected.length || head.some((element, i) => !sameBytes(element, expected[i]!))) {
        return "changed" as const
      }
      redis.ltrimFrom(keys.deferred, expected.length)
      const jobs = payloads.filter((payload) => payload !== null)
      head.forEach((element, i) => {
        if (payloads[i] === null) {
          redis.rpush(keys.dead, element)
          redis.expire(keys.dead, deadTtlSeconds)
        }
      })
      redis.rpush(keys.journal, header, ...jobs)
      redis.expire(keys.journal, journalTtlSeconds)
      return "moved" as const
    }),
  endMove: (journalKey, header) =>
    command("concurrency_limit.end_move", () => {
      const first = redis.lrangeBuffer(journalKey, 0, 0)[0]
      return first !== undefined && sameBytes(first, header) && redis.del(journalKey) === 1
    }),
  buryJournal: (journalKey, deadKey, header, deadTtlSeconds) =>
    command("concurrency_limit.bury_journal", () => {
      const all = redis.lrangeBuffer(journalKey, 0, -1)
      if (all[0] === undefined || !sameBytes(all[0], header)) return false
      redis.rpush(deadKey, ...all)
      redis.expire(deadKey, deadTtlSeconds)
      redis.del(journalKey)
      return true
    }),
  get: (key) => command("concurrency_limit.get", () => redis.get(key)),
  hlen: (key) => command("concurrency_limit.hlen", () => redis.hlen(key)),
  hscan: (key, cursor, count) => command("concurrency_limit.hscan", () => redis.hscanBuffer(key, cursor, count)),
  hdelIfEquals: (key, field, value) =>
    command("concurrency_limit.hdel_if_equals", () => {
      const held = redis.hgetBuffer(key, field)
      return held !== null && sameBytes(held, value) && redis.hdel(key, field) === 1
    }),
  reserve: (key, count, ttlSeconds) =>
    command("concurrency_limit.reserve", () => {
      redis.incrBy(key, count)
      redis.expire(key, ttlSeconds)
    }),
  processWork: (pid, tid) => command("concurrency_limit.process_work", () => redis.hget(processWorkKey(pid), tid)),
  registerQueue: (queue) => command("concurrency_limit.register_queue", () => void redis.sadd(QUEUES_SET, queue)),
  push: (queue, marker, payloads, ttlSeconds) =>
    command("concurrency_limit.push", () => {
      if (!redis.set(marker, "1", { nx: true, exSeconds: ttlSeconds })) return false
      for (const payload of payloads) redis.lpush(queueKey(queue), payload)
      return true
    }),
  forgetMarker: (marker) => command("concurrency_limit.forget_marker", () => void redis.del(marker))
})

export const ConcurrencyLimitsMemory = Layer.effect(
  ConcurrencyLimits,
  Effect.gen(function*() {
    const { concurrencyLimits } = yield* SweeperConfig
    return makeConcurrencyLimits(makeMemoryStore(yield* MemoryRedis), concurrencyLimits)
  })
)
