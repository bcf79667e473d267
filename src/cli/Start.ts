/**
 * `sweeper start`: the supervisor, as a module of its own so that `npm start` (exactly `sweeper
 * start`) runs it without loading the command line's parser, help renderer and prompts (main.ts
 * routes it here first). At idle they were source text V8 kept for nothing, and the help renderer's
 * `Intl.Segmenter` paged in ICU data. `sweeper start --help` still goes through the command line.
 */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import { configureBatches, redisConfigured, SweeperConfig } from "../config/Config.ts"
import { batches } from "../programs/index.ts"
import { describeBackends } from "../supervisor/App.ts"
import { Supervisor } from "./SupervisorProcess.ts"

export { supervisor } from "./SupervisorProcess.ts"

export const startSupervisor = Effect.gen(function*() {
  const settings = yield* SweeperConfig
  // Refuse bad per-batch variables before opening any database (the scheduler checks them the same way).
  yield* configureBatches(batches)
  const embedded = Option.isNone(settings.databaseUrl) && !redisConfigured(settings)
  yield* Effect.logInfo(
    embedded
      ? "Sweeper starting on the embedded default (no DATABASE_URL / REDIS_URL): PGlite + in-memory Redis"
      : "Sweeper starting",
    describeBackends(settings)
  )
  return yield* Layer.launch(Supervisor)
}).pipe(Effect.withSpan("Cli.start"), Effect.provide(SweeperConfig.layer))

/** The arguments `startSupervisor` runs for without the command line: `start` alone. */
export const isPlainStart = (args: ReadonlyArray<string>): boolean => args.length === 1 && args[0] === "start"
