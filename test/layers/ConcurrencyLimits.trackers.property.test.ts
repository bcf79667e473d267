/**
 * Arbitrary bytes in executing-tracker fields and values, in memory and on real Redis:
 * `cleanupStaleTrackers` removes exactly the stale trackers — older than 600 s (or with an
 * unreadable start) and not backed by a job of this worker running on their Sidekiq thread — and
 * nothing else; every other field keeps its exact bytes and value. Fields and values are compared
 * as bytes: a field holding 0xFF is found and removed by its own bytes (ioredis decodes it to
 * U+FFFD, a different field), and a value holding 0xFF is an unreadable start, not a look-alike.
 * A malformed field with 0xFF in its pid has a decoy: a lossy look-alike pid whose thread runs a job
 * of this worker, which must not save it.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { Clock, Context, Effect, Layer, Schema } from "effect"
import { SweeperConfig } from "../../src/config/Config.ts"
import { processWorkKey, workerKeys } from "../../src/domain/ConcurrencyLimit.ts"
import { ConcurrencyLimitsMemory } from "../../src/layers/memory/ConcurrencyLimitsMemory.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { ConcurrencyLimitsRedis } from "../../src/layers/redis/ConcurrencyLimitsRedis.ts"
import { Redis } from "../../src/layers/redis/Redis.ts"
import { ConcurrencyLimits } from "../../src/services/ConcurrencyLimits.ts"
import { RedisTest } from "../support/redis.ts"

const W = "Releases::CreateEvidenceWorker"
const K = workerKeys(W)
const FF = Buffer.from([0xff])

const Field = Schema.Union([
  /** Any bytes, made non-UTF-8 by a 0xFF: never a readable field. */
  Schema.Struct({ kind: Schema.Literal("bytes"), bytes: Schema.Uint8Array }),
  /** Any text without `:` (so never `<pid>:tid:<tid>`). */
  Schema.Struct({ kind: Schema.Literal("text"), text: Schema.String }),
  /** A Sidekiq thread's tracker; `badByte` puts 0xFF into its pid. */
  Schema.Struct({
    kind: Schema.Literal("thread"),
    thread: Schema.Int.check(Schema.isBetween({ minimum: 0, maximum: 5 })),
    runs: Schema.Literals(["this worker", "another worker", "nothing"]),
    badByte: Schema.Boolean
  })
])
type Field = typeof Field.Type

const Value = Schema.Union([
  Schema.Struct({
    kind: Schema.Literals(["fresh", "fresh with 0xFF"]),
    age: Schema.Int.check(Schema.isBetween({ minimum: 0, maximum: 590 }))
  }),
  Schema.Struct({
    kind: Schema.Literal("old"),
    age: Schema.Int.check(Schema.isBetween({ minimum: 610, maximum: 10_000_000 }))
  }),
  Schema.Struct({ kind: Schema.Literal("bytes"), bytes: Schema.Uint8Array })
])
type Value = typeof Value.Type

const Case = { trackers: Schema.Array(Schema.Tuple([Field, Value])).check(Schema.isMaxLength(20)) }
type Case = { readonly trackers: ReadonlyArray<readonly [Field, Value]> }

const pidOf = (thread: number) => `host-${thread}:4242:abc`
const workFor = (worker: string) =>
  JSON.stringify({ queue: "default", payload: JSON.stringify({ class: worker, args: [] }), run_at: 1 })

const fieldBytes = (field: Field): Buffer => {
  switch (field.kind) {
    case "bytes":
      return Buffer.concat([Buffer.from(field.bytes), FF])
    case "text":
      return Buffer.from(field.text.replaceAll(":", ""), "utf8")
    case "thread":
      return field.badByte
        ? Buffer.concat([Buffer.from(`host-${field.thread}`), FF, Buffer.from(`:4242:abc:tid:t${field.thread}`)])
        : Buffer.from(`${pidOf(field.thread)}:tid:t${field.thread}`)
  }
}

const valueBytes = (value: Value, nowSeconds: number): Buffer => {
  switch (value.kind) {
    case "fresh":
    case "old":
      return Buffer.from(String(nowSeconds - value.age))
    case "fresh with 0xFF":
      return Buffer.concat([Buffer.from(String(nowSeconds - value.age)), FF])
    case "bytes":
      return Buffer.concat([Buffer.from(value.bytes), FF])
  }
}

/** Stale by construction: old or unreadable start, and no job of this worker on a readable thread. */
const expectedStale = (field: Field, value: Value) => {
  const old = value.kind !== "fresh"
  const backed = field.kind === "thread" && !field.badByte && field.runs === "this worker"
  return old && !backed
}

/** Raw bytes in and out of the stores (one server here, or the in-memory Redis). */
class Keys extends Context.Service<Keys, {
  flush: Effect.Effect<void>
  hset(key: string, entries: ReadonlyArray<readonly [Buffer, Buffer]>): Effect.Effect<void>
  hgetall(key: string): Effect.Effect<ReadonlyArray<readonly [Buffer, Buffer]>>
}>()("test/layers/ConcurrencyLimits.trackers/Keys") {}

const KeysMemory = Layer.effect(
  Keys,
  Effect.map(MemoryRedis, (redis) =>
    Keys.of({
      flush: Effect.sync(() => redis.flushAll()),
      hset: (key, entries) => Effect.sync(() => void (entries.length > 0 && redis.hset(key, entries))),
      hgetall: (key) => Effect.sync(() => redis.hgetallBuffer(key))
    }))
)

