import { assert, describe, it } from "@effect/vitest"
import {
  compareRegress,
  movement,
  type RegressResults,
  type RegressScenario,
  sideFigures
} from "../../bench/support/regress.ts"

const scenario = (sweeper: ReadonlyArray<number>, raw: ReadonlyArray<number>): RegressScenario => ({
  scenario: "drop-canceling-builds",
  size: "1,000,000 builds, 100,000 stuck",
  stuck: 100_000,
  sweeper: sideFigures(sweeper),
  raw: sideFigures(raw),
  ratio: sideFigures(sweeper.map((s, i) => s / raw[i]!)),
  load: [1, 1]
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
})
