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
  Effect.catchTags({
    InvalidConfig: (error) =>
      Console.error(`sweeper: invalid configuration: ${error.variable}: ${error.message}`).pipe(
        Effect.andThen(Effect.sync(() => { process.exitCode = 2 }))
      ),
    UnknownBatch: (error) =>
      Console.error(`sweeper: unknown batch "${error.name}"; known batches: ${error.known.join(", ")}`).pipe(
        Effect.andThen(Effect.sync(() => { process.exitCode = 2 }))
      ),
    InvalidFlag: (error) =>
      Console.error(`sweeper: ${error.flag}: ${error.message}`).pipe(
        Effect.andThen(Effect.sync(() => { process.exitCode = 2 }))
      )
  }),
  Effect.provide(NodeServices.layer),
  Effect.provide(LoggingLive),
  NodeRuntime.runMain({
    // SIGTERM/SIGINT interrupt the supervisor; once its graceful shutdown has run, that is success.
    teardown: (exit, onExit) =>
      supervisor.started && Exit.isFailure(exit) && Cause.hasInterruptsOnly(exit.cause)
        ? onExit(0)
        : Runtime.defaultTeardown(exit, onExit)
  })
)
