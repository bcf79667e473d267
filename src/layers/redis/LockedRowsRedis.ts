/**
 * LockedRows on the SharedState Redis: the batch's one hash (`domain/LockedRows.ts`), a skip one
 * script (read, count once per run, refresh; rows no run skipped for a TTL dropped), a pass one HDEL.
 */
import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Schema from "effect/Schema"
import { RedisError } from "../../domain/Errors.ts"
import { countExpired, decodeCount, LOCKED_COUNT_TTL, lockedRowsKey } from "../../domain/LockedRows.ts"
import { LockedRows } from "../../services/LockedRows.ts"
import { SharedStateRedis } from "./Redis.ts"

// `countSkip` and `countExpired` of domain/LockedRows.ts, in one step: ARGV = run, now (ms), TTL
// (ms), ids; returns runs and first (1/0) per id. A field that is no count is taken as none.
const SKIPPED = `
local now, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local function parse(value)
  if not value then return nil end
  local runs, run, at = string.match(value, '^(%d+) (%S+) (%d+)$')
  if not runs then return nil end
  return tonumber(runs), run, tonumber(at)
end
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local _, _, at = parse(all[i + 1])
  if not at or now - at >= ttl then redis.call('HDEL', KEYS[1], all[i]) end
end
local out = {}
for i = 4, #ARGV do
  local runs, run = parse(redis.call('HGET', KEYS[1], ARGV[i]))
  if not runs then runs, run = 0, '' end
  local first = run ~= ARGV[1]
  if first then runs = runs + 1 end
  redis.call('HSET', KEYS[1], ARGV[i], string.format('%d %s %d', runs, ARGV[1], now))
  out[#out + 1] = runs
  out[#out + 1] = first and 1 or 0
end
redis.call('PEXPIRE', KEYS[1], ttl)
return out`

/** The script's reply: runs and first (1/0), a pair per id. */
const SkippedReply = Schema.Array(Schema.Number)

export const LockedRowsRedis = Layer.effect(
  LockedRows,
  Effect.gen(function*() {
    const redis = yield* SharedStateRedis
    const ttlMillis = Duration.toMillis(LOCKED_COUNT_TTL)
    return {
      counted: (batch) =>
        Effect.gen(function*() {
          const fields = yield* redis.use("HGETALL locked rows", (client) => client.hgetall(lockedRowsKey(batch)))
          const now = yield* Clock.currentTimeMillis
          return Object.entries(fields).flatMap(([id, value]) => {
            const count = decodeCount(value)
            return count === undefined || countExpired(count, now) ? [] : [id]
          })
        }),
      skipped: (batch, run, ids) =>
        ids.length === 0 ? Effect.succeed([]) : Effect.gen(function*() {
          const now = Math.floor(yield* Clock.currentTimeMillis)
          const reply = yield* redis.use(
            "locked rows skipped",
            (client) => client.eval(SKIPPED, 1, lockedRowsKey(batch), run, now, ttlMillis, ...ids.map(String))
          )
          const pairs = yield* Schema.decodeUnknownEffect(SkippedReply)(reply).pipe(
            Effect.mapError((cause) => new RedisError({ operation: "locked rows skipped", cause }))
          )
          return ids.map((_, i) => ({ runs: pairs[2 * i] ?? 0, first: pairs[2 * i + 1] === 1 }))
        }),
      passed: (batch, ids) =>
        ids.length === 0
          ? Effect.void
          : Effect.asVoid(
            redis.use("HDEL locked rows", (client) => client.hdel(lockedRowsKey(batch), ...ids.map(String)))
          )
    }
  })
)
