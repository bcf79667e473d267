/**
 * The regression benchmark: `npm run bench -- regress [scenario|all] [--scale full|small]
 * [--rounds N]` repairs each scenario's data `rounds` times by Sweeper and by the raw baseline,
 * alternating (sweeper, raw, sweeper, raw, …: a load that comes and goes hits both sides alike),
 * each phase on freshly seeded data, and stores in bench/results/regress-<date>-<scale>.json every
 * round's rate for both sides and Sweeper / raw per round, with the medians, the spread the run
 * measured (its noise), the commit and the load average at each phase.
 *
 * `npm run bench -- compare [old.json new.json]` (default: the two newest regress files of the
 * same scale) says for each scenario whether Sweeper's rate, the baseline's rate and the ratio
 * moved beyond the noise both runs measured: a faster baseline with an unchanged Sweeper reads as
 * "raw faster", not as a slower Sweeper. Figures only: it never fails on time (exit 0).
 */
import { Effect } from "effect"
import { execFileSync } from "node:child_process"
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs"
import { loadavg } from "node:os"
import { machine, runPhase, type Scale, type Scenario } from "./compare.ts"
import { fmt } from "./harness.ts"

/** One side's rounds: records per second each round, their median and their spread. */
export interface SideFigures {
  readonly perSecond: ReadonlyArray<number>
  readonly median: number
  /** (max − min) / median of the rounds: how much this run moved on its own. */
  readonly spread: number
}

export interface RegressScenario {
  readonly scenario: string
  readonly size: string
  readonly stuck: number
  readonly sweeper: SideFigures
  readonly raw: SideFigures
  /** Sweeper / raw per round (the pair run back to back) and their median and spread. */
  readonly ratio: SideFigures
  /** The 1-minute load average as each phase started, in run order (sweeper, raw, sweeper, …). */
  readonly load: ReadonlyArray<number>
}

export interface RegressResults {
  readonly kind: "regress"
  readonly date: string
  readonly commit: string
  readonly scale: Scale
  readonly rounds: number
  readonly machine: ReturnType<typeof machine>
  readonly scenarios: ReadonlyArray<RegressScenario>
}

const median = (values: ReadonlyArray<number>) => {
  const sorted = [...values].sort((a, b) => a - b)
  const mid = Math.floor(sorted.length / 2)
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
}

export const sideFigures = (perSecond: ReadonlyArray<number>): SideFigures => {
  const m = median(perSecond)
  return { perSecond, median: m, spread: m === 0 ? 0 : (Math.max(...perSecond) - Math.min(...perSecond)) / m }
}

const commit = () => {
  try {
    const head = execFileSync("git", ["rev-parse", "--short", "HEAD"], { encoding: "utf8" }).trim()
    const dirty = execFileSync("git", ["status", "--porcelain", "--", "src", "bench", ":!bench/results"], {
      encoding: "utf8"
    }).trim()
    return dirty === "" ? head : `${head}+changes`
  } catch {
    return "unknown"
  }
}

/** `rounds` alternations of Sweeper and the raw baseline on one scenario. */
export const regressScenario = <Size>(scenario: Scenario<Size>, scale: Scale, rounds: number) =>
  Effect.gen(function*() {
    const size = scenario.sizes[scale]
    console.log(`\n${scenario.name} (${scale}, ${rounds} rounds): ${scenario.describeSize(size)}`)
    const sweeper: Array<number> = []
    const raw: Array<number> = []
    const load: Array<number> = []
    let stuck = 0
    for (let round = 0; round < rounds; round++) {
      for (const [name, into] of [["sweeper", sweeper], ["raw", raw]] as const) {
        load.push(loadavg()[0]!)
        const figures = yield* runPhase(scenario, size, name)
        stuck = figures.stuck
        into.push(figures.phase.perSecond)
      }
    }
    return {
      scenario: scenario.name,
      size: scenario.describeSize(size),
      stuck,
      sweeper: sideFigures(sweeper),
      raw: sideFigures(raw),
      ratio: sideFigures(sweeper.map((s, i) => s / raw[i]!)),
      load
    } satisfies RegressScenario
  })

const resultsDir = new URL("../results/", import.meta.url)

export const writeRegress = (results: RegressResults) => {
  mkdirSync(resultsDir, { recursive: true })
  const stamp = results.date.slice(0, 19).replace(/[:T]/g, "-")
  const file = new URL(`regress-${stamp}-${results.scale}.json`, resultsDir)
  writeFileSync(file, JSON.stringify(results, null, 2) + "\n")
  return file.pathname
}

