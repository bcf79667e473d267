import { assert, describe, it } from "@effect/vitest"
import {
  compareRegress,
  movement,
  type RegressResults,
  type RegressScenario,
  sideFigures
} from "../../bench/support/regress.ts"

/** A run from before the raw baseline wrote the ledger: its `raw` is the ledger-less baseline. */
const legacy = (sweeper: ReadonlyArray<number>, raw: ReadonlyArray<number>): RegressScenario => ({
  scenario: "drop-canceling-builds",
  size: "1,000,000 builds, 100,000 stuck",
  stuck: 100_000,
  sweeper: sideFigures(sweeper),
  raw: sideFigures(raw),
  ratio: sideFigures(sweeper.map((s, i) => s / raw[i]!)),
  load: [1, 1]
})

const scenario = (sweeper: ReadonlyArray<number>, raw: ReadonlyArray<number>): RegressScenario => ({
  ...legacy(sweeper, raw),
  rawWritesLedger: true
})

const results = (s: RegressScenario): RegressResults => ({
  kind: "regress",
  date: "2026-11-26T00:00:00Z",
  commit: "abc",
  scale: "full",
  rounds: s.sweeper.perSecond.length,
  machine: { cpus: "", memory: "", node: "", logLevel: "Info", postgres: "", redis: "" },
  scenarios: [s]
})

describe("the regression benchmark's comparison", () => {
  it("a run's noise is the spread of its own rounds", () => {
    const figures = sideFigures([90, 100, 110])
    assert.strictEqual(figures.median, 100)
    assert.closeTo(figures.spread, 0.2, 1e-9)
  })

  it("a change inside the noise either run measured is not called a movement", () => {
    // ±10% noise in the run before: a 8% fall is within it.
    assert.strictEqual(
      movement("sweeper", sideFigures([90, 100, 110]), sideFigures([91, 92, 93])).verdict,
      "within noise"
    )
    // Both runs quiet (noise floor 5%): 8% slower is a movement.
    assert.strictEqual(movement("sweeper", sideFigures([100, 100, 100]), sideFigures([92, 92, 92])).verdict, "slower")
  })

  it("a faster baseline under an unchanged Sweeper reads as the baseline moving, not Sweeper", () => {
    const [compared] = compareRegress(
      results(scenario([25_000, 25_000, 25_000], [40_000, 40_000, 40_000])),
      results(scenario([25_000, 25_100, 24_900], [56_000, 57_000, 56_500]))
    )
    assert.deepStrictEqual(compared!.movements.map((m) => [m.metric, m.verdict]), [
      ["sweeper", "within noise"],
      ["raw", "faster"],
      ["ratio", "slower"]
    ])
  })

  it("a run from before the raw baseline wrote the ledger is compared with the ledger-less baseline only", () => {
    const old = legacy([25_000, 25_000, 25_000], [80_000, 80_000, 80_000])
    const now: RegressScenario = {
      ...scenario([25_000, 25_000, 25_000], [50_000, 50_000, 50_000]),
      rawWritesLedger: true,
      rawNoLedger: sideFigures([80_000, 80_000, 80_000]),
      ratioNoLedger: sideFigures([0.3125, 0.3125, 0.3125])
    }
    const [compared] = compareRegress(results(old), results(now))
    // The old `raw` is the ledger-less baseline: set against `raw-no-ledger`, never the ledger one.
    assert.deepStrictEqual(compared!.movements.map((m) => [m.metric, m.verdict]), [
      ["sweeper", "within noise"],
      ["raw-no-ledger", "within noise"],
      ["ratio-no-ledger", "within noise"]
    ])
  })

  it("two runs with the ledger baseline and the gated phase compare every side", () => {
    const side = (raw: number, gated: number): RegressScenario => ({
      ...scenario([25_000, 25_000], [raw, raw]),
      rawWritesLedger: true,
      rawNoLedger: sideFigures([80_000, 80_000]),
      ratioNoLedger: sideFigures([0.3125, 0.3125]),
      gated: sideFigures([gated, gated]),
      gatedRatio: sideFigures([gated / raw, gated / raw])
    })
    const [compared] = compareRegress(results(side(50_000, 25_000)), results(side(50_000, 20_000)))
    assert.deepStrictEqual(compared!.movements.map((m) => [m.metric, m.verdict]), [
      ["sweeper", "within noise"],
      ["raw", "within noise"],
      ["ratio", "within noise"],
      ["raw-no-ledger", "within noise"],
      ["ratio-no-ledger", "within noise"],
      ["sweeper+gate", "slower"],
      ["gated-ratio", "slower"]
    ])
  })
})
