/**
 * Entry point for every process: `sweeper <command>` (`npm start` is `sweeper start`).
 *
 * Exit codes: 0 success (a run `succeeded` or was `skipped`), 1 a run `failed`/`timed_out`,
 * 2 bad input (usage, flags, configuration, a disabled batch without --force), 3 infrastructure
 * unreachable (PostgreSQL, Redis, or the running supervisor), 4 a run that succeeded or was
 * skipped but is not fully recorded yet (repair events or its RunFinished still on their way to
 * main's ledger: a decomposed GitLab's relay). Errors are one line on stderr, so stdout stays clean
 * for `--json`.
 */
// Subpaths, not the package barrel: the barrel also loads its Redis client (node-redis, ~480
// modules), WebSocket, cluster and RPC modules, which the supervisor never uses (idle RSS).
import * as NodeRuntime from "@effect/platform-node/NodeRuntime"
import * as NodeServices from "@effect/platform-node/NodeServices"
import * as Cause from "effect/Cause"
import * as ConfigProvider from "effect/ConfigProvider"
import * as Console from "effect/Console"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import * as Runtime from "effect/Runtime"
import { givenValue, invalidInput } from "./cli/InvalidInput.ts"
import { isPlainStart, startSupervisor, supervisor } from "./cli/Start.ts"
import { environment } from "./config/Config.ts"
import { redact } from "./domain/Redaction.ts"
import { LoggingLive } from "./supervisor/Logging.ts"

const fail = (code: 2 | 3, message: string) =>
  Console.error(`sweeper: ${redact(message.replace(/\s*\n\s*/g, " "))}`).pipe(Effect.andThen(Effect.sync(() => {
    process.exitCode = code
  })))

/** Bad input or a busy embedded database: one line on stderr, exit 2. */
const usageError = (message: string) => fail(2, message)

const args = process.argv.slice(2)

// `sweeper start` alone skips the command line's modules (they are loaded only for other commands).
const program = isPlainStart(args)
  ? startSupervisor
  : Effect.flatMap(Effect.promise(() => import("./cli/Cli.ts")), (commandLine) => commandLine.cli(args))

program.pipe(
  Effect.provide(Layer.mergeAll(NodeServices.layer, LoggingLive)),
  // Outermost, so LoggingLive reads the environment the same way: an empty value is not "unset".
  Effect.provideService(ConfigProvider.ConfigProvider, environment),
  Effect.catchTags({
    // ConfigError messages span lines ("…\n  at [\"VAR\"]"): one line keeps the promise above.
    InvalidConfig: (error) =>
      usageError(`invalid configuration: ${invalidInput(error.variable, givenValue(error.variable), error.message)}`),
    UnknownBatch: (error) => usageError(`unknown batch "${error.name}"; known batches: ${error.known.join(", ")}`),
    EmbeddedDatabaseBusy: (error) => usageError(error.message),
    InvalidFlag: (error) => usageError(`${error.flag}: ${error.message}`),
    BatchDisabled: (error) => usageError(error.message),
    RemoteRefusal: (error) => usageError(error.message),
    // Already reported in one line by the presenter above.
    ShowHelp: () =>
      Effect.sync(() => {
        process.exitCode = 2
      }),
    InfrastructureUnavailable: (error) => fail(3, error.message),
    NoSupervisor: (error) => fail(3, error.message),
    NoStoreThere: (error) => fail(3, error.message),
    PortInUse: (error) => usageError(error.message),
    PauseNotRecorded: (error) => fail(3, error.message),
    // The schema is not what Sweeper needs: one line, nothing created.
    SchemaNotMigrated: (error) => usageError(error.message),
    HeavyMigrationPending: (error) => usageError(error.message),
    MissingColumn: (error) => usageError(error.message),
    // A table a batch needs held by neither database, by both, or by the wrong one.
    UnusableLayout: (error) => usageError(error.message)
  }),
  NodeRuntime.runMain({
    // SIGTERM/SIGINT interrupt the supervisor; once its graceful shutdown has run, that is success.
    teardown: (exit, onExit) =>
      supervisor.started && Exit.isFailure(exit) && Cause.hasInterruptsOnly(exit.cause)
        ? onExit(0)
        : Runtime.defaultTeardown(exit, onExit)
  })
)
