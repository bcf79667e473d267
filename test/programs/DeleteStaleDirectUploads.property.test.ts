/**
 * delete-stale-direct-uploads over arbitrary bytes: fields and values built from bytes that
 * are not UTF-8 (0xFF, a lone surrogate's encoding, a truncated sequence, a byte-order mark), NUL,
 * `:` anywhere, `..`, `/`, empty parts, against a Local object store rooted in a temp dir that has
 * "victim" files beside and above its roots, and the files a lossy decoding of each field would name.
 * After a real run:
 *   - nothing outside the store roots is deleted, and only objects that a valid stale entry names;
 *   - every malformed entry is counted and still there, byte for byte (never deleted);
 *   - every valid stale entry is handled (object and field gone), or kept and counted as a failed
 *     delete when the store refuses it (an escaping path, a directory, a NUL);
 *   - every valid entry that is not stale is still there.
 * The oracle below is written independently of the domain: a field is UTF-8 when Node's decoder
 * round-trips it, and the object is `path.resolve(root, path)`, as ObjectStorageLocal documents.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Context, Effect, Layer, Option, Schema } from "effect"
import { TestClock } from "effect/testing"
import { lstatSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, isAbsolute, join, relative, resolve } from "node:path"
import { SweeperConfig } from "../../src/config/Config.ts"
import { LOCATIONS, PENDING_DIRECT_UPLOADS_KEY } from "../../src/domain/DirectUpload.ts"
import { EventLogMemory, MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { PendingDirectUploadsMemory } from "../../src/layers/memory/PendingDirectUploadsMemory.ts"
import { ObjectStorageLocal } from "../../src/layers/objectStorage/ObjectStorageLocal.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { StaleUploadRepairLive } from "../../src/layers/protocols/StaleUploadRepairLive.ts"
import { PendingDirectUploadsRedis } from "../../src/layers/redis/PendingDirectUploadsRedis.ts"
import { Redis } from "../../src/layers/redis/Redis.ts"
import { DeleteStaleDirectUploads } from "../../src/programs/DeleteStaleDirectUploads.ts"
import { RedisTest } from "../support/redis.ts"

const NOW = Date.parse("2026-01-01T05:00:00Z")
const STALE = String(NOW / 1000 - 4 * 3600)
const FRESH = String(NOW / 1000 - 60)

const utf8 = (text: string) => [...Buffer.from(text, "utf8")]
/**
 * Byte pieces the generator strings together, weighted by repetition so that about half the fields
 * are valid (and so reach the object store) while the rest carry every kind of bad byte. `null` is
 * the entry's own random byte.
 */
const TOKENS: ReadonlyArray<ReadonlyArray<number> | null> = [
  utf8("a"),
  utf8("a"),
  utf8("b"),
  utf8("b"),
  utf8("victim"),
  utf8("/"),
  utf8("/"),
  utf8(".."),
  utf8("."),
  utf8(":"),
  [],
  utf8("é"),
  utf8("12"),
  utf8("\\"),
  utf8("\uFFFD"),
  [0x00], // NUL
  [0xff],
  [0xed, 0xa0, 0x80], // a lone surrogate (U+D800) as CESU-8
  [0xc3], // a truncated sequence
  [0xc0, 0xaf], // an overlong "/"
  [0xef, 0xbb, 0xbf], // a byte-order mark
  null
]
const LOCATION_TOKENS: ReadonlyArray<ReadonlyArray<number>> = [
  utf8("uploads"),
  utf8("uploads"),
  utf8("uploads"),
  utf8("artifacts"),
  utf8("artifacts"),
  utf8("lfs"), // a GitLab location with no store configured
  utf8("bogus"),
  [],
  [...utf8("uploads"), 0xff],
  [0xef, 0xbb, 0xbf, ...utf8("uploads")]
]

const index = (n: number) => Schema.Int.check(Schema.isBetween({ minimum: 0, maximum: n - 1 }))
const Entry = Schema.Struct({
  /** 0–2: a GitLab-shaped entry (known location, a colon, a timestamp) whose path may hold anything; 3: anything. */
  shape: index(4),
  location: index(LOCATION_TOKENS.length),
  /** 0: no colon after the location. */
  colon: index(4),
  path: Schema.Array(index(TOKENS.length)).check(Schema.isMaxLength(6)),
  /** 0–1 stale, 2 fresh, 3 stale with a fraction, 4 stale then 0xFF, 5 path-like garbage. */
  value: index(6),
  byte: index(256)
})
const Case = { entries: Schema.Array(Entry).check(Schema.isMaxLength(12)) }
type Entry = typeof Entry.Type

