/**
 * Entry point for every process: `sweeper <command>` (`npm start` is `sweeper start`).
 * Configuration errors print one line naming the variable and exit 2.
 */
import { NodeRuntime, NodeServices } from "@effect/platform-node"
import { Cause, ConfigProvider, Console, Effect, Exit, Runtime } from "effect"
import { environment } from "./layers/Config.ts"
import { cli, supervisor } from "./runtime/Cli.ts"
import { LoggingLive } from "./runtime/Logging.ts"

/** Bad input or a busy embedded database: one line on stderr, exit 2. */
const usageError = (message: string) =>
  Console.error(`sweeper: ${message}`).pipe(Effect.andThen(Effect.sync(() => { process.exitCode = 2 })))

cli.pipe(
  Effect.provide(NodeServices.layer),
  Effect.provide(LoggingLive),
  // Outermost, so LoggingLive reads the environment the same way: an empty value is not "unset".
  Effect.provideService(ConfigProvider.ConfigProvider, environment),
  Effect.catchTags({
    // ConfigError messages span lines ("…\n  at [\"VAR\"]"): one line keeps the promise above.
    InvalidConfig: (error) =>
      usageError(`invalid configuration: ${error.variable}: ${error.message.replace(/\s*\n\s*/g, " ")}`),
    UnknownBatch: (error) => usageError(`unknown batch "${error.name}"; known batches: ${error.known.join(", ")}`),
    EmbeddedDatabaseBusy: (error) => usageError(error.message),
    InvalidFlag: (error) => usageError(`${error.flag}: ${error.message}`)
  }),
  NodeRuntime.runMain({
    // SIGTERM/SIGINT interrupt the supervisor; once its graceful shutdown has run, that is success.
    teardown: (exit, onExit) =>
      supervisor.started && Exit.isFailure(exit) && Cause.hasInterruptsOnly(exit.cause)
        ? onExit(0)
        : Runtime.defaultTeardown(exit, onExit)
  })
)
