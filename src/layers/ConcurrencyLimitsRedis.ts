/**
 * ConcurrencyLimits on real Redis. Reads are plain commands (SCAN with MATCH/COUNT, never KEYS); the
 * two writes are Lua scripts, so each is one atomic step on the server:
 *
 * - MOVE is compare-and-move: it pops the head of the deferred list only if the head is still exactly
 *   what we read and decided on, and in the same step pushes the jobs, the dead elements, the queue
 *   name and the reserved slots. A process dying before it moved nothing; after it, everything. Jobs
 *   that GitLab RPUSHes to the tail meanwhile are not part of the head, so they stay.
 *   (The jobs are built in TypeScript from Schema-decoded elements, not with cjson inside Redis:
 *   cjson turns `[]` into `{}` and rounds numbers to 14 digits, which would corrupt args.)
 * - HDEL_IF_EQUALS removes a stale tracker only if it still holds the start time we judged stale.
 */
import { Effect, Layer } from "effect"
import { queueKey, QUEUES_SET } from "../domain/Sidekiq.ts"
import { type ConcurrencyLimitStore, ConcurrencyLimits, makeConcurrencyLimits, type PreparedMove } from "../services/ConcurrencyLimits.ts"
import { SweeperConfig } from "./Config.ts"
import { Redis } from "./Redis.ts"

// KEYS: deferred list, queue:<queue>, queues, pending_resumed, dead list
// ARGV: queue name, pending TTL seconds, n, expected[1..n], payload[1..n] ('' = dead)
export const MOVE = `
local n = tonumber(ARGV[3])
local head = redis.call('LRANGE', KEYS[1], 0, n - 1)
if #head ~= n then return -1 end
for i = 1, n do
  if head[i] ~= ARGV[3 + i] then return -1 end
end
redis.call('LTRIM', KEYS[1], n, -1)
local resumed = 0
for i = 1, n do
  local payload = ARGV[3 + n + i]
  if payload == '' then
    redis.call('RPUSH', KEYS[5], head[i])
  else
    redis.call('LPUSH', KEYS[2], payload)
    resumed = resumed + 1
  end
end
if resumed > 0 then
  redis.call('SADD', KEYS[3], ARGV[1])
  redis.call('INCRBY', KEYS[4], resumed)
  redis.call('EXPIRE', KEYS[4], ARGV[2])
end
return resumed`

export const HDEL_IF_EQUALS = `
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0`

/** The primitives over an ioredis connection (exported for the contract suite's fault injection). */
export const makeRedisStore = (redis: Redis["Service"]): ConcurrencyLimitStore => ({
  scan: (cursor, match, count) =>
    redis.use("concurrency_limit.scan", (client) => client.scan(cursor, "MATCH", match, "COUNT", count)),
  get: (key) => redis.use("concurrency_limit.get", (client) => client.get(key)),
  llen: (key) => redis.use("concurrency_limit.llen", (client) => client.llen(key)),
  lrange: (key, start, stop) => redis.use("concurrency_limit.lrange", (client) => client.lrange(key, start, stop)),
  hlen: (key) => redis.use("concurrency_limit.hlen", (client) => client.hlen(key)),
  hscan: (key, cursor, count) =>
    Effect.map(redis.use("concurrency_limit.hscan", (client) => client.hscan(key, cursor, "COUNT", count)), ([next, flat]) => {
      const entries: Array<readonly [string, string]> = []
      for (let i = 0; i + 1 < flat.length; i += 2) entries.push([flat[i]!, flat[i + 1]!])
      return [next, entries] as const
    }),
  hget: (key, field) => redis.use("concurrency_limit.hget", (client) => client.hget(key, field)),
  hdelIfEquals: (key, field, value) =>
    Effect.map(
      redis.use("concurrency_limit.hdel_if_equals", (client) =>
        client.eval(HDEL_IF_EQUALS, 1, key, field, value) as Promise<number>),
      (n) => n === 1
    ),
  move: (prepared: PreparedMove) =>
    Effect.map(
      redis.use("concurrency_limit.move", (client) =>
        client.eval(
          MOVE,
          5,
          prepared.keys.deferred,
          queueKey(prepared.queue),
          QUEUES_SET,
          prepared.keys.pendingResumed,
          prepared.keys.dead,
          prepared.queue,
          prepared.pendingResumedTtlSeconds,
          prepared.expected.length,
          ...prepared.expected,
          ...prepared.payloads.map((payload) => payload ?? "")
        ) as Promise<number>),
      (reply) => reply >= 0
    )
})

export const ConcurrencyLimitsRedis = Layer.effect(
  ConcurrencyLimits,
  Effect.gen(function*() {
    const { concurrencyLimits } = yield* SweeperConfig
    return makeConcurrencyLimits(makeRedisStore(yield* Redis), concurrencyLimits)
  })
)