const KeysRedis = Layer.effect(
  Keys,
  Effect.map(Redis, ({ client }) =>
    Keys.of({
      flush: Effect.promise(() => client.flushdb()).pipe(Effect.asVoid),
      hset: (key, entries) =>
        Effect.promise(async () => void (entries.length > 0 && await client.hset(key, ...entries.flat()))),
      // callBuffer: ioredis's hgetallBuffer keys its result by the field decoded as text.
      hgetall: (key) => Effect.promise(async () => pairs(await client.callBuffer("HGETALL", key) as Array<Buffer>))
    }))
)

/** HGETALL's flat reply as pairs (asked for as Buffers: field names may not be UTF-8). */
const pairs = (flat: ReadonlyArray<Buffer>) => {
  const out: Array<readonly [Buffer, Buffer]> = []
  for (let i = 0; i + 1 < flat.length; i += 2) out.push([flat[i]!, flat[i + 1]!])
  return out
}

const hex = (bytes: Uint8Array) => Buffer.from(bytes).toString("hex")

const checkCase = (c: Case) =>
  Effect.gen(function*() {
    const keys = yield* Keys
    const limits = yield* ConcurrencyLimits
    yield* keys.flush
    const nowSeconds = Math.floor((yield* Clock.currentTimeMillis) / 1000)

    // Later trackers with the same field replace earlier ones, as HSET does; so does what a thread runs.
    const trackers = new Map<string, { field: Buffer; value: Buffer; stale: boolean }>()
    const work = new Map<string, { pid: string; tid: string; job: string }>()
    for (const [field, value] of c.trackers) {
      const bytes = fieldBytes(field)
      trackers.set(hex(bytes), {
        field: bytes,
        value: valueBytes(value, nowSeconds),
        stale: expectedStale(field, value)
      })
      if (field.kind !== "thread") continue
      const tid = `t${field.thread}`
      if (field.badByte) {
        // The tracker's lossy look-alike pid (0xFF read as U+FFFD) runs this worker: a decoy.
        const pid = `host-${field.thread}\uFFFD:4242:abc`
        work.set(`${pid}/${tid}`, { pid, tid, job: workFor(W) })
        continue
      }
      const pid = pidOf(field.thread)
      if (field.runs === "nothing") work.delete(`${pid}/${tid}`)
      else work.set(`${pid}/${tid}`, { pid, tid, job: workFor(field.runs === "this worker" ? W : "OtherWorker") })
    }
    for (const { job, pid, tid } of work.values()) {
      yield* keys.hset(processWorkKey(pid), [[Buffer.from(tid), Buffer.from(job)]])
    }
    yield* keys.hset(
      K.executing,
      [...trackers.values()].map(({ field, value }) => [field, value] as const)
    )

    const removed = yield* limits.cleanupStaleTrackers(W)

    const left = (yield* keys.hgetall(K.executing)).map(([field, value]) => `${hex(field)}=${hex(value)}`).sort()
    const kept = [...trackers.values()].filter((t) => !t.stale)
    assert.deepStrictEqual(
      left,
      kept.map(({ field, value }) => `${hex(field)}=${hex(value)}`).sort(),
      "exactly the live trackers are left, byte for byte"
    )
    assert.strictEqual(removed, trackers.size - kept.length, "every stale tracker removed and counted")
  })

const configFor = { concurrencyLimits: { [W]: { limit: 3, queue: "default" } } }

/** Fixed cases the arbitraries might not hit in a short run: 0xFF (not UTF-8) in each place. */
const examples: ReadonlyArray<Case> = [
  { trackers: [[{ kind: "thread", thread: 1, runs: "nothing", badByte: true }, { kind: "old", age: 900 }]] },
  {
    trackers: [[{ kind: "thread", thread: 1, runs: "this worker", badByte: false }, {
      kind: "fresh with 0xFF",
      age: 10
    }]]
  },
  {
    trackers: [[{ kind: "thread", thread: 2, runs: "nothing", badByte: false }, {
      kind: "bytes",
      bytes: new Uint8Array([0x31, 0x32])
    }]]
  },
  {
    trackers: [[{ kind: "bytes", bytes: new Uint8Array([0x61, 0x3a, 0x74]) }, { kind: "fresh", age: 5 }], [{
      kind: "bytes",
      bytes: new Uint8Array([])
    }, { kind: "old", age: 700 }]]
  }
]

const Memory = Layer.mergeAll(ConcurrencyLimitsMemory, KeysMemory).pipe(
  Layer.provideMerge(MemoryRedis.layer),
  Layer.provideMerge(SweeperConfig.layerWith(configFor))
)

describe("stale executing trackers over arbitrary bytes (memory)", () => {
  it.effect("the non-UTF-8 cases: 0xFF in a field, a fresh value, an old value", () =>
    Effect.forEach(examples, checkCase, { discard: true }).pipe(Effect.provide(Memory)))
  it.effect.prop(
    "exactly the stale trackers removed, the rest byte for byte",
    Case,
    (c) => checkCase(c).pipe(Effect.provide(Memory)),
    {
      arbitrary: { runs: 200 }
    }
  )
})

const RedisPlatform = Layer.mergeAll(ConcurrencyLimitsRedis, KeysRedis).pipe(
  Layer.provideMerge(RedisTest),
  Layer.provideMerge(SweeperConfig.layerWith(configFor))
)

layer(RedisPlatform, { excludeTestServices: true, timeout: "60 seconds" })(
  "stale executing trackers over arbitrary bytes (real Redis)",
  (it) => {
    it.effect("the non-UTF-8 cases: 0xFF in a field, a fresh value, an old value", () =>
      Effect.forEach(examples, checkCase, { discard: true }))
    it.effect.prop("exactly the stale trackers removed, the rest byte for byte", Case, checkCase, {
      arbitrary: { runs: 80 }
    })
  }
)