const bytesOf = (tokens: ReadonlyArray<number>, byte: number) => Buffer.from(tokens.flatMap((t) => TOKENS[t] ?? [byte]))

const gitlabShaped = (entry: Entry) => entry.shape < 3

const fieldOf = (entry: Entry) =>
  Buffer.concat([
    Buffer.from(LOCATION_TOKENS[gitlabShaped(entry) ? entry.location % 6 : entry.location]!),
    entry.colon === 0 && !gitlabShaped(entry) ? Buffer.alloc(0) : Buffer.from(":"),
    bytesOf(entry.path, entry.byte)
  ])

const valueOf = (entry: Entry) => {
  switch (gitlabShaped(entry) ? entry.value % 4 : entry.value) {
    case 2:
      return Buffer.from(FRESH)
    case 3:
      return Buffer.from(`${STALE}.5`)
    case 4:
      return Buffer.concat([Buffer.from(STALE), Buffer.from([0xff])])
    case 5:
      return bytesOf(entry.path, entry.byte)
    default:
      return Buffer.from(STALE)
  }
}

/** Independent of the domain: Node's lossy decoder round-trips exactly the UTF-8 byte strings. */
const isUtf8 = (bytes: Buffer) => Buffer.from(bytes.toString("utf8"), "utf8").equals(bytes)

// One directory tree for the file, emptied before each case: roots for two locations (lfs has none:
// "unconfigured"), victims beside the roots and above them.
const base = mkdtempSync(join(tmpdir(), "sweeper-bytes-"))
const stores = join(base, "stores")
const roots: Record<string, string> = { uploads: join(stores, "uploads"), artifacts: join(stores, "artifacts") }
const VICTIMS = [join(base, "victim"), join(stores, "victim"), join(stores, "uploads-victim", "victim")]

const below = (root: string, target: string) => {
  const rel = relative(root, target)
  return rel !== "" && !rel.startsWith("..") && !isAbsolute(rel)
}

const listFiles = (dir: string): Array<string> =>
  readdirSync(dir, { withFileTypes: true }).flatMap((d) =>
    d.isDirectory() ? listFiles(join(dir, d.name)) : [join(dir, d.name)]
  )

const tryPut = (file: string) => {
  if (file.includes("\0")) return
  try {
    mkdirSync(dirname(file), { recursive: true })
    writeFileSync(file, "half an upload")
  } catch {
    // A name another seeded file's directory already took (or the reverse): not seeded.
  }
}

/** The hash, behind the services' back. */
class RawHash extends Context.Service<RawHash, {
  reset: Effect.Effect<void>
  set(entries: ReadonlyArray<readonly [Buffer, Buffer]>): Effect.Effect<void>
  /** hex(field) → hex(value). */
  all: Effect.Effect<Map<string, string>>
}>()("test/programs/DeleteStaleDirectUploads.property/RawHash") {}

const hexMap = (pairs: ReadonlyArray<readonly [Buffer, Buffer]>) =>
  new Map(pairs.map(([f, v]) => [f.toString("hex"), v.toString("hex")]))

const RawHashMemory = Layer.effect(
  RawHash,
  Effect.map(MemoryRedis, (store) =>
    RawHash.of({
      reset: Effect.sync(() => store.flushAll()),
      set: (entries) => Effect.sync(() => void store.hset(PENDING_DIRECT_UPLOADS_KEY, entries)),
      all: Effect.sync(() => hexMap(store.hgetallBuffer(PENDING_DIRECT_UPLOADS_KEY)))
    }))
)

const RawHashRedis = Layer.effect(
  RawHash,
  Effect.map(Redis, ({ client }) =>
    RawHash.of({
      reset: Effect.promise(() => client.flushdb()).pipe(Effect.asVoid),
      set: (entries) =>
        Effect.promise(() => client.hset(PENDING_DIRECT_UPLOADS_KEY, new Map(entries))).pipe(Effect.asVoid),
      all: Effect.promise(async () => {
        // The raw reply: hgetallBuffer would decode the fields (they become object keys).
        const flat = (await client.callBuffer("HGETALL", PENDING_DIRECT_UPLOADS_KEY)) as Array<Buffer>
        return hexMap(flat.flatMap((field, i) => (i % 2 === 0 ? [[field, flat[i + 1]!] as const] : [])))
      })
    }))
)

