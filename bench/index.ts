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

const listTs = (dir: string, skip: ReadonlyArray<string> = []) =>
  readdirSync(new URL(dir, import.meta.url)).filter((file) => file.endsWith(".ts") && !skip.includes(file)).map((
    file
  ) => file.slice(0, -3))

const scenarios = listTs("./scenarios/", ["platform.ts"])
const details = listTs("./detail/").map((name) => `detail/${name}`)

const args = process.argv.slice(2)
const scaleAt = args.indexOf("--scale")
const scale = (scaleAt >= 0 ? args[scaleAt + 1] : "small") as Scale
const name = args.find((arg, i) => !arg.startsWith("--") && (scaleAt < 0 || i !== scaleAt + 1))
/** CI's smoke run: Sweeper and the raw baseline only (see RunOptions in support/compare.ts). */
const perRecord = !args.includes("--no-per-record")

const usage = () => {
  console.error(
    `usage: npm run bench -- <${
      [...scenarios, "idle", "all"].join("|")
    }> [--scale small|full] [--no-per-record]\n       npm run bench -- <${details.join("|")}>`
  )
  process.exit(2)
}

if (name === undefined || (scale !== "small" && scale !== "full")) usage()
else if (details.includes(name)) await import(`./${name}.ts`)
else if (name === "idle") NodeRuntime.runMain(idleFootprint)
else if (name !== "all" && !scenarios.includes(name)) usage()
else {
  const chosen = name === "all" ? scenarios : [name]
  const program = Effect.gen(function*() {
    const figures: Array<ScenarioFigures> = []
    for (const scenarioName of chosen) {
      const module = (yield* Effect.promise(() => import(`./scenarios/${scenarioName}.ts`))) as {
        readonly scenario: Scenario<unknown>
      }
      figures.push(yield* runScenario(module.scenario, scale, { perRecord }))
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
