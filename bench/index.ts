/**
 * `npm run bench -- <scenario|all> [--scale small|full]` runs the side-by-side benchmarks
 * (bench/scenarios/*.ts: Sweeper, raw baseline and per-record baseline on the same data, with
 * ratios) and writes bench/results/<date>-<scale>.json. `small` is CI's smoke run; `full` is the
 * issue's scale, run by hand. `npm run bench -- detail/<name>` runs one of the older single-batch
 * benchmarks with their detailed figures (query plans, round trips, memory by phase).
 * Benchmarks print figures only; they assert nothing about time.
 */
import { NodeRuntime } from "@effect/platform-node"
import { Effect } from "effect"
import { readdirSync } from "node:fs"
import {
  markdownTable,
  runScenario,
  type Scale,
  type Scenario,
  type ScenarioFigures,
  writeResults
} from "./support/compare.ts"
import { idleFootprint } from "./support/idle.ts"
import {
  describeComparison,
  newestTwo,
  readRegress,
  regressResults,
  regressScenario,
  regressTable,
  writeRegress
} from "./support/regress.ts"

const listTs = (dir: string, skip: ReadonlyArray<string> = []) =>
  readdirSync(new URL(dir, import.meta.url)).filter((file) => file.endsWith(".ts") && !skip.includes(file)).map((
    file
  ) => file.slice(0, -3))

const scenarios = listTs("./scenarios/", ["platform.ts"])
const details = listTs("./detail/").map((name) => `detail/${name}`)

const args = process.argv.slice(2)
const command = args[0]
const regressing = command === "regress" || command === "compare"
const rest = regressing ? args.slice(1) : args
const scaleAt = rest.indexOf("--scale")
const roundsAt = rest.indexOf("--rounds")
// The regression benchmark runs at the issue's scale unless told otherwise.
const scale = (scaleAt >= 0 ? rest[scaleAt + 1] : regressing ? "full" : "small") as Scale
const rounds = roundsAt >= 0 ? Number(rest[roundsAt + 1]) : 3
const positional = rest.filter((arg, i) =>
  !arg.startsWith("--") && (scaleAt < 0 || i !== scaleAt + 1) && (roundsAt < 0 || i !== roundsAt + 1)
)
const name = regressing && command === "regress" ? (positional[0] ?? "all") : positional[0]
/** CI's smoke run: Sweeper and the raw baselines only (see RunOptions in support/compare.ts). */
const perRecord = !args.includes("--no-per-record")
/** regress: a `sweeper+gate` phase (the health gate configured and healthy) in every round too. */
const gate = args.includes("--gate")

const usage = () => {
  console.error(
    `usage: npm run bench -- <${
      [...scenarios, "idle", "all"].join("|")
    }> [--scale small|full] [--no-per-record]\n       npm run bench -- <${
      details.join("|")
    }>\n       npm run bench -- regress [<scenario>|all] [--scale full|small] [--rounds N] [--gate]\n       npm run bench -- compare [<before.json> <after.json>]`
  )
  process.exit(2)
}

const loadScenario = (scenarioName: string) =>
  Effect.map(
    Effect.promise(() => import(`./scenarios/${scenarioName}.ts`)),
    (module) => (module as { readonly scenario: Scenario<unknown> }).scenario
  )

if (command === "compare") {
  const files = positional.length >= 2 ? [positional[0]!, positional[1]!] as const : newestTwo(scale)
  if (files === undefined) {
    console.error(`compare: fewer than two bench/results/regress-*-${scale}.json; run \`npm run bench -- regress\``)
    process.exit(2)
  }
  console.log(describeComparison(readRegress(files[0]), readRegress(files[1])).join("\n"))
} else if (command === "regress") {
  if ((name !== "all" && !scenarios.includes(name)) || !Number.isInteger(rounds) || rounds < 1) usage()
  const program = Effect.gen(function*() {
    const figures = []
    for (const scenarioName of name === "all" ? scenarios : [name]) {
      figures.push(yield* regressScenario(yield* loadScenario(scenarioName), scale, rounds, { gate }))
    }
    const results = regressResults(scale, rounds, figures)
    console.log(`\n${regressTable(results)}\n`)
    console.log(`results: ${writeRegress(results)}`)
    const previous = newestTwo(scale)
    if (previous !== undefined) console.log(`\n${describeComparison(readRegress(previous[0]), results).join("\n")}`)
  })
  NodeRuntime.runMain(program)
} else if (name === undefined || (scale !== "small" && scale !== "full")) usage()
else if (details.includes(name)) await import(`./${name}.ts`)
else if (name === "idle") NodeRuntime.runMain(idleFootprint)
else if (name !== "all" && !scenarios.includes(name)) usage()
else {
  const chosen = name === "all" ? scenarios : [name]
  const program = Effect.gen(function*() {
    const figures: Array<ScenarioFigures> = []
    for (const scenarioName of chosen) {
      figures.push(yield* runScenario(yield* loadScenario(scenarioName), scale, { perRecord }))
    }
    const idle = name === "all" ? yield* idleFootprint : undefined
    console.log(`\n${markdownTable(figures)}\n`)
    console.log(`results: ${writeResults(scale, figures, idle)}`)
    // Never a failure on time; a phase that repaired the wrong number of records is a broken
    // benchmark (or a broken repair), and fails the run (CI's smoke test) after the figures.
    const wrong = figures.flatMap((s) =>
      s.phases.filter((p) => p.repaired !== s.stuck).map((p) => `${s.scenario}/${p.phase}: ${p.repaired} of ${s.stuck}`)
    )
    if (wrong.length > 0) {
      return yield* Effect.die(new Error(`phases repaired the wrong number of records: ${wrong.join("; ")}`))
    }
  })
  NodeRuntime.runMain(program)
}