interface Expected {
  readonly field: Buffer
  readonly value: Buffer
  readonly kind: "invalid" | "fresh" | "stale"
  /** For a valid entry of a configured location: the file it names. */
  readonly target: Option.Option<string>
  readonly location: string
}

const classify = (field: Buffer, value: Buffer): Expected => {
  const invalid = { field, value, kind: "invalid", target: Option.none(), location: "" } as const
  if (!isUtf8(field) || !isUtf8(value)) return invalid
  const text = field.toString("utf8")
  const colon = text.indexOf(":")
  if (colon === -1) return invalid
  const location = text.slice(0, colon)
  const path = text.slice(colon + 1)
  if (!(LOCATIONS as ReadonlyArray<string>).includes(location) || path === "") return invalid
  if (!/^\d+(\.\d+)?$/.test(value.toString("utf8"))) return invalid
  const stale = Number(value.toString("utf8")) * 1000 < NOW - 3 * 3600 * 1000
  const root = roots[location]
  return {
    field,
    value,
    kind: stale ? "stale" : "fresh",
    target: root === undefined ? Option.none() : Option.some(resolve(root, path)),
    location
  }
}

const checkCase = ({ entries }: { readonly entries: ReadonlyArray<Entry> }) =>
  Effect.gen(function*() {
    const hash = yield* RawHash
    yield* hash.reset
    rmSync(base, { recursive: true, force: true })
    for (const root of Object.values(roots)) mkdirSync(root, { recursive: true })
    for (const victim of VICTIMS) tryPut(victim)
    // One entry per field (the last value wins, as HSET does).
    const byField = new Map(entries.map((e) => [fieldOf(e).toString("hex"), [fieldOf(e), valueOf(e)] as const]))
    const seeded = [...byField.values()]
    const expected = seeded.map(([field, value]) => classify(field, value))

    // Seed the object each field names under a lossy decoding (for a valid field: its own object;
    // for one that is not UTF-8: the other object the old code deleted), inside the roots only.
    for (const [field] of seeded) {
      const lossy = field.toString("utf8")
      const colon = lossy.indexOf(":")
      const root = roots[lossy.slice(0, colon)]
      if (colon === -1 || root === undefined) continue
      const file = resolve(root, lossy.slice(colon + 1))
      if (below(root, file)) tryPut(file)
    }
    const directories = new Set<string>()
    const before = new Set(listFiles(base))
    for (const e of expected) {
      if (Option.isSome(e.target)) {
        try {
          if (lstatSync(e.target.value).isDirectory()) directories.add(e.target.value)
        } catch {
          // not there
        }
      }
    }
    if (seeded.length > 0) yield* hash.set(seeded)

    const summary = yield* DeleteStaleDirectUploads.run
    const after = new Set(listFiles(base))
    const remaining = yield* hash.all
    const still = (e: Expected) => remaining.get(e.field.toString("hex")) === e.value.toString("hex")

    // Every malformed entry counted and kept byte for byte; every fresh one kept.
    assert.strictEqual(summary.invalidEntries, expected.filter((e) => e.kind === "invalid").length)
    for (const e of expected) {
      if (e.kind !== "stale") assert.isTrue(still(e), `${e.kind} ${e.field.toString("hex")} kept`)
    }

    // Valid stale entries: handled, or kept and counted as a failed delete when the store refused;
    // those of a location without a store are removed but counted apart (skippedNoStore).
    const stale = expected.filter((e) => e.kind === "stale")
    const keptStale = stale.filter(still)
    const noStore = stale.filter((e) => Option.isNone(e.target))
    assert.strictEqual(summary.failedDeletes, keptStale.length)
    assert.strictEqual(summary.skippedNoStore, noStore.length)
    assert.strictEqual(summary.totalDeletedStaleEntries, stale.length - keptStale.length - noStore.length)
    for (const e of stale) {
      const storable = Option.match(e.target, {
        onNone: () => true, // unconfigured location: nothing to delete, the entry goes
        onSome: (target) => below(roots[e.location]!, target) && !target.includes("\0") && !directories.has(target)
      })
      if (storable) {
        assert.isFalse(still(e), `stale ${e.field.toString("hex")} removed`)
        if (Option.isSome(e.target)) assert.isFalse(after.has(e.target.value), `${e.target.value} deleted`)
      }
    }

    // Only objects that a handled valid stale entry names were deleted: no victim, nothing outside
    // the roots, nothing a lossy decoding names.
    const named = new Set(stale.filter((e) => !still(e)).flatMap((e) => Option.toArray(e.target)))
    for (const file of before) {
      if (!after.has(file)) assert.isTrue(named.has(file), `deleted ${file}, which no handled stale entry names`)
    }
    for (const victim of VICTIMS) assert.isTrue(after.has(victim), `${victim} kept`)
    // Each removed entry has its event: deleted with its object, or removed where no store is configured.
    const events = (yield* MemoryEvents).splice(0)
    const count = (type: string) => events.filter((e) => e.type === type).length
    assert.strictEqual(count("StaleDirectUploadDeleted"), summary.totalDeletedStaleEntries)
    assert.strictEqual(count("StaleDirectUploadEntryRemoved"), summary.skippedNoStore)
  })

