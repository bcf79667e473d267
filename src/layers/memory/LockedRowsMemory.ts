/** LockedRows over the in-memory Redis: the same hash, fields and rules (`domain/LockedRows.ts`) as LockedRowsRedis. */
import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import {
  countExpired,
  countSkip,
  decodeCount,
  encodeCount,
  LOCKED_COUNT_TTL,
  lockedRowsKey
} from "../../domain/LockedRows.ts"
import { LockedRows } from "../../services/LockedRows.ts"
import { MemoryRedis } from "./MemoryRedis.ts"

export const LockedRowsMemory = Layer.effect(
  LockedRows,
  Effect.gen(function*() {
    const store = yield* MemoryRedis
    const ttlSeconds = Duration.toSeconds(LOCKED_COUNT_TTL)
    /** The live rows' ids; a field past its TTL (or no count) is no row. */
    const live = (batch: string, now: number) =>
      Object.entries(store.hgetall(lockedRowsKey(batch))).flatMap(([id, value]) => {
        const count = decodeCount(value)
        return count === undefined || countExpired(count, now) ? [] : [id]
      })
    return {
      counted: (batch) => Effect.map(Clock.currentTimeMillis, (now) => live(batch, now)),
      skipped: (batch, run, ids) =>
        ids.length === 0 ? Effect.succeed([]) : Effect.map(Clock.currentTimeMillis, (now) => {
          const key = lockedRowsKey(batch)
          const kept = new Set(live(batch, now))
          const stale = Object.keys(store.hgetall(key)).filter((id) => !kept.has(id))
          if (stale.length > 0) store.hdel(key, ...stale)
          const answers = ids.map((id) => {
            const { count, first } = countSkip(decodeCount(store.hget(key, String(id))), run, now)
            store.hset(key, { [String(id)]: encodeCount(count) })
            return { runs: count.runs, first }
          })
          store.expire(key, ttlSeconds)
          return answers
        }),
      passed: (batch, ids) =>
        Effect.sync(() => {
          if (ids.length > 0) store.hdel(lockedRowsKey(batch), ...ids.map(String))
        })
    }
  })
)
