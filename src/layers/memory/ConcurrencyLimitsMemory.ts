/**
 * ConcurrencyLimits over the in-memory Redis, same keys and bytes as ConcurrencyLimitsRedis: the
 * shared `makeConcurrencyLimits` over MemoryRedis commands. The compare-and-move and
 * compare-and-delete are one synchronous step each, which is what the Lua scripts are on Redis.
 */
import { Effect, Layer } from "effect"
import { queueKey, QUEUES_SET } from "../../domain/Sidekiq.ts"
import { type ConcurrencyLimitStore, ConcurrencyLimits, makeConcurrencyLimits } from "../../services/ConcurrencyLimits.ts"
import { SweeperConfig } from "../Config.ts"
import { MemoryRedis, type MemoryRedisStore } from "./MemoryRedis.ts"

/** The primitives over the in-memory store (exported for the contract suite's fault injection). */
export const makeMemoryStore = (redis: MemoryRedisStore): ConcurrencyLimitStore => ({
  scan: (cursor, match, count) => Effect.sync(() => redis.scan(cursor, match, count)),
  get: (key) => Effect.sync(() => redis.get(key)),
  llen: (key) => Effect.sync(() => redis.llen(key)),
  lrange: (key, start, stop) => Effect.sync(() => redis.lrange(key, start, stop)),
  hlen: (key) => Effect.sync(() => redis.hlen(key)),
  hscan: (key, cursor, count) => Effect.sync(() => redis.hscan(key, cursor, count)),
  hget: (key, field) => Effect.sync(() => redis.hget(key, field)),
  hdelIfEquals: (key, field, value) => Effect.sync(() => redis.hget(key, field) === value && redis.hdel(key, field) === 1),
  move: ({ keys, queue, expected, payloads, pendingResumedTtlSeconds }) =>
    Effect.sync(() => {
      const head = redis.lrange(keys.deferred, 0, expected.length - 1)
      if (head.length !== expected.length || head.some((element, i) => element !== expected[i])) return false
      redis.lpop(keys.deferred, expected.length)
      let resumed = 0
      head.forEach((element, i) => {
        const payload = payloads[i]
        if (payload === null || payload === undefined) {
          redis.rpush(keys.dead, element)
        } else {
          redis.lpush(queueKey(queue), payload)
          resumed++
        }
      })
      if (resumed > 0) {
        redis.sadd(QUEUES_SET, queue)
        redis.incrBy(keys.pendingResumed, resumed)
        redis.expire(keys.pendingResumed, pendingResumedTtlSeconds)
      }
      return true
    })
})

export const ConcurrencyLimitsMemory = Layer.effect(
  ConcurrencyLimits,
  Effect.gen(function*() {
    const { concurrencyLimits } = yield* SweeperConfig
    return makeConcurrencyLimits(makeMemoryStore(yield* MemoryRedis), concurrencyLimits)
  })
)
