/** LockedRows over the in-memory Redis, same keys and TTL as LockedRowsRedis. */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { LOCKED_COUNT_TTL, lockedRowKey } from "../../domain/LockedRows.ts"
import { LockedRows } from "../../services/LockedRows.ts"
import { MemoryRedis } from "./MemoryRedis.ts"

export const LockedRowsMemory = Layer.effect(
  LockedRows,
  Effect.gen(function*() {
    const store = yield* MemoryRedis
    const exSeconds = Duration.toSeconds(LOCKED_COUNT_TTL)
    return {
      skipped: (batch, ids) =>
        Effect.sync(() =>
          ids.map((id) => {
            const count = Number(store.get(lockedRowKey(batch, id)) ?? 0) + 1
            store.set(lockedRowKey(batch, id), String(count), { exSeconds })
            return count
          })
        )
    }
  })
)
