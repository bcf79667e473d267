/**
 * The regression benchmark: `npm run bench -- regress [scenario|all] [--scale full|small]
 * [--rounds N] [--gate]` repairs each scenario's data `rounds` times by Sweeper, by the raw baseline
 * (writing the same ledger rows) and by the raw baseline without the ledger, alternating (sweeper,
 * raw, raw-no-ledger, sweeper, …: a load that comes and goes hits every side alike; `--gate` adds
 * `sweeper+gate`, Sweeper with the health gate configured and healthy, after `raw`), each phase on
 * freshly seeded data, and stores in bench/results/regress-<date>-<scale>.json every round's rate
 * for every side and Sweeper / each baseline per round, with the medians, the spread the run
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
import { machine, type RegressPhase, runPhase, type Scale, type Scenario } from "./compare.ts"
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
  /**
   * The raw baseline. With `rawWritesLedger` it writes the same ledger rows as Sweeper; files
   * written before it did (no such field) hold the ledger-less baseline here.
   */
  readonly raw: SideFigures
  readonly rawWritesLedger?: true
  /** Sweeper / raw per round (the phases of one round run back to back) and their median and spread. */
  readonly ratio: SideFigures
  /** The ledger-less raw baseline (`raw-no-ledger`) and Sweeper / it per round. */
  readonly rawNoLedger?: SideFigures
  readonly ratioNoLedger?: SideFigures
  /** With `--gate`: Sweeper with the health gate configured and healthy, and it / raw per round. */
  readonly gated?: SideFigures
  readonly gatedRatio?: SideFigures
  /** The 1-minute load average as each phase started, in run order (`phases` of each round in turn). */
  readonly load: ReadonlyArray<number>
  /** The phases of a round, in the order they ran. */
  readonly phases?: ReadonlyArray<RegressPhase>
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

/** The phases of one round: Sweeper, the raw baseline with and without the ledger, and with `gate` Sweeper gated. */
export const regressPhases = (gate: boolean): ReadonlyArray<RegressPhase> =>
  gate ? ["sweeper", "raw", "sweeper+gate", "raw-no-ledger"] : ["sweeper", "raw", "raw-no-ledger"]

/**
 * `rounds` alternations of the phases on one scenario, each on freshly seeded data, so a load that
 * comes and goes hits every side alike. A phase that did not repair exactly the stuck records (or
 * a raw phase that did not write its ledger rows) fails the run: its rate would mean nothing.
 */