const Common = Layer.mergeAll(ObjectStorageLocal(roots), EventLogMemory, MetricsPrometheus).pipe(
  Layer.provideMerge(MemoryEvents.layer),
  Layer.provideMerge(SweeperConfig.layerWith({ objectStorage: { _tag: "Local", roots } }))
)

describe("delete-stale-direct-uploads over arbitrary bytes", () => {
  layer(
    StaleUploadRepairLive.pipe(
      Layer.provideMerge(Layer.mergeAll(PendingDirectUploadsMemory, RawHashMemory)),
      Layer.provideMerge(MemoryRedis.layer),
      Layer.provideMerge(Common)
    )
  )(
    "memory",
    (it) => {
      it.effect.prop(
        "deletes only what a valid stale entry names; counts and keeps the malformed",
        Case,
        (c) => Effect.andThen(TestClock.setTime(NOW), checkCase(c)),
        { arbitrary: { runs: 50 } }
      )
    }
  )
  layer(
    StaleUploadRepairLive.pipe(
      Layer.provideMerge(Layer.mergeAll(PendingDirectUploadsRedis, RawHashRedis)),
      Layer.provideMerge(RedisTest),
      Layer.provideMerge(Common)
    ),
    {
      timeout: "60 seconds"
    }
  )("real Redis", (it) => {
    it.effect.prop(
      "deletes only what a valid stale entry names; counts and keeps the malformed",
      Case,
      (c) => Effect.andThen(TestClock.setTime(NOW), checkCase(c)),
      { arbitrary: { runs: 40 } }
    )

    // The case that once lost an object, spelled out: before, this deleted `ok/bin\uFFFD` and kept its own field.
    it.effect("uploads:ok/bin\\xff is counted and kept; ok/bin\uFFFD and ok/bin survive", () =>
      Effect.gen(function*() {
        yield* TestClock.setTime(NOW)
        const hash = yield* RawHash
        yield* hash.reset
        rmSync(base, { recursive: true, force: true })
        const lookalike = join(roots.uploads!, "ok", "bin\uFFFD")
        const prefix = join(roots.uploads!, "ok", "bin")
        for (const file of [lookalike, prefix]) tryPut(file)
        const field = Buffer.concat([Buffer.from("uploads:ok/bin"), Buffer.from([0xff])])
        yield* hash.set([[field, Buffer.from(STALE)]])
        const summary = yield* DeleteStaleDirectUploads.run
        assert.deepStrictEqual(summary, {
          totalPendingEntries: 1,
          totalDeletedStaleEntries: 0,
          executionTimeout: false,
          invalidEntries: 1,
          failedDeletes: 0,
          skippedNoStore: 0,
          vanished: 0,
          heldMs: 0,
          heldBy: []
        })
        assert.deepStrictEqual([...(yield* hash.all)], [[field.toString("hex"), Buffer.from(STALE).toString("hex")]])
        assert.deepStrictEqual(listFiles(base).sort(), [prefix, lookalike].sort())
      }))
  })
})
