/**
 * `sweeper simulate` (the simulator against the configured backends, or beside an in-process
 * supervisor) and `sweeper demo` (both in one process, fast crons, for a newcomer).
 */
import * as Cause from "effect/Cause"
import * as Command from "effect/cli/Command"
import * as Flag from "effect/cli/Flag"
import * as ConfigProvider from "effect/ConfigProvider"
import * as Console from "effect/Console"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import { randomBytes } from "node:crypto"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { configureBatches, redisConfigured, SweeperConfig } from "../config/Config.ts"
import { modeVariable, SHADOW_BATCHES, ShadowWaitOverride } from "../domain/Shadow.ts"
import { batches } from "../programs/index.ts"
import { emptyLedger, ledgerCounts } from "../simulator/Ledger.ts"
import { parseScenarios, simulate, type SimulateOptions, SimulatorLive } from "../simulator/Simulator.ts"
import { AppLayer, describeBackends } from "../supervisor/App.ts"
import { durationFlag, intFlag } from "./CliFlags.ts"
import { demoReachText } from "./DemoReach.ts"
import { demoEnvironment, refuseGitLabDatabase, superviseWithSimulator } from "./SupervisorProcess.ts"

/** The simulator's rate per scenario beyond which a laptop only measures its own queueing. */
const MAX_RATE = 10_000

export class InvalidFlag extends Schema.TaggedError<InvalidFlag>()("InvalidFlag", {
  flag: Schema.String,
  message: Schema.String
}) {}

const simulationFlags = {
  rate: intFlag("rate", 1, MAX_RATE).pipe(
    Flag.withDescription(`Things each scenario makes per second (1 to ${MAX_RATE})`),
    Flag.withDefault(1)
  ),
  scenario: Flag.String("scenario").pipe(
    Flag.withDescription("all, or a comma list of: exports, builds, uploads, rebalances, throttled"),
    Flag.withDefault("all")
  ),
  duration: durationFlag("duration").pipe(
    Flag.withDescription("Stop making things after this long (30s, 5m); default: until stopped"),
    Flag.optional
  )
}

const simulationOptions = Effect.fn("Cli.simulationOptions")(
  function*(flags: { rate: number; scenario: string; duration: Option.Option<Duration.Duration> }) {
    const scenarios = yield* parseScenarios(flags.scenario).pipe(
      Effect.mapError((e) => new InvalidFlag({ flag: "--scenario", message: e.message }))
    )
    const duration = Option.getOrUndefined(flags.duration)
    return { scenarios, rate: flags.rate, ...(duration === undefined ? {} : { duration }) } satisfies SimulateOptions
  }
)

export const simulateCommand = Command.make(
  "simulate",
  {
    ...simulationFlags,
    supervise: Flag.Boolean("supervise").pipe(
      Flag.withDescription("Also run the supervisor in this process (always so on the embedded default)"),
      Flag.withDefault(false)
    )
  },
  Effect.fn("Cli.simulate")(function*(flags) {
    const options = yield* simulationOptions(flags)
    const settings = yield* SweeperConfig
    yield* configureBatches(batches)
    yield* refuseGitLabDatabase
    // The embedded database and Redis live in one process: the simulator must be that process.
    if ((Option.isNone(settings.databaseUrl) && !redisConfigured(settings)) || flags.supervise) {
      yield* Effect.logInfo("Simulating with the supervisor in this process", describeBackends(settings))
      return yield* Layer.launch(superviseWithSimulator(options))
    }
    yield* Effect.logInfo("Simulating against the configured backends", describeBackends(settings))
    // What was made goes to stdout also when stopped by a signal, not only after --duration.
    const ledger = emptyLedger()
    yield* simulate({ ...options, ledger }).pipe(
      Effect.provide(Layer.provideMerge(SimulatorLive, AppLayer)),
      Effect.onExit((exit) =>
        Exit.isSuccess(exit) || Cause.hasInterruptsOnly(exit.cause)
          ? Console.log(JSON.stringify(ledgerCounts(ledger)))
          : Effect.void
      )
    )
  }, Effect.provide(SweeperConfig.layer))
).pipe(
  Command.withDescription("Play the GitLab around Sweeper: stuck exports, builds, uploads, rebalances, throttled jobs")
)

/**
 * `--decomposed`: GitLab's ci tables in a database of their own, as GitLab.com and every
 * self-managed GitLab since 17.0 may have them. On the embedded default that is a second embedded
 * database (SWEEPER_EMBEDDED_CI_DATABASE); on a configured server, CI_DATABASE_URL must name it.
 */
