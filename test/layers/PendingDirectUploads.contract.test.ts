/**
 * One contract for PendingDirectUploads, run against the in-memory Redis and a real Redis server:
 * the same seeding (GitLab's `pending_direct_uploads` hash), the same expectations.
 */
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Layer, Stream } from "effect"
import { PENDING_DIRECT_UPLOADS_KEY } from "../../src/domain/DirectUpload.ts"
import { isTransient, RedisError } from "../../src/domain/Errors.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { PendingDirectUploadsMemory } from "../../src/layers/memory/PendingDirectUploadsMemory.ts"
import { PendingDirectUploadsRedis } from "../../src/layers/redis/PendingDirectUploadsRedis.ts"
import { SharedStateRedis } from "../../src/layers/redis/Redis.ts"
import { PendingDirectUploads } from "../../src/services/PendingDirectUploads.ts"
import { RedisTopologyTest, topologies } from "../support/redisTopology.ts"

/** Direct access to the hash, behind the service's back (as GitLab's Rails side would write it). */
class Hash extends Context.Service<Hash, {
  set(fields: Record<string, string>): Effect.Effect<void>
  /** Replaces the hash by a string key (a wrong type). */
  setString(value: string): Effect.Effect<void>
  setBytes(entries: ReadonlyArray<readonly [Uint8Array, Uint8Array]>): Effect.Effect<void>
  all: Effect.Effect<Record<string, string>>
  /** Every field and value as hex, so bytes compare exactly. */
  allHex: Effect.Effect<Record<string, string>>
}>()("test/layers/PendingDirectUploads/Hash") {}

const hex = (bytes: Uint8Array) => Buffer.from(bytes).toString("hex")
const utf8 = (text: string) => new TextEncoder().encode(text)
const text = (bytes: Uint8Array) => new TextDecoder().decode(bytes)
const hexRecord = (entries: ReadonlyArray<readonly [Uint8Array, Uint8Array]>) =>
  Object.fromEntries(entries.map(([field, value]) => [hex(field), hex(value)]))

const backends: Record<string, Layer.Layer<PendingDirectUploads | Hash>> = {
  memory: PendingDirectUploadsMemory.pipe(
    Layer.merge(Layer.effect(
      Hash,
      Effect.map(MemoryRedis, (store) =>
        Hash.of({
          set: (fields) => Effect.sync(() => void store.hset(PENDING_DIRECT_UPLOADS_KEY, fields)),
          setString: (value) => Effect.sync(() => void store.set(PENDING_DIRECT_UPLOADS_KEY, value)),
          setBytes: (entries) => Effect.sync(() => void store.hset(PENDING_DIRECT_UPLOADS_KEY, entries)),
          all: Effect.sync(() => store.hgetall(PENDING_DIRECT_UPLOADS_KEY)),
          allHex: Effect.sync(() => hexRecord(store.hgetallBuffer(PENDING_DIRECT_UPLOADS_KEY)))
        }))
    )),
    Layer.provideMerge(MemoryRedis.layer)
  ),
  ...Object.fromEntries(topologies.map((topology) => [
    `redis ${topology}`,
    PendingDirectUploadsRedis.pipe(
      Layer.merge(Layer.effect(
        Hash,
        Effect.map(SharedStateRedis, (redis) =>
          Hash.of({
            set: (fields) => Effect.orDie(redis.use("HSET", (c) => c.hset(PENDING_DIRECT_UPLOADS_KEY, fields))),
            setString: (value) => Effect.orDie(redis.use("SET", (c) => c.set(PENDING_DIRECT_UPLOADS_KEY, value))),
            setBytes: (entries) =>
              Effect.orDie(
                redis.use("HSET", (c) =>
                  c.hset(
                    PENDING_DIRECT_UPLOADS_KEY,
                    new Map(entries.map(([f, v]) => [Buffer.from(f), Buffer.from(v)]))
                  ))
              ),
            all: Effect.orDie(redis.use("HGETALL", (c) => c.hgetall(PENDING_DIRECT_UPLOADS_KEY))),
            // ioredis's hgetallBuffer decodes the fields (object keys); the raw reply keeps them as bytes.
            allHex: Effect.orDie(redis.use("HGETALL", async (c) => {
              const flat = (await c.callBuffer("HGETALL", PENDING_DIRECT_UPLOADS_KEY)) as Array<Buffer>
              return hexRecord(flat.flatMap((field, i) => (i % 2 === 0 ? [[field, flat[i + 1]!] as const] : [])))
            }))
          }))
      )),
      Layer.provideMerge(RedisTopologyTest(topology))
    )
  ]))
}

