/** PendingDirectUploads over the in-memory Redis, same key and paging as PendingDirectUploadsRedis. */
import { Effect, Layer, Option, Stream } from "effect"
import { PENDING_DIRECT_UPLOADS_KEY, SCAN_PAGE_SIZE } from "../../domain/DirectUpload.ts"
import { PendingDirectUploads } from "../../services/PendingDirectUploads.ts"
import { MemoryRedis } from "./MemoryRedis.ts"

export const PendingDirectUploadsMemory = Layer.effect(
  PendingDirectUploads,
  Effect.gen(function*() {
    const store = yield* MemoryRedis
    const key = PENDING_DIRECT_UPLOADS_KEY
    return PendingDirectUploads.of({
      count: Effect.sync(() => store.hlen(key)),
      scan: (options) =>
        Stream.paginate("0", (cursor: string) =>
          Effect.sync(() => {
            const [next, page] = store.hscan(key, cursor, options?.pageSize ?? SCAN_PAGE_SIZE)
            return [
              page.map(([field, value]) => ({ field, value })),
              next === "0" ? Option.none<string>() : Option.some(next)
            ] as const
          })),
      exists: (field) => Effect.sync(() => store.hget(key, field) !== null),
      remove: (field) => Effect.sync(() => store.hdel(key, field) > 0)
    })
  })
)
