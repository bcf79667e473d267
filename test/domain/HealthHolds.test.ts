/**
 * A run's holds (domain/HealthHolds.ts): shared by its concurrent waiters, held time wall-clock
 * however many wait, and a hold ends with its last waiter, not its first.
 */
import { assert, describe, it } from "@effect/vitest"
import { Option, Schema } from "effect"
import { type Reading, unknown, value } from "../../src/domain/Health.ts"
import { HealthJson } from "../../src/domain/HealthConfig.ts"
import * as Holds from "../../src/domain/HealthHolds.ts"

const hold = (since: number): Holds.OpenHold => ({ since, value: 1, display: "1", threshold: "0" })

describe("health gate holds (per run)", () => {
  it("sixteen waiters held for ten seconds report ten seconds between them, not 160", () => {
    let state = Holds.emptyRun
    for (let i = 0; i < 16; i++) state = Holds.enter(state)
    state = Holds.openHold(state, "replicationLag", hold(1_000))
    state = Holds.closeHold(state, "replicationLag", 11_000)
    let total = 0
    for (let i = 0; i < 16; i++) {
      const [ms, next] = Holds.takeHeld(state, 11_000 + i)
      total += ms
      state = next
    }
    assert.strictEqual(total, 10_000)
  })

  it("two signals held over overlapping periods count the union", () => {
    let state = Holds.enter(Holds.emptyRun)
    state = Holds.openHold(state, "a", hold(0))
    state = Holds.openHold(state, "b", hold(5_000))
    state = Holds.closeHold(state, "a", 8_000)
    assert.strictEqual(Holds.heldSoFar(state, 9_000), 9_000)
    state = Holds.closeHold(state, "b", 12_000)
    assert.strictEqual(Holds.takeHeld(state, 20_000)[0], 12_000)
  })

  it("the first waiter to leave ends nothing; the last one ends every open hold", () => {
    let state = Holds.enter(Holds.enter(Holds.emptyRun))
    state = Holds.openHold(state, "walRate", hold(0))
    const [first, afterFirst] = Holds.leave(state)
    assert.deepStrictEqual(first, [])
    assert.isTrue(afterFirst.holds.has("walRate"))
    const [last, afterLast] = Holds.leave(afterFirst)
    assert.deepStrictEqual(last, ["walRate"])
    assert.isFalse(Holds.idle(afterLast), "the hold is open until the layer closes it")
    assert.isTrue(Holds.idle(Holds.closeHold(afterLast, "walRate", 1)))
  })

  it("one check opens, closes and keeps holds by the hysteresis; an unknown keeps a hold open", () => {
    const rules = Schema.decodeUnknownSync(HealthJson)(JSON.stringify({
      replicationLag: { stop: "8MB", resume: "2MB" },
      longTransactions: { stop: "10m", resume: "5m" },
      queueLatency: { stop: "5m", resume: "1m" }
    })).rules
    let state = Holds.enter(Holds.emptyRun)
    state = Holds.openHold(state, "longTransactions", hold(0))
    state = Holds.openHold(state, "queueLatency", hold(0))
    const readings: Record<string, ReadonlyArray<Reading>> = {
      replicationLag: [value(9e6)],
      longTransactions: [value(200)],
      queueLatency: [unknown("timeout")]
    }
    const step = Holds.check(state, rules, (rule) => readings[rule.signal]!, () => Option.none())
    assert.deepStrictEqual(step.open.map(({ reading, rule }) => [rule.signal, reading]), [[
      "replicationLag",
      value(9e6)
    ]])
    assert.deepStrictEqual(step.close, ["longTransactions"])
    assert.deepStrictEqual(step.keep, ["queueLatency"])
  })
})