export const regressTable = (results: RegressResults) =>
  [
    `| scenario | data | Sweeper (median, spread) | raw (median, spread) | Sweeper / raw per round | median | load |`,
    "|---|---|---|---|---|---|---|",
    ...results.scenarios.map((s) =>
      `| ${s.scenario} | ${s.size} | ${fmt(s.sweeper.median)}/s ±${pct(s.sweeper.spread / 2)} | ${
        fmt(s.raw.median)
      }/s ±${pct(s.raw.spread / 2)} | ${s.ratio.perSecond.map((r) => r.toFixed(2)).join(", ")} | **${
        s.ratio.median.toFixed(2)
      }** | ${Math.min(...s.load).toFixed(1)}–${Math.max(...s.load).toFixed(1)} |`
    )
  ].join("\n")

const pct = (x: number) => `${(100 * x).toFixed(0)}%`

/** What one figure did between two runs: moved (which way) or stayed within the noise. */
export interface Movement {
  readonly metric: "sweeper" | "raw" | "ratio"
  readonly before: number
  readonly after: number
  /** after / before − 1. */
  readonly change: number
  /** The larger of the two runs' half-spreads: a change inside it is not told from noise. */
  readonly noise: number
  readonly verdict: "faster" | "slower" | "within noise"
}

export const movement = (metric: Movement["metric"], before: SideFigures, after: SideFigures): Movement => {
  const change = after.median / before.median - 1
  // At least 5%: two rounds that happen to agree do not make a run noiseless on a shared machine.
  const noise = Math.max(before.spread / 2, after.spread / 2, 0.05)
  return {
    metric,
    before: before.median,
    after: after.median,
    change,
    noise,
    verdict: Math.abs(change) <= noise ? "within noise" : change > 0 ? "faster" : "slower"
  }
}

export const compareRegress = (before: RegressResults, after: RegressResults) =>
  after.scenarios.flatMap((s) => {
    const old = before.scenarios.find((o) => o.scenario === s.scenario && o.size === s.size)
    if (old === undefined) return []
    return [{
      scenario: s.scenario,
      movements: [
        movement("sweeper", old.sweeper, s.sweeper),
        movement("raw", old.raw, s.raw),
        movement("ratio", old.ratio, s.ratio)
      ]
    }]
  })

/** The newest two regress files of `scale`, oldest first. */
export const newestTwo = (scale: string): [string, string] | undefined => {
  const files = readdirSync(resultsDir).filter((f) => f.startsWith("regress-") && f.endsWith(`-${scale}.json`)).sort()
  if (files.length < 2) return undefined
  return [new URL(files.at(-2)!, resultsDir).pathname, new URL(files.at(-1)!, resultsDir).pathname]
}

export const readRegress = (path: string) => JSON.parse(readFileSync(path, "utf8")) as RegressResults

/** The comparison as lines: one per scenario and figure, saying what moved beyond the noise. */
export const describeComparison = (before: RegressResults, after: RegressResults) => {
  const lines = [
    `before: ${before.date} (${before.commit}, ${before.rounds} rounds, load ${loadRange(before)})`,
    `after:  ${after.date} (${after.commit}, ${after.rounds} rounds, load ${loadRange(after)})`,
    ""
  ]
  const unit = (m: Movement) => m.metric === "ratio" ? m.before.toFixed(3) : `${fmt(m.before)}/s`
  const unitAfter = (m: Movement) => m.metric === "ratio" ? m.after.toFixed(3) : `${fmt(m.after)}/s`
  for (const { scenario, movements } of compareRegress(before, after)) {
    for (const m of movements) {
      const sign = m.change >= 0 ? "+" : ""
      const verdict = m.verdict === "within noise"
        ? "within noise"
        : m.metric === "ratio"
        ? (m.verdict === "faster" ? "RATIO UP" : "RATIO DOWN")
        : `${m.metric.toUpperCase()} ${m.verdict.toUpperCase()}`
      lines.push(
        `${scenario.padEnd(28)} ${m.metric.padEnd(7)} ${unit(m).padStart(12)} → ${unitAfter(m).padStart(12)}  ${
          `${sign}${pct(m.change)}`.padStart(6)
        } (noise ±${pct(m.noise)})  ${verdict}`
      )
    }
  }
  return lines
}

const loadRange = (r: RegressResults) => {
  const all = r.scenarios.flatMap((s) => s.load)
  return `${Math.min(...all).toFixed(1)}–${Math.max(...all).toFixed(1)}`
}

export const regressResults = (scale: Scale, rounds: number, scenarios: ReadonlyArray<RegressScenario>) =>
  ({
    kind: "regress",
    date: new Date().toISOString(),
    commit: commit(),
    scale,
    rounds,
    machine: machine(),
    scenarios
  }) satisfies RegressResults
