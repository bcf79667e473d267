import { describe, expect, it } from "vitest"
import { MemoryRedisStore } from "../../src/layers/memory/MemoryRedis.ts"

/** A store on a clock the test moves. */
const storeAt = () => {
  const clock = { now: 0 }
  return { clock, store: new MemoryRedisStore(() => clock.now) }
}

describe("MemoryRedisStore: what it holds over a long run", () => {
  it("expired keys that are never read again are evicted, as Redis's active expiry does", () => {
    const { clock, store } = storeAt()
    // One lease key per tick, as the supervisor writes every few seconds in the demo: none is read again.
    for (let tick = 0; tick < 20_000; tick++) {
      clock.now = tick * 5_000
      store.set(`sweeper/tick/${tick}`, "token", { nx: true, exSeconds: 60 })
    }
    store.set("kept", "1")
    // 13 keys are live (60 s of 5 s ticks) plus the one without expiry; the rest expired long ago.
    // Held before anything reads them: KEYS would evict what it walks past.
    const held = store.held().keys
    expect(store.keys("*")).toHaveLength(13)
    expect(held).toBeLessThanOrEqual(2 * 13 + 64)
  })

  it("a key renewed before it expires is never evicted", () => {
    const { clock, store } = storeAt()
    store.set("lease", "token", { exSeconds: 10 })
    for (let second = 0; second < 5_000; second++) {
      clock.now = second * 1_000
      store.expire("lease", 10)
      store.set(`noise/${second}`, "x", { exSeconds: 1 })
    }
    expect(store.get("lease")).toBe("token")
  })

  it("SCAN keeps no position for keys that are gone", () => {
    const { store } = storeAt()
    for (let round = 0; round < 200; round++) {
      for (let i = 0; i < 50; i++) store.set(`job:${round}:${i}`, "x")
      let cursor = "0"
      do [cursor] = store.scan(cursor, "job:*", 100)
      while (cursor !== "0")
      for (let i = 0; i < 50; i++) store.del(`job:${round}:${i}`)
    }
    expect(store.held().scanPositions).toBeLessThanOrEqual(50)
  })

  it("a key present for a whole SCAN is returned even when others are deleted and added meanwhile", () => {
    const { store } = storeAt()
    for (let i = 0; i < 30; i++) store.set(`k${i}`, "x")
    const seen = new Set<string>()
    let cursor = "0"
    let step = 0
    do {
      const [next, keys] = store.scan(cursor, "*", 7)
      for (const key of keys) seen.add(key)
      store.del(`k${step}`)
      store.set(`new${step++}`, "x")
      cursor = next
    } while (cursor !== "0" && step < 100)
    // A scan that renumbered its keys on every call would never reach cursor 0: fail, do not hang.
    expect(cursor).toBe("0")
    for (let i = step; i < 30; i++) expect(seen.has(`k${i}`)).toBe(true)
  })
})
