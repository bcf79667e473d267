/**
 * The `sweeper` command line: each command parses its flags (CliFlags.ts), asks the Operator —
 * the running supervisor's API or the configured backends, one contract (Operator.ts) — and prints
 * (CliPrint.ts). The process itself is composed in Supervisor.ts; the simulator's commands are in
 * CliSimulator.ts.
 */
import * as Argument from "effect/cli/Argument"
import * as CliOutput from "effect/cli/CliOutput"
import * as Command from "effect/cli/Command"
import * as Flag from "effect/cli/Flag"
import * as Console from "effect/Console"
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { configureBatches, SweeperConfig } from "../config/Config.ts"
import { doctorCommand } from "../doctor/Doctor.ts"
import { refusesLookAhead } from "../domain/Batch.ts"
import { CiDatabase } from "../layers/postgres/Databases.ts"
import { detectSchemaMode } from "../layers/postgres/DatabaseSchema.ts"
import { pendingPlan } from "../layers/postgres/Migrations.ts"
import { batches, batchNames } from "../programs/index.ts"
import { PruneEvents } from "../programs/PruneEvents.ts"
import { databaseClientsLayer, migrateDatabases, pendingDatabases, reachingMain } from "../supervisor/App.ts"
import { attachDashedValues, budgetFlag, instantFlag, intFlag, runIdFlag } from "./CliFlags.ts"
import { printEvent, printRun, printStatus } from "./CliPrint.ts"
import { demo, InvalidFlag, simulateCommand } from "./CliSimulator.ts"
import { invalidInput } from "./InvalidInput.ts"
import * as Operator from "./Operator.ts"
import { shadowCommand } from "./ShadowReport.ts"
import { startSupervisor } from "./Start.ts"

export { supervisor } from "./SupervisorProcess.ts"

/** The API's own cap on one page of events (Http.ts): the CLI asks for no more, on either road. */
const MAX_EVENTS = 1000

const jsonFlag = Flag.Boolean("json").pipe(Flag.withDescription("Print JSON on stdout"), Flag.withDefault(false))
const batchArgument = Argument.Literals("batch", batchNames).pipe(
  Argument.withDescription(`One of: ${batchNames.join(", ")}`)
)

/** Runs `body` with the Operator configuration picks (the supervisor's API, or the backends). */
const withOperator = <A, E, R>(body: Effect.Effect<A, E, R>) => Effect.provide(body, Operator.layer)

/** The same, for a command that only reads: it never creates a store where there is none. */
const withReadingOperator = <A, E, R>(body: Effect.Effect<A, E, R>) => Effect.provide(body, Operator.readingLayer)

const runCommand = Command.make(
  "run",
  {
    batch: batchArgument,
    dryRun: Flag.Boolean("dry-run").pipe(
      Flag.withDescription("Report what would change (up to 100 targets listed); change nothing"),
      Flag.withDefault(false)
    ),
    json: jsonFlag,
    now: instantFlag("now").pipe(
      Flag.withDescription(
        "Judge thresholds at this instant: ISO-8601, or a duration ago (1h); a future one only with --dry-run"
      ),
      Flag.optional
    ),
    budget: budgetFlag("budget").pipe(
      Flag.withDescription("Override the batch's time budget (30s, 5m, \"30 seconds\")"),
      Flag.optional
    ),
    force: Flag.Boolean("force").pipe(
      Flag.withDescription("Run a batch listed in SWEEPER_DISABLED_BATCHES"),
      Flag.withDefault(false)
    )
  },
  Effect.fn("Cli.run")(function*({ batch, dryRun, json, now, budget, force }) {
    // Every batch's variables are checked before anything opens: bad configuration is refused at the edge.
    yield* configureBatches(batches).pipe(Effect.provide(SweeperConfig.layer))
    const asOf = Option.getOrUndefined(now)
    if (refusesLookAhead(asOf, new Date(DateTime.toEpochMillis(yield* DateTime.now)), dryRun)) {
      return yield* new InvalidFlag({
        flag: "--now",
        message: `${asOf!.toISOString()} is in the future; only a --dry-run may look ahead`
      })
    }
    const operator = yield* Operator.Operator
    yield* printRun(yield* operator.run(batch, { dryRun, force, asOf, budget: Option.getOrUndefined(budget) }), json)
  }, withOperator)
).pipe(Command.withDescription("Run one batch once, now, through the run guard"))

