/** PendingDirectUploads over the in-memory Redis, same key, paging and bytes as PendingDirectUploadsRedis. */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Stream from "effect/Stream"
import { PENDING_DIRECT_UPLOADS_KEY, SCAN_PAGE_SIZE } from "../../domain/DirectUpload.ts"
import { RedisError } from "../../domain/Errors.ts"
import { PendingDirectUploads } from "../../services/PendingDirectUploads.ts"
import { MemoryRedis } from "./MemoryRedis.ts"

export const PendingDirectUploadsMemory = Layer.effect(
  PendingDirectUploads,
  Effect.gen(function*() {
    const store = yield* MemoryRedis
    const key = PENDING_DIRECT_UPLOADS_KEY
    // The store throws Redis's own words (e.g. WRONGTYPE) for a key of another type: a RedisError here too.
    const attempt = <A>(operation: string, f: () => A) =>
      Effect.try({ try: f, catch: (cause) => new RedisError({ operation, cause }) })
    return PendingDirectUploads.of({
      count: attempt("HLEN pending_direct_uploads", () => store.hlen(key)),
      scan: (options) =>
        Stream.paginate("0", (cursor: string) =>
          attempt("HSCAN pending_direct_uploads", () => {
            const [next, page] = store.hscanBuffer(key, cursor, options?.pageSize ?? SCAN_PAGE_SIZE)
            return [
              page.map(([field, value]) => ({ field, value })),
              next === "0" ? Option.none<string>() : Option.some(next)
            ] as const
          })),
      exists: (field) => attempt("HEXISTS pending_direct_uploads", () => store.hget(key, field) !== null),
      values: (fields) =>
        attempt("HMGET pending_direct_uploads", () => fields.map((field) => store.hgetBuffer(key, field))),
      // One synchronous step, like the Lua script on Redis: nothing runs between the compare and the delete.
      removeUnchanged: (entries) =>
        attempt("EVAL compare-and-delete pending_direct_uploads", () =>
          entries.map(({ field, value }) => {
            const current = store.hgetBuffer(key, field)
            return current !== null && current.equals(value) && store.hdel(key, field) > 0
          })),
      remove: (field) => attempt("HDEL pending_direct_uploads", () => store.hdel(key, field) > 0)
    })
  })
)
