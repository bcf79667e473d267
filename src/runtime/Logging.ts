/**
 * Logs go to stderr, so stdout stays clean for `--json` output: JSON lines by default, pretty when
 * stderr is a terminal. `SWEEPER_LOG_LEVEL` sets the minimum level (default Info).
 */
import { Config, Effect, Layer, Logger, References } from "effect"
import { InvalidConfig } from "../domain/Errors.ts"

export const LoggingLive = Layer.unwrap(Effect.gen(function*() {
  const level = yield* Config.LogLevel("SWEEPER_LOG_LEVEL").pipe(
    Config.withDefault("Info"),
    Effect.mapError((error) => new InvalidConfig({ variable: "SWEEPER_LOG_LEVEL", message: error.message }))
  )
  const logger = process.stderr.isTTY ? Logger.consolePretty() : Logger.withConsoleError(Logger.formatJson)
  return Layer.mergeAll(
    Logger.layer([logger]),
    Layer.succeed(Logger.LogToStderr, true),
    Layer.succeed(References.MinimumLogLevel, level)
  )
}))