// --- schema: `migrate` is the one command that always gets a bare client, so that
// `--plan` can list pending migrations without applying any.
const migrateCommand = Command.make(
  "migrate",
  {
    plan: Flag.Boolean("plan").pipe(
      Flag.withDescription("List pending migrations; apply nothing"),
      Flag.withDefault(false)
    )
  },
  Effect.fn("Cli.migrate")(function*({ plan }) {
    const settings = yield* SweeperConfig
    const migrateOrPlan = Effect.gen(function*() {
      const { mode, source } = yield* detectSchemaMode(settings.schema)
      const modeNote = `${mode} mode, ${source === "detected" ? "detected" : "from SWEEPER_SCHEMA"}`
      if (plan) {
        const ci = yield* CiDatabase
        const ciPending = ci.decomposed
          ? (yield* pendingDatabases(settings)).filter((name) => name.startsWith("ci:"))
          : []
        const pending = [...(yield* pendingPlan(mode)), ...ciPending]
        return yield* Console.log(
          pending.length === 0 ? `Schema is up to date (${modeNote})` : `Pending (${modeNote}): ${pending.join(", ")}`
        )
      }
      const applied = yield* migrateDatabases(settings, "run")
      yield* Console.log(
        applied.length === 0
          ? `Schema is up to date (${modeNote})`
          : `Applied (${modeNote}): ${applied.map(([id, n]) => `${String(id).padStart(4, "0")}_${n}`).join(", ")}`
      )
    })
    return yield* migrateOrPlan.pipe(Effect.provide(databaseClientsLayer(settings)), reachingMain(settings))
  }, Effect.provide(SweeperConfig.layer))
).pipe(Command.withDescription("Apply pending database migrations (--plan: only list them)"))

const events = Command.make(
  "events",
  {
    stream: Flag.String("stream").pipe(Flag.withDescription("Exact stream, e.g. build:123"), Flag.optional),
    type: Flag.String("type").pipe(Flag.withDescription("Event type, e.g. BuildDropped"), Flag.optional),
    run: runIdFlag("run").pipe(Flag.withDescription("Run id (a UUID, as `run --json` prints it)"), Flag.optional),
    since: instantFlag("since").pipe(
      Flag.withDescription("From this instant on: ISO-8601, or a duration ago (1h, 30m, 7d)"),
      Flag.optional
    ),
    until: instantFlag("until").pipe(
      Flag.withDescription("Before this instant: ISO-8601, or a duration ago (1h, 30m, 7d)"),
      Flag.optional
    ),
    limit: intFlag("limit", 1, MAX_EVENTS).pipe(
      Flag.withDescription(`At most this many, the newest (1 to ${MAX_EVENTS})`),
      Flag.withDefault(50)
    ),
    json: jsonFlag
  },
  Effect.fn("Cli.events")(function*({ stream, type, run, since, until, limit, json }) {
    const operator = yield* Operator.Operator
    const found = yield* operator.events({
      stream: Option.getOrUndefined(stream),
      type: Option.getOrUndefined(type),
      runId: Option.getOrUndefined(run),
      since: Option.getOrUndefined(since),
      until: Option.getOrUndefined(until),
      newestFirst: true,
      limit
    })
    for (const event of [...found].reverse()) yield* printEvent(event, json)
  }, withReadingOperator)
).pipe(Command.withDescription("Show recorded events, newest last"))

/**
 * `sweeper events prune --before T`: the prune-events batch run once, through the run guard (its
 * lease, fence, pages and EventsPruned), with the cutoff at exactly T — i.e. judged at
 * T + SWEEPER_EVENT_RETENTION. A T inside the retention period is refused: the events of the last
 * retention period are never pruned. Runs even when prune-events is in SWEEPER_DISABLED_BATCHES:
 * asking for it by name is the operator's explicit decision.
 */
const eventsPrune = Command.make(
  "prune",
  {
    before: instantFlag("before").pipe(
      Flag.withDescription(
        "Prune events strictly older than this instant: ISO-8601, or a duration ago (90d); at least SWEEPER_EVENT_RETENTION ago"
      )
    ),
    dryRun: Flag.Boolean("dry-run").pipe(
      Flag.withDescription("Report how many events would be pruned; delete nothing"),
      Flag.withDefault(false)
    ),
    json: jsonFlag
  },
  Effect.fn("Cli.eventsPrune")(
    function*({ before, dryRun, json }) {
      const settings = yield* SweeperConfig
      const retentionMs = Duration.toMillis(settings.eventRetention)
      const newestAllowed = DateTime.toEpochMillis(yield* DateTime.now) - retentionMs
      if (before.getTime() > newestAllowed) {
        return yield* new InvalidFlag({
          flag: "--before",
          message: `${before.toISOString()} is within the retention period (SWEEPER_EVENT_RETENTION ${
            Duration.format(settings.eventRetention)
          }): only events before ${new Date(newestAllowed).toISOString()} may be pruned`
        })
      }
      const operator = yield* Operator.Operator
      yield* printRun(
        yield* operator.run(PruneEvents.name, { dryRun, force: true, asOf: new Date(before.getTime() + retentionMs) }),
        json
      )
    },
    withOperator,
    Effect.provide(SweeperConfig.layer)
  )
).pipe(
  Command.withDescription(
    "Delete events older than --before (outside the retention period), keeping the events each batch's state is folded from"
  )
)

