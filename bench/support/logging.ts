/**
 * The logging benchmarks measure Sweeper with: production's. `sweeper start` logs at Info
 * (SWEEPER_LOG_LEVEL's default) as JSON lines on stderr (supervisor/Logging.ts), and some batches log
 * a line per repair (drop-canceling-builds: one per build, SPEC §2; 100,000 builds write about
 * 32 MB), so a benchmark at Warn measured a quieter Sweeper than the one operators run.
 *
 * The lines go through the production logger (`jsonLogger`) at Info, written synchronously, as
 * Node writes to a stderr redirected to a file or a pipe, into a scratch file rather than the
 * terminal (the figures stay readable; the file is removed at exit). `BENCH_LOG_LEVEL=Warn` measures
 * the quieter Sweeper for comparison; `loggedBytes()` says how much a run wrote.
 */
import { Effect, Layer, Logger, LogLevel, References } from "effect"
import { closeSync, fstatSync, mkdtempSync, openSync, rmSync, writeSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { jsonLogger } from "../../src/supervisor/Logging.ts"

const requested = process.env.BENCH_LOG_LEVEL ?? "Info"
if (!(LogLevel.values as ReadonlyArray<string>).includes(requested)) {
  console.error(`BENCH_LOG_LEVEL: expected one of ${LogLevel.values.join(", ")}, got ${JSON.stringify(requested)}`)
  process.exit(2)
}
/** The minimum level benchmarks run at: production's Info unless BENCH_LOG_LEVEL says otherwise. */
export const benchLogLevel = requested as LogLevel.LogLevel

const dir = mkdtempSync(join(tmpdir(), "sweeper-bench-log-"))
const fd = openSync(join(dir, "sweeper.log"), "a")
process.on("exit", () => {
  closeSync(fd)
  rmSync(dir, { recursive: true, force: true })
})

/** Bytes of log lines written so far by this process. */
export const loggedBytes = (): number => fstatSync(fd).size

/** Production's logger at the bench level, for whatever runs Sweeper's code in this process. */
export const BenchLogging: Layer.Layer<never> = Layer.mergeAll(
  Logger.layer([jsonLogger("bench", (line) => writeSync(fd, `${line}\n`))]),
  Layer.succeed(References.MinimumLogLevel, benchLogLevel)
)

/** `effect` with production's logging (see BenchLogging). */
export const withBenchLogging = <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Effect.provide(effect, BenchLogging)

/** The log level and volume, for a figures line: `Info (31.9 MB logged)`, `Info (12 kB logged)`. */
export const describeLogging = (bytes: number) =>
  `${benchLogLevel} (${
    bytes >= 2 ** 20 ? `${(bytes / 2 ** 20).toFixed(1)} MB` : `${Math.round(bytes / 1024)} kB`
  } logged)`