export const regressScenario = <Size>(
  scenario: Scenario<Size>,
  scale: Scale,
  rounds: number,
  options: { readonly gate?: boolean } = {}
) =>
  Effect.gen(function*() {
    const size = scenario.sizes[scale]
    const phases = regressPhases(options.gate === true)
    console.log(`\n${scenario.name} (${scale}, ${rounds} rounds, ${phases.join(", ")}): ${scenario.describeSize(size)}`)
    const rates = new Map<RegressPhase, Array<number>>(phases.map((phase) => [phase, []]))
    const load: Array<number> = []
    let stuck = 0
    for (let round = 0; round < rounds; round++) {
      for (const name of phases) {
        load.push(loadavg()[0]!)
        const figures = yield* runPhase(scenario, size, name)
        stuck = figures.stuck
        if (figures.phase.repaired !== stuck) {
          return yield* Effect.die(new Error(`${scenario.name}/${name} repaired ${figures.phase.repaired} of ${stuck}`))
        }
        rates.get(name)!.push(figures.phase.perSecond)
      }
    }
    const sweeper = rates.get("sweeper")!
    const raw = rates.get("raw")!
    const rawNoLedger = rates.get("raw-no-ledger")!
    const gated = rates.get("sweeper+gate")
    return {
      scenario: scenario.name,
      size: scenario.describeSize(size),
      stuck,
      sweeper: sideFigures(sweeper),
      raw: sideFigures(raw),
      rawWritesLedger: true,
      ratio: sideFigures(sweeper.map((s, i) => s / raw[i]!)),
      rawNoLedger: sideFigures(rawNoLedger),
      ratioNoLedger: sideFigures(sweeper.map((s, i) => s / rawNoLedger[i]!)),
      ...(gated === undefined ? {} : {
        gated: sideFigures(gated),
        gatedRatio: sideFigures(gated.map((g, i) => g / raw[i]!))
      }),
      load,
      phases
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

const rate = (figures: SideFigures | undefined) =>
  figures === undefined ? "–" : `${fmt(figures.median)}/s ±${pct(figures.spread / 2)}`
const ratios = (figures: SideFigures | undefined) =>
  figures === undefined
    ? "–"
    : `${figures.perSecond.map((r) => r.toFixed(2)).join(", ")} (**${figures.median.toFixed(2)}**)`

/**
 * The run as a table: each side's median rate (± half its spread), and Sweeper / raw per round with
 * the median, against the raw baseline with the ledger, without it, and gated / raw.
 */
export const regressTable = (results: RegressResults) =>
  [
    "| scenario | data | Sweeper | raw (ledger) | raw, no ledger | Sweeper+gate | Sweeper / raw | " +
    "Sweeper / raw no ledger | gated / raw | load |",
    "|---|---|---|---|---|---|---|---|---|---|",
    ...results.scenarios.map((s) => {
      const ledger = s.rawWritesLedger === true
      return `| ${s.scenario} | ${s.size} | ${rate(s.sweeper)} | ${ledger ? rate(s.raw) : "–"} | ${
        rate(ledger ? s.rawNoLedger : s.raw)
      } | ${rate(s.gated)} | ${ledger ? ratios(s.ratio) : "–"} | ${ratios(ledger ? s.ratioNoLedger : s.ratio)} | ${
        ratios(s.gatedRatio)
      } | ${Math.min(...s.load).toFixed(1)}–${Math.max(...s.load).toFixed(1)} |`
    })
  ].join("\n")

const pct = (x: number) => `${(100 * x).toFixed(0)}%`

/** What one figure did between two runs: moved (which way) or stayed within the noise. */
export interface Movement {
  readonly metric: "sweeper" | "raw" | "ratio" | "raw-no-ledger" | "ratio-no-ledger" | "sweeper+gate" | "gated-ratio"
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

/**
 * A run's baselines by what they do: `raw` only when it writes the ledger, `raw-no-ledger` the one
 * that does not (a file from before the raw baseline wrote the ledger has it under `raw`), so a
 * comparison never sets one baseline against the other.
 */
const baselines = (s: RegressScenario) =>
  s.rawWritesLedger === true
    ? { raw: s.raw, ratio: s.ratio, rawNoLedger: s.rawNoLedger, ratioNoLedger: s.ratioNoLedger }
    : { raw: undefined, ratio: undefined, rawNoLedger: s.raw, ratioNoLedger: s.ratio }

export const compareRegress = (before: RegressResults, after: RegressResults) =>
  after.scenarios.flatMap((s) => {
    const old = before.scenarios.find((o) => o.scenario === s.scenario && o.size === s.size)
    if (old === undefined) return []
    const [was, now] = [baselines(old), baselines(s)]
    const pairs: ReadonlyArray<readonly [Movement["metric"], SideFigures | undefined, SideFigures | undefined]> = [
      ["sweeper", old.sweeper, s.sweeper],
      ["raw", was.raw, now.raw],
      ["ratio", was.ratio, now.ratio],
      ["raw-no-ledger", was.rawNoLedger, now.rawNoLedger],
      ["ratio-no-ledger", was.ratioNoLedger, now.ratioNoLedger],
      ["sweeper+gate", old.gated, s.gated],
      ["gated-ratio", old.gatedRatio, s.gatedRatio]
    ]
    return [{
      scenario: s.scenario,
      movements: pairs.flatMap(([metric, a, b]) => a === undefined || b === undefined ? [] : [movement(metric, a, b)])
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
  const isRatio = (m: Movement) => m.metric.includes("ratio")
  const unit = (m: Movement) => isRatio(m) ? m.before.toFixed(3) : `${fmt(m.before)}/s`
  const unitAfter = (m: Movement) => isRatio(m) ? m.after.toFixed(3) : `${fmt(m.after)}/s`
  for (const { scenario, movements } of compareRegress(before, after)) {
    for (const m of movements) {
      const sign = m.change >= 0 ? "+" : ""
      const verdict = m.verdict === "within noise"
        ? "within noise"
        : isRatio(m)
        ? `${m.metric.toUpperCase()} ${m.verdict === "faster" ? "UP" : "DOWN"}`
        : `${m.metric.toUpperCase()} ${m.verdict.toUpperCase()}`
      lines.push(
        `${scenario.padEnd(28)} ${m.metric.padEnd(15)} ${unit(m).padStart(12)} → ${unitAfter(m).padStart(12)}  ${
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