const fieldsOf = (n: number) =>
  Object.fromEntries(Array.from({ length: n }, (_, i) => [`artifacts:tmp/uploads/${i}`, String(1_700_000_000 + i)]))

for (const [name, backend] of Object.entries(backends)) {
  describe(`PendingDirectUploads contract (${name})`, () => {
    it.effect("empty hash: count 0, scan yields nothing, remove finds nothing", () =>
      Effect.gen(function*() {
        const pending = yield* PendingDirectUploads
        assert.strictEqual(yield* pending.count, 0)
        assert.deepStrictEqual(yield* Stream.runCollect(pending.scan()), [])
        assert.isFalse(yield* pending.remove(utf8("artifacts:nothing")))
      }).pipe(Effect.provide(backend)))

    it.effect("count is HLEN, scan returns fields and values verbatim, exists is HEXISTS, remove is HDEL", () =>
      Effect.gen(function*() {
        const pending = yield* PendingDirectUploads
        const hash = yield* Hash
        const seeded = {
          "artifacts:tmp/work/a": "1700000000",
          "lfs:x:y:z": "12.5",
          "bogus": "not a number",
          "uploads:ünïcødé/ファイル": "1"
        }
        yield* hash.set(seeded)
        assert.strictEqual(yield* pending.count, 4)
        const scanned = yield* Stream.runCollect(pending.scan())
        assert.deepStrictEqual(Object.fromEntries(scanned.map((e) => [text(e.field), text(e.value)])), seeded)
        assert.isTrue(yield* pending.exists(utf8("lfs:x:y:z")))
        assert.isFalse(yield* pending.exists(utf8("lfs:x")))
        assert.isTrue(yield* pending.remove(utf8("lfs:x:y:z")))
        assert.isFalse(yield* pending.exists(utf8("lfs:x:y:z")))
        assert.isFalse(yield* pending.remove(utf8("lfs:x:y:z")))
        assert.isFalse(yield* pending.remove(utf8("lfs:x")))
        assert.strictEqual(yield* pending.count, 3)
        assert.doesNotHaveAnyKeys(yield* hash.all, ["lfs:x:y:z"])
      }).pipe(Effect.provide(backend)))

    it.effect("small pages: a scan spanning several round trips sees every field", () =>
      Effect.gen(function*() {
        const pending = yield* PendingDirectUploads
        const hash = yield* Hash
        yield* hash.set(fieldsOf(25))
        const scanned = yield* Stream.runCollect(pending.scan({ pageSize: 3 }))
        assert.deepStrictEqual(new Set(scanned.map((e) => text(e.field))), new Set(Object.keys(fieldsOf(25))))
      }).pipe(Effect.provide(backend)))

    it.effect("5000 fields are scanned completely, each at least once", () =>
      Effect.gen(function*() {
        const pending = yield* PendingDirectUploads
        const hash = yield* Hash
        const seeded = fieldsOf(5000)
        yield* hash.set(seeded)
        assert.strictEqual(yield* pending.count, 5000)
        const scanned = yield* Stream.runCollect(pending.scan())
        const seen = new Map(scanned.map((e) => [text(e.field), text(e.value)]))
        assert.strictEqual(seen.size, 5000)
        for (const [field, value] of Object.entries(seeded)) assert.strictEqual(seen.get(field), value)
        assert.isBelow(scanned.length, 2 * 5000)
      }).pipe(Effect.provide(backend)))

    it.effect("removing fields during the scan (the one just read included) loses none of the others", () =>
      Effect.gen(function*() {
        const pending = yield* PendingDirectUploads
        const hash = yield* Hash
        yield* hash.set(fieldsOf(5000))
        const kept = (field: string) => Number(field.split("/").pop()) % 2 === 0
        const seen = new Set<string>()
        let emitted = 0
        yield* Stream.runForEach(pending.scan(), (entry) =>
          Effect.gen(function*() {
            emitted++
            seen.add(text(entry.field))
            if (!kept(text(entry.field))) yield* pending.remove(entry.field)
          }))
        const keptFields = Object.keys(fieldsOf(5000)).filter(kept)
        for (const field of keptFields) assert.isTrue(seen.has(field), field)
        assert.strictEqual(seen.size, 5000)
        // Redis repeats entries only while rehashing, which removing half of 5000 does not trigger; a
        // cursor that loses its place when its anchor is removed re-reads the kept entries before it.
        assert.isAtMost(emitted, 5000 + 50)
        assert.deepStrictEqual(Object.keys(yield* hash.all).sort(), keptFields.sort())
        assert.strictEqual(yield* pending.count, 2500)
      }).pipe(Effect.provide(backend)))

    it.effect("bytes: scan returns fields and values byte for byte, remove deletes exactly the bytes given", () =>
      Effect.gen(function*() {
        const pending = yield* PendingDirectUploads
        const hash = yield* Hash
        const bin = Uint8Array.from([...utf8("uploads:ok/bin"), 0xff])
        // What a lossy decoder makes of `bin`: a different field, which must survive.
        const lookalike = utf8("uploads:ok/bin\uFFFD")
        const nul = Uint8Array.from([...utf8("lfs:a"), 0, ...utf8("b")])
        const seeded = [
          [bin, Uint8Array.from([0x31, 0xfe])],
          [lookalike, utf8("1")],
          [nul, utf8("2")],
          [Uint8Array.from([0xed, 0xa0, 0x80]), Uint8Array.from([])]
        ] as const
        yield* hash.setBytes(seeded)
        const scanned = yield* Stream.runCollect(pending.scan({ pageSize: 2 }))
        assert.deepStrictEqual(hexRecord(scanned.map((e) => [e.field, e.value] as const)), hexRecord(seeded))
        const scannedBin = scanned.find((e) => hex(e.field) === hex(bin))!
        assert.isTrue(yield* pending.remove(scannedBin.field))
        assert.isFalse(yield* pending.remove(bin))
        assert.isTrue(yield* pending.remove(nul))
        assert.deepStrictEqual(yield* hash.allHex, hexRecord([seeded[1], seeded[3]]))
      }).pipe(Effect.provide(backend)))

    it.effect("values is HMGET of the exact bytes; removeUnchanged deletes a field only while it holds the bytes read", () =>
      Effect.gen(function*() {
        const pending = yield* PendingDirectUploads
        const hash = yield* Hash
        const bin = Uint8Array.from([...utf8("uploads:bin"), 0xff])
        yield* hash.setBytes([[bin, Uint8Array.from([0x31, 0xfe])]])
        yield* hash.set({ "artifacts:a": "100", "artifacts:b": "200", "artifacts:c": "300" })
        const read = yield* Stream.runCollect(pending.scan())
        const byField = new Map(read.map((e) => [hex(e.field), e]))
        const entry = (field: Uint8Array) => byField.get(hex(field))!
        assert.deepStrictEqual(
          (yield* pending.values([utf8("artifacts:a"), bin, utf8("artifacts:gone")])).map((v) =>
            v === null ? null : hex(v)
          ),
          [hex(utf8("100")), hex(Uint8Array.from([0x31, 0xfe])), null]
        )
        // Between the read and the delete: b is re-registered (new value), c completes (HDEL).
        yield* hash.set({ "artifacts:b": "201" })
        yield* Effect.orDie(Effect.gen(function*() {
          const c = entry(utf8("artifacts:c"))
          assert.isTrue(yield* pending.remove(c.field))
        }))
        const removed = yield* pending.removeUnchanged([
          entry(utf8("artifacts:a")),
          entry(utf8("artifacts:b")),
          entry(utf8("artifacts:c")),
          entry(bin),
          // the same field given with other bytes than it holds: kept
          { field: utf8("artifacts:b"), value: utf8("200 ") }
        ])
        assert.deepStrictEqual(removed, [true, false, false, true, false])
        assert.deepStrictEqual(yield* hash.all, { "artifacts:b": "201" })
        assert.deepStrictEqual(yield* pending.removeUnchanged([]), [])
        assert.deepStrictEqual(yield* pending.values([]), [])
      }).pipe(Effect.provide(backend)))

    it.effect("a key of the wrong type: every operation fails with a permanent RedisError naming it", () =>
      Effect.gen(function*() {
        const pending = yield* PendingDirectUploads
        yield* (yield* Hash).setString("oops")
        const errors = [
          yield* Effect.flip(pending.count),
          yield* Effect.flip(Stream.runDrain(pending.scan())),
          yield* Effect.flip(pending.remove(utf8("uploads:x")))
        ]
        assert.deepStrictEqual(errors.map((e) => e.operation), [
          "HLEN pending_direct_uploads",
          "HSCAN pending_direct_uploads",
          "HDEL pending_direct_uploads"
        ])
        for (const error of errors) {
          assert.instanceOf(error, RedisError)
          assert.match(error.message, /^WRONGTYPE /)
          assert.isFalse(isTransient(error))
        }
      }).pipe(Effect.provide(backend)))
  })
}