const status = Command.make(
  "status",
  { json: jsonFlag },
  Effect.fn("Cli.status")(function*({ json }) {
    yield* printStatus(yield* (yield* Operator.Operator).views, json)
  }, withReadingOperator)
).pipe(Command.withDescription("Each batch's state, schedule, next tick and last run"))

const pauseOrResume = (action: "pause" | "resume") =>
  Command.make(
    action,
    { batch: batchArgument },
    Effect.fn(`Cli.${action}`)(function*({ batch }) {
      // The event is the state: every supervisor folds it before its next tick.
      yield* (yield* Operator.Operator).setPaused(batch, action)
      yield* Console.log(`${batch} ${action === "pause" ? "paused" : "resumed"}`)
    }, withOperator)
  ).pipe(Command.withDescription(
    action === "pause"
      ? "Stop a batch's scheduled ticks until resumed (manual runs still go)"
      : "Let a paused batch's ticks run again"
  ))

const start = Command.make("start", {}, () => startSupervisor).pipe(
  Command.withDescription("Run the supervisor: every batch on its schedule, plus the HTTP server")
)

export const sweeper = Command.make("sweeper").pipe(
  Command.withDescription("Finds and repairs stuck state in a GitLab-style platform"),
  Command.withSubcommands([
    start,
    runCommand,
    status,
    pauseOrResume("pause"),
    pauseOrResume("resume"),
    migrateCommand,
    events.pipe(Command.withSubcommands([eventsPrune])),
    doctorCommand,
    shadowCommand,
    simulateCommand,
    demo
  ])
)

/**
 * Commands that run on their own and also have subcommands: their usage shows the subcommand as
 * optional (effect's help marks every subcommand mandatory).
 */
export const OPTIONAL_SUBCOMMANDS: ReadonlySet<string> = new Set(["sweeper events"])

/** `sweeper help [command…]` is `sweeper [command…] --help`, the spelling many tools accept. */
export const helpAsFlag = (args: ReadonlyArray<string>): ReadonlyArray<string> =>
  args[0] === "help" ? [...args.slice(1), "--help"] : args

/**
 * effect/cli prints the whole help on stdout for a parse error; an operator piping `--json` gets
 * one line on stderr instead (`--help` still prints the help on stdout).
 */
const Presenter = CliOutput.layerPresenter({
  present: (shown) => {
    const event = shown._tag === "Help" && OPTIONAL_SUBCOMMANDS.has(shown.commandPath.join(" "))
      ? {
        ...shown,
        helpDoc: { ...shown.helpDoc, usage: shown.helpDoc.usage.replace(" <subcommand>", " [<subcommand>]") }
      }
      : shown
    switch (event._tag) {
      case "InvalidInvocation": {
        const error = event.errors[0]
        const first = error?._tag === "InvalidValue"
          ? `invalid ${error.kind}: ${
            invalidInput(error.kind === "flag" ? `--${error.option}` : error.option, error.value, error.expected)
          }`
          : error?.message.split("\n")[0] ?? "invalid invocation"
        return Console.error(`sweeper: ${first} (see: ${event.commandPath.join(" ")} --help)`)
      }
      case "Help":
        return event.reason === "Implicit"
          ? Effect.gen(function*() {
            const formatter = yield* CliOutput.Formatter
            yield* Console.error(formatter.formatHelpDoc(event.helpDoc))
          })
          : CliOutput.defaultPresenter.present(event)
      default:
        return CliOutput.defaultPresenter.present(event)
    }
  }
})

/** Runs the command `args` names (`process.argv` without node and the script). */
export const cli = (args: ReadonlyArray<string>) =>
  Effect.suspend(() => Command.runWith(sweeper, { version: "0.1.0" })(attachDashedValues(helpAsFlag(args)))).pipe(
    Effect.provide(Presenter)
  )
