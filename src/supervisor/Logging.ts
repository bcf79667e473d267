/**
 * Logs go to stderr, so stdout stays clean for `--json` output: one human-readable line per record
 * when stderr is a terminal (time, level, batch, message, key fields), JSON lines otherwise (piped,
 * journald, files) or whenever `SWEEPER_LOG_FORMAT=json`; `SWEEPER_LOG_FORMAT=text` forces the
 * line form. `SWEEPER_LOG_LEVEL` sets the minimum level (default Info).
 *
 * One JSON schema for every line: `timestamp`, `level`, `message` (always a string), `service`
 * ("sweeper"), `node`, then the annotations flat (`batch`, `run_id`, …) and any structured values
 * logged after the message (`Effect.logInfo("Backends", {postgres, redis})` → `postgres`, `redis`).
 * No empty `annotations`/`spans` objects. Every warning is logged: a warning stands for one item or
 * one incident (a hold, a dead-list move, a doomed build), so collapsing repeats would hide all but
 * the first; a source that would repeat itself (a signal staying unknown) says so once on its own.
 */
import * as Config from "effect/Config"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Logger from "effect/Logger"
import * as Option from "effect/Option"
import * as References from "effect/References"
import { hostname } from "node:os"
import { InvalidConfig } from "../domain/Errors.ts"
import { redact } from "../domain/Redaction.ts"

/** Fields every line has; an annotation or value may not overwrite them. */
const RESERVED = new Set(["timestamp", "level", "message", "service", "node", "cause"])

/**
 * A value as a line carries it, every text in it through the one redaction: whatever a log call
 * quotes (a URL in a message, a field, a nested summary, a cause), no password reaches a line.
 */
const plain = (value: unknown, depth = 0): unknown => {
  if (typeof value === "string") return redact(value)
  if (value instanceof Date) return value.toISOString()
  if (typeof value === "bigint") return value.toString()
  if (depth < 8 && Array.isArray(value)) return value.map((item) => plain(item, depth + 1))
  if (depth < 8 && value !== null && typeof value === "object" && Object.getPrototypeOf(value) === Object.prototype) {
    return Object.fromEntries(Object.entries(value).map(([key, item]) => [key, plain(item, depth + 1)]))
  }
  return value
}

export interface LogLine {
  readonly [field: string]: unknown
}

/** Builds one flat line from effect's structured log record. */
export const makeFlattener = (node: string) => {
  return (record: {
    readonly message: unknown
    readonly level: string
    readonly timestamp: string
    readonly cause?: string | undefined
    readonly annotations: Record<string, unknown>
    readonly spans: Record<string, number>
  }): LogLine => {
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
    const message = redact(texts.join(" "))
    const line: Record<string, unknown> = {
      timestamp: record.timestamp,
      level: record.level,
      message,
      service: "sweeper",
      node
    }
    for (const [key, value] of Object.entries(record.annotations)) {
      line[RESERVED.has(key) ? `data_${key}` : key] = plain(value)
    }
    Object.assign(line, fields)
    if (record.cause !== undefined && record.cause.length > 0) line.cause = redact(record.cause)
    return line
  }
}

export const jsonLogger = (
  node: string,
  write: (line: string) => void = (line) => process.stderr.write(`${line}\n`)
) => {
  const flatten = makeFlattener(node)
  return Logger.map(Logger.formatStructured, (record) => {
    const line = flatten(record as Parameters<typeof flatten>[0])
    write(JSON.stringify(line))
  })
}

const LEVEL_COLOUR: Record<string, string> = {
  ERROR: "31",
  FATAL: "31",
  WARN: "33",
  INFO: "32",
  DEBUG: "90",
  TRACE: "90"
}

/** A field's value on a text line: strings bare (quoted when they hold spaces), the rest as JSON. */
const fieldText = (value: unknown): string => {
  if (typeof value === "string") return /[\s"=]/.test(value) || value === "" ? JSON.stringify(value) : value
  return JSON.stringify(value) ?? String(value)
}

/**
 * One line per record for a terminal: `14:50:00.026 INFO  drop-canceling-builds  Run succeeded
 * run=4b36a462 outcome=succeeded duration_ms=19 summary={"dropped":3}`. Service and node are left
 * out (they are the same on every line of one terminal); a cause goes on the lines after.
 */
export const textLine = (line: LogLine, colour = false): string => {
  const { batch, cause, level, message, node: _node, run_id, service: _service, timestamp, ...rest } = line
  const time = typeof timestamp === "string" ? timestamp.slice(11, 23) : ""
  const levelText = String(level ?? "").padEnd(5)
  const shownLevel = colour ? `\u001b[${LEVEL_COLOUR[String(level)] ?? "0"}m${levelText}\u001b[0m` : levelText
  const fields = [
    ...(typeof run_id === "string" ? [`run=${run_id.slice(0, 8)}`] : []),
    ...Object.entries(rest).map(([key, value]) => `${key}=${fieldText(value)}`)
  ]
  const head = [time, shownLevel, typeof batch === "string" ? batch : "-", String(message ?? "")].join("  ")
  const text = fields.length === 0 ? head : `${head}  ${fields.join(" ")}`
  return typeof cause === "string" && cause.length > 0 ? `${text}\n  ${cause.replace(/\n/g, "\n  ")}` : text
}

export const textLogger = (
  node: string,
  write: (line: string) => void = (line) => process.stderr.write(`${line}\n`),
  colour = false
) => {
  const flatten = makeFlattener(node)
  return Logger.map(Logger.formatStructured, (record) => {
    const line = flatten(record as Parameters<typeof flatten>[0])
    write(textLine(line, colour))
  })
}

export type LogFormat = "json" | "text"

/** `SWEEPER_LOG_FORMAT` when set, else text on a terminal and JSON lines anywhere else. */
export const chooseLogFormat = (configured: LogFormat | undefined, isTTY: boolean): LogFormat =>
  configured ?? (isTTY ? "text" : "json")

export const LoggingLive = Layer.unwrap(Effect.gen(function*() {
  const level = yield* Config.LogLevel("SWEEPER_LOG_LEVEL").pipe(
    Config.withDefault("Info"),
    Effect.mapError((error) => new InvalidConfig({ variable: "SWEEPER_LOG_LEVEL", message: error.message }))
  )
  const node = yield* Config.String("SWEEPER_NODE_NAME").pipe(
    Config.withDefault(`${hostname()}:${process.pid}`),
    Effect.orElseSucceed(() => `${hostname()}:${process.pid}`)
  )
  const format = yield* Config.Literals(["json", "text"], "SWEEPER_LOG_FORMAT").pipe(
    Config.option,
    Effect.mapError((error) => new InvalidConfig({ variable: "SWEEPER_LOG_FORMAT", message: error.message }))
  )
  const chosen = chooseLogFormat(Option.getOrUndefined(format), process.stderr.isTTY === true)
  const logger = chosen === "json"
    ? jsonLogger(node)
    : textLogger(node, undefined, process.stderr.isTTY === true && process.env.NO_COLOR === undefined)
  return Layer.mergeAll(
    Logger.layer([logger]),
    Layer.succeed(Logger.LogToStderr, true),
    Layer.succeed(References.MinimumLogLevel, level)
  )
}))