const decomposedEnvironment = (
  env: Record<string, string | undefined>
): Effect.Effect<Record<string, string>, InvalidFlag> =>
  env.DATABASE_URL === undefined
    ? Effect.succeed({ SWEEPER_EMBEDDED_CI_DATABASE: "true" })
    : env.CI_DATABASE_URL === undefined
    ? Effect.fail(
      new InvalidFlag({
        flag: "--decomposed",
        message: "--decomposed with DATABASE_URL needs CI_DATABASE_URL, the database GitLab's ci tables go in"
      })
    )
    : Effect.succeed({})

/** Every batch shadow mode judges: the simulator plays its GitLab worker (GitLabWorkers.ts), `--shadow` shadows it. */
const PLAYED_WORKERS = SHADOW_BATCHES

/** How often the demo's simulated GitLab runs its own workers (hourly on a real GitLab). */
const DEMO_GITLAB_PERIOD = Duration.seconds(15)

export const demo = Command.make(
  "demo",
  {
    rate: simulationFlags.rate,
    decomposed: Flag.Boolean("decomposed").pipe(
      Flag.withDescription(
        "GitLab's ci tables (builds, runners) in a second database, as a decomposed GitLab keeps them: " +
          "a second embedded one, or CI_DATABASE_URL beside DATABASE_URL"
      ),
      Flag.withDefault(false)
    ),
    shadow: Flag.Boolean("shadow").pipe(
      Flag.withDescription(
        `every batch that has a shadow mode (${SHADOW_BATCHES.join(", ")}) in shadow mode, beside GitLab's ` +
          "own workers played by the simulator: see each batch's agreement with GitLab on its shadow page"
      ),
      Flag.withDefault(false)
    )
  },
  Effect.fn("Cli.demo")(function*({ decomposed, rate, shadow: shadowFlag }) {
    const ci = decomposed ? yield* decomposedEnvironment(process.env) : {}
    // A fresh directory per demo unless one is given; ours is removed when the demo stops.
    const own = process.env.SWEEPER_DATA_DIR === undefined ? mkdtempSync(join(tmpdir(), "sweeper-demo-")) : undefined
    // The buttons need a token and the demo must not open its write API to anyone: it makes one,
    // unless the operator gave their own, and hands it to the browser once (DemoReach.ts).
    const token = process.env.SWEEPER_API_TOKEN === undefined ? randomBytes(24).toString("hex") : undefined
    const env = {
      ...demoEnvironment(own ?? process.env.SWEEPER_DATA_DIR!),
      ...(token === undefined ? {} : { SWEEPER_API_TOKEN: token }),
      ...process.env,
      // The flags are asked for on this very command line: they win over the environment.
      ...ci,
      ...(shadowFlag ? Object.fromEntries(PLAYED_WORKERS.map((batch) => [modeVariable(batch), "shadow"])) : {})
    } as Record<string, string>
    const shadow = env.SWEEPER_MODE === "shadow" ||
      PLAYED_WORKERS.some((batch) => env[modeVariable(batch)] === "shadow")
    const options = {
      ...yield* simulationOptions({ rate, scenario: "all", duration: Option.none() }),
      ...(shadow ? { gitlabWorkers: { every: DEMO_GITLAB_PERIOD } } : {})
    }
    yield* Console.log(
      `Sweeper demo: the supervisor and a simulated GitLab in one process, data under ${env.SWEEPER_DATA_DIR}${
        decomposed ? "; GitLab decomposed: ci tables in a database of their own" : ""
      }`
    )
    return yield* Effect.gen(function*() {
      const settings = yield* SweeperConfig
      yield* configureBatches(batches)
      yield* refuseGitLabDatabase
      if (Option.isSome(settings.databaseUrl) || redisConfigured(settings) || decomposed) {
        yield* Effect.logInfo("Demo backends", describeBackends(settings))
      }
      const reach = (url: string) => Console.log(demoReachText({ url, dataDir: env.SWEEPER_DATA_DIR!, token }))
      return yield* Layer.launch(superviseWithSimulator(options, reach)).pipe(
        // GitLab's workers run every DEMO_GITLAB_PERIOD here, not hourly: a proposal still stuck
        // after two of their turns is one GitLab's worker did not repair.
        shadow ? Effect.provideService(ShadowWaitOverride, Duration.times(DEMO_GITLAB_PERIOD, 2)) : (e) => e
      )
    }).pipe(
      Effect.provide(SweeperConfig.layer),
      Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromEnv({ env, preserveEmptyStrings: true })),
      Effect.ensuring(Effect.sync(() => {
        if (own !== undefined) rmSync(own, { recursive: true, force: true })
      }))
    )
  })
).pipe(
  Command.withDescription(
    `The supervisor plus a simulated GitLab on fast crons: watch its ${batches.length} batches repair on the dashboard`
  )
)
