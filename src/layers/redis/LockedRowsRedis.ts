/** LockedRows on the SharedState Redis: one INCR and EXPIRE per row, in one pipelined round trip. */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { LOCKED_COUNT_TTL, lockedRowKey } from "../../domain/LockedRows.ts"
import { LockedRows } from "../../services/LockedRows.ts"
import { SharedStateRedis } from "./Redis.ts"

export const LockedRowsRedis = Layer.effect(
  LockedRows,
  Effect.gen(function*() {
    const redis = yield* SharedStateRedis
    const ttl = Duration.toSeconds(LOCKED_COUNT_TTL)
    return {
      skipped: (batch, ids) =>
        ids.length === 0 ? Effect.succeed([]) : redis.use("INCR locked rows", async (client) => {
          const pipeline = client.pipeline()
          for (const id of ids) pipeline.incr(lockedRowKey(batch, id)).expire(lockedRowKey(batch, id), ttl)
          const replies = (await pipeline.exec()) ?? []
          const failed = replies.find(([error]) => error !== null)
          if (failed !== undefined) throw failed[0]
          return ids.map((_, i) => Number(replies[2 * i]![1]))
        })
    }
  })
)
