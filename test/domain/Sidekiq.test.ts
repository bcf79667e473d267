import { assert, describe, it } from "@effect/vitest"
import { Effect, Random } from "effect"
import { jidFrom, newJid, sidekiqJob } from "../../src/domain/Sidekiq.ts"

const JID = /^[0-9a-f]{24}$/

describe("jids from effect's Random", () => {
  it.effect("24 lowercase hex characters, every one of them, and distinct", () =>
    Effect.gen(function*() {
      const jids = yield* Effect.replicateEffect(newJid, 2000)
      for (const jid of jids) assert.match(jid, JID)
      assert.strictEqual(new Set(jids).size, jids.length)
      // Every hex digit shows up in every position over 2000 jids: no position stuck at 0 (padding).
      for (let position = 0; position < 24; position++) {
        assert.strictEqual(new Set(jids.map((jid) => jid[position])).size, 16, `position ${position}`)
      }
    }))

  it.effect("a seeded Random gives the same jids, run after run; another seed gives others", () =>
    Effect.gen(function*() {
      const draw = Effect.replicateEffect(newJid, 5)
      const first = yield* draw.pipe(Random.withSeed("jids"))
      const again = yield* draw.pipe(Random.withSeed("jids"))
      const other = yield* draw.pipe(Random.withSeed("other"))
      assert.deepStrictEqual(again, first)
      assert.notDeepEqual(other, first)
      // jidFrom (the synchronous form a move uses) draws the same as newJid from the same service.
      const sync = yield* Effect.map(Random.Random, (random) => Array.from({ length: 5 }, () => jidFrom(random))).pipe(
        Random.withSeed("jids")
      )
      assert.deepStrictEqual(sync, first)
    }))

  it("extremes of the draw stay 24 characters: 0 pads to 0000, just below 1 is ffff", () => {
    assert.strictEqual(jidFrom({ nextDoubleUnsafe: () => 0, nextIntUnsafe: () => 0 }), "0".repeat(24))
    assert.strictEqual(jidFrom({ nextDoubleUnsafe: () => 1 - Number.EPSILON, nextIntUnsafe: () => 0 }), "f".repeat(24))
  })
})

describe("sidekiqJob (the one builder)", () => {
  it("Sidekiq's keys in Sidekiq's order, epoch seconds as floats, then the extra keys", () => {
    const job = sidekiqJob({
      workerClass: "W",
      args: [1],
      queue: "q",
      jid: "a".repeat(24),
      nowMillis: 1772366400123,
      extra: { x: 1 }
    })
    assert.strictEqual(
      JSON.stringify(job),
      `{"class":"W","args":[1],"jid":"${
        "a".repeat(24)
      }","queue":"q","retry":true,"created_at":1772366400.123,"enqueued_at":1772366400.123,"x":1}`
    )
  })
})
