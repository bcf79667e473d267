/**
 * PendingDirectUploads on Redis: HLEN, HSCAN … COUNT, HEXISTS, HDEL on GitLab's `pending_direct_uploads`.
 * Fields and values are read as Buffers (`hscanBuffer`) and HEXISTS/HDEL are given the very Buffer
 * read, so a field that is not UTF-8 is neither mangled nor deleted under another name.
 */
import { Effect, Layer, Option, Stream } from "effect"
import { PENDING_DIRECT_UPLOADS_KEY, type RawPendingEntry, SCAN_PAGE_SIZE } from "../domain/DirectUpload.ts"
import { PendingDirectUploads } from "../services/PendingDirectUploads.ts"
import { SharedStateRedis } from "./Redis.ts"

/** HSCAN replies `[cursor, [field, value, field, value, …]]`. */
const toEntries = (flat: ReadonlyArray<Buffer>): Array<RawPendingEntry> => {
  const entries: Array<RawPendingEntry> = []
  for (let i = 0; i + 1 < flat.length; i += 2) entries.push({ field: flat[i]!, value: flat[i + 1]! })
  return entries
}

export const PendingDirectUploadsRedis = Layer.effect(
  PendingDirectUploads,
  Effect.gen(function*() {
    const redis = yield* SharedStateRedis
    const key = PENDING_DIRECT_UPLOADS_KEY

    const page = (cursor: string, pageSize: number) =>
      redis.use("HSCAN pending_direct_uploads", (client) => client.hscanBuffer(key, cursor, "COUNT", pageSize)).pipe(
        Effect.map(([next, flat]) => {
          const cursor = next.toString("latin1")
          return [toEntries(flat), cursor === "0" ? Option.none<string>() : Option.some(cursor)] as const
        })
      )

    return PendingDirectUploads.of({
      count: redis.use("HLEN pending_direct_uploads", (client) => client.hlen(key)),
      scan: (options) => Stream.paginate("0", (cursor: string) => page(cursor, options?.pageSize ?? SCAN_PAGE_SIZE)),
      exists: Effect.fn("PendingDirectUploads.exists")(function*(field: Uint8Array) {
        const exact = Buffer.from(field.buffer, field.byteOffset, field.byteLength)
        return (yield* redis.use("HEXISTS pending_direct_uploads", (client) => client.hexists(key, exact))) === 1
      }),
      remove: Effect.fn("PendingDirectUploads.remove")(function*(field: Uint8Array) {
        const exact = Buffer.from(field.buffer, field.byteOffset, field.byteLength)
        return (yield* redis.use("HDEL pending_direct_uploads", (client) => client.hdel(key, exact))) > 0
      })
    })
  })
)
