/**
 * Logs go to stderr, so stdout stays clean for `--json` output: JSON lines by default, pretty when
 * stderr is a terminal. `SWEEPER_LOG_LEVEL` sets the minimum level (default Info).
 *
 * One JSON schema for every line: `timestamp`, `level`, `message` (always a string), `service`
 * ("sweeper"), `node`, then the annotations flat (`batch`, `run_id`, …) and any structured values
 * logged after the message (`Effect.logInfo("Backends", {postgres, redis})` → `postgres`, `redis`).
 * No empty `annotations`/`spans` objects. The same warning is logged at most once per run.
 */
import { Config, Effect, Layer, Logger, References } from "effect"
import { hostname } from "node:os"
import { InvalidConfig } from "../domain/Errors.ts"

/** Fields every line has; an annotation or value may not overwrite them. */
const RESERVED = new Set(["timestamp", "level", "message", "service", "node", "cause"])

const plain = (value: unknown): unknown => {
  if (value instanceof Date) return value.toISOString()
  if (typeof value === "bigint") return value.toString()
  return value
}

/** How many (run, warning) pairs are remembered for de-duplication before the oldest are dropped. */
const SEEN_LIMIT = 10_000

export interface LogLine {
  readonly [field: string]: unknown
}

/**
 * Builds one flat line from effect's structured log record; undefined when it repeats a warning
 * already logged in the same run.
 */
export const makeFlattener = (node: string) => {
  const seen = new Set<string>()
  return (record: {
    readonly message: unknown
    readonly level: string
    readonly timestamp: string
    readonly cause?: string | undefined
    readonly annotations: Record<string, unknown>
    readonly spans: Record<string, number>
  }): LogLine | undefined => {
    const parts = Array.isArray(record.message) ? record.message : [record.message]
    const texts: Array<string> = []
    const fields: Record<string, unknown> = {}
    for (const part of parts) {
      if (typeof part === "string") texts.push(part)
      else if (part !== null && typeof part === "object" && !Array.isArray(part)) {
        for (const [key, value] of Object.entries(part)) fields[RESERVED.has(key) ? `data_${key}` : key] = plain(value)
      } else if (part !== undefined) {
        // A bare list or scalar after the message: one `details` field rather than a mixed-type message.
        fields.details = fields.details === undefined ? plain(part) : [fields.details, plain(part)].flat()
      }
    }
    const message = texts.join(" ")
    const line: Record<string, unknown> = {
      timestamp: record.timestamp,
      level: record.level,
      message,
      service: "sweeper",
      node
    }
    for (const [key, value] of Object.entries(record.annotations)) line[RESERVED.has(key) ? `data_${key}` : key] = plain(value)
    Object.assign(line, fields)
    if (record.cause !== undefined && record.cause.length > 0) line.cause = record.cause
    if (record.level === "WARN" && typeof line.run_id === "string") {
      const key = `${line.run_id}\u0000${message}`
      if (seen.has(key)) return undefined
      if (seen.size >= SEEN_LIMIT) seen.delete(seen.values().next().value!)
      seen.add(key)
    }
    return line
  }
}

export const jsonLogger = (node: string, write: (line: string) => void = (line) => process.stderr.write(`${line}\n`)) => {
  const flatten = makeFlattener(node)
  return Logger.map(Logger.formatStructured, (record) => {
    const line = flatten(record as Parameters<typeof flatten>[0])
    if (line !== undefined) write(JSON.stringify(line))
  })
}

export const LoggingLive = Layer.unwrap(Effect.gen(function*() {
  const level = yield* Config.LogLevel("SWEEPER_LOG_LEVEL").pipe(
    Config.withDefault("Info"),
    Effect.mapError((error) => new InvalidConfig({ variable: "SWEEPER_LOG_LEVEL", message: error.message }))
  )
  const node = yield* Config.String("SWEEPER_NODE_NAME").pipe(
    Config.withDefault(`${hostname()}:${process.pid}`),
    Effect.orElseSucceed(() => `${hostname()}:${process.pid}`)
  )
  const logger = process.stderr.isTTY ? Logger.consolePretty() : jsonLogger(node)
  return Layer.mergeAll(
    Logger.layer([logger]),
    Layer.succeed(Logger.LogToStderr, true),
    Layer.succeed(References.MinimumLogLevel, level)
  )
}))
