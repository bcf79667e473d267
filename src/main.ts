/**
 * Entry point for every process: `sweeper <command>` (`npm start` is `sweeper start`).
 * Configuration errors print one line naming the variable and exit 2.
 */
import { NodeRuntime, NodeServices } from "@effect/platform-node"
import { Console, Effect } from "effect"
import { Cause, Exit, Runtime } from "effect"
import { cli, supervisor } from "./runtime/Cli.ts"
import { LoggingLive } from "./runtime/Logging.ts"

cli.pipe(
  Effect.provide(NodeServices.layer),
  Effect.provide(LoggingLive),
  Effect.catchTags({
    InvalidConfig: (error) =>
      // ConfigError messages span lines ("…\n  at [\"VAR\"]"): one line keeps the promise above.
      Console.error(`sweeper: invalid configuration: ${error.variable}: ${error.message.replace(/\s*\n\s*/g, " ")}`).pipe(
        Effect.andThen(Effect.sync(() => { process.exitCode = 2 }))
      ),
    UnknownBatch: (error) =>
      Console.error(`sweeper: unknown batch "${error.name}"; known batches: ${error.known.join(", ")}`).pipe(
        Effect.andThen(Effect.sync(() => { process.exitCode = 2 }))
      ),
    EmbeddedDatabaseBusy: (error) =>
      Console.error(`sweeper: ${error.message}`).pipe(
        Effect.andThen(Effect.sync(() => { process.exitCode = 2 }))
      ),
    InvalidFlag: (error) =>
      Console.error(`sweeper: ${error.flag}: ${error.message}`).pipe(
        Effect.andThen(Effect.sync(() => { process.exitCode = 2 }))
      )
  }),
  NodeRuntime.runMain({
    // SIGTERM/SIGINT interrupt the supervisor; once its graceful shutdown has run, that is success.
    teardown: (exit, onExit) =>
      supervisor.started && Exit.isFailure(exit) && Cause.hasInterruptsOnly(exit.cause)
        ? onExit(0)
        : Runtime.defaultTeardown(exit, onExit)
  })
)
