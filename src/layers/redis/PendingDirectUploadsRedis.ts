/**
 * PendingDirectUploads on Redis: HLEN, HSCAN … COUNT, HEXISTS, HDEL on GitLab's `pending_direct_uploads`.
 * Fields and values are read as Buffers (`hscanBuffer`) and HEXISTS/HDEL are given the very Buffer
 * read, so a field that is not UTF-8 is neither mangled nor deleted under another name.
 */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Stream from "effect/Stream"
import { PENDING_DIRECT_UPLOADS_KEY, type RawPendingEntry, SCAN_PAGE_SIZE } from "../../domain/DirectUpload.ts"
import { PendingDirectUploads } from "../../services/PendingDirectUploads.ts"
import { SharedStateRedis } from "./Redis.ts"

/** HSCAN replies `[cursor, [field, value, field, value, …]]`. */
const toEntries = (flat: ReadonlyArray<Buffer>): Array<RawPendingEntry> => {
  const entries: Array<RawPendingEntry> = []
  for (let i = 0; i + 1 < flat.length; i += 2) entries.push({ field: flat[i]!, value: flat[i + 1]! })
  return entries
}

const exactly = (bytes: Uint8Array) => Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength)

/**
 * Compare-and-delete for a page: ARGV is field, value, field, value, … (the bytes as read); a field
 * is removed only while its value is still exactly the one read. Lua strings are byte strings, so
 * the comparison is on bytes. Returns 1/0 per pair.
 */
const REMOVE_UNCHANGED = `
local removed = {}
for i = 1, #ARGV, 2 do
  if redis.call("HGET", KEYS[1], ARGV[i]) == ARGV[i + 1] then
    removed[#removed + 1] = redis.call("HDEL", KEYS[1], ARGV[i])
  else
    removed[#removed + 1] = 0
  end
end
return removed
`

export const PendingDirectUploadsRedis = Layer.effect(
  PendingDirectUploads,
  Effect.gen(function*() {
    const redis = yield* SharedStateRedis
    const key = PENDING_DIRECT_UPLOADS_KEY

    const page = (cursor: string, pageSize: number) =>
      redis.use("HSCAN pending_direct_uploads", (client) => client.hscanBuffer(key, cursor, "COUNT", pageSize)).pipe(
        Effect.map(([next, flat]) => {
          const following = next.toString("latin1")
          return [toEntries(flat), following === "0" ? Option.none<string>() : Option.some(following)] as const
        })
      )

    return PendingDirectUploads.of({
      count: redis.use("HLEN pending_direct_uploads", (client) => client.hlen(key)),
      scan: (options) => Stream.paginate("0", (cursor: string) => page(cursor, options?.pageSize ?? SCAN_PAGE_SIZE)),
      exists: Effect.fn("PendingDirectUploads.exists")(function*(field: Uint8Array) {
        const exact = Buffer.from(field.buffer, field.byteOffset, field.byteLength)
        return (yield* redis.use("HEXISTS pending_direct_uploads", (client) => client.hexists(key, exact))) === 1
      }),
      values: Effect.fn("PendingDirectUploads.values")(function*(fields: ReadonlyArray<Uint8Array>) {
        if (fields.length === 0) return []
        const values = yield* redis.use(
          "HMGET pending_direct_uploads",
          (client) => client.hmgetBuffer(key, ...fields.map(exactly))
        )
        return values.map((value) => value ?? null)
      }),
      removeUnchanged: Effect.fn("PendingDirectUploads.removeUnchanged")(
        function*(entries: ReadonlyArray<RawPendingEntry>) {
          if (entries.length === 0) return []
          const args = entries.flatMap(({ field, value }) => [exactly(field), exactly(value)])
          const reply = yield* redis.use(
            "EVAL compare-and-delete pending_direct_uploads",
            (client) => client.eval(REMOVE_UNCHANGED, 1, key, ...args) as Promise<Array<number>>
          )
          return reply.map((n) => n === 1)
        }
      ),
      remove: Effect.fn("PendingDirectUploads.remove")(function*(field: Uint8Array) {
        const exact = Buffer.from(field.buffer, field.byteOffset, field.byteLength)
        return (yield* redis.use("HDEL pending_direct_uploads", (client) => client.hdel(key, exact))) > 0
      })
    })
  })
)
