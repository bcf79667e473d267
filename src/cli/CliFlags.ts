/**
 * Every value flag of the `sweeper` CLI, parsed by effect's CLI module through a schema: a bad value
 * (negative, zero where it means nothing, a fraction, huge, empty, garbage) is refused while the
 * command line is parsed, as one line and exit 2, before anything opens a database.
 */
import * as Flag from "effect/cli/Flag"
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import * as SchemaIssue from "effect/SchemaIssue"
import * as SchemaTransformation from "effect/SchemaTransformation"
import { isRunId } from "../domain/Events.ts"

const UNITS: Record<string, number> = {
  ms: 1,
  milli: 1,
  millis: 1,
  millisecond: 1,
  milliseconds: 1,
  s: 1000,
  sec: 1000,
  secs: 1000,
  second: 1000,
  seconds: 1000,
  m: 60_000,
  min: 60_000,
  mins: 60_000,
  minute: 60_000,
  minutes: 60_000,
  h: 3_600_000,
  hour: 3_600_000,
  hours: 3_600_000,
  d: 86_400_000,
  day: 86_400_000,
  days: 86_400_000,
  w: 604_800_000,
  week: 604_800_000,
  weeks: 604_800_000
}
const DURATION = /^(\d+(?:\.\d+)?)\s*([a-z]+)$/

/** Nothing Sweeper does is measured in more than a few years: beyond this a value is a typo. */
const MAX_DURATION = Duration.days(3660)

/** `30s`, `250ms`, `5m`, `1h`, `7d` and the spelling the env vars use: `30 seconds`, `5 minutes`. */
export const parseDuration = (input: string): Option.Option<Duration.Duration> => {
  const match = DURATION.exec(input.trim().toLowerCase())
  const unit = match?.[2] === undefined ? undefined : UNITS[match[2]]
  return match === null || unit === undefined ? Option.none() : Option.some(Duration.millis(Number(match[1]) * unit))
}

const issue = (input: string, message: string) => new SchemaIssue.InvalidValue({ message }, input)

/**
 * A duration of at most MAX_DURATION, written `30s`, `5m`, `1h`, `7d` or `30 seconds`: positive,
 * or also zero where zero means something (`--budget 0s`: exactly one unit of work).
 */
const durationText = (options: { readonly allowZero: boolean }) =>
  Schema.String.pipe(Schema.decodeTo(
    Schema.Duration,
    SchemaTransformation.transformEffect({
      decode: (input) =>
        Option.match(parseDuration(input), {
          onNone: () =>
            Effect.fail(issue(input, `expected a duration like 30s, 5m, 1h, 7d or "30 seconds", got "${input}"`)),
          onSome: (duration) =>
            Duration.toMillis(duration) < 0 || (!options.allowZero && Duration.toMillis(duration) === 0)
              ? Effect.fail(
                issue(input, `expected a ${options.allowZero ? "non-negative" : "positive"} duration, got "${input}"`)
              )
              : Duration.isGreaterThan(duration, MAX_DURATION)
              ? Effect.fail(issue(input, `expected at most ${Duration.format(MAX_DURATION)}, got "${input}"`))
              : Effect.succeed(duration)
        }),
      encode: (duration) => Effect.succeed(`${Duration.toMillis(duration)}ms`)
    })
  ))

export const DurationText = durationText({ allowZero: false })
/** A run's budget: `0s` is a budget too (the run does one unit of work and stops). */
export const BudgetText = durationText({ allowZero: true })

const ISO = /^\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?$/

/**
 * An instant: ISO-8601 (`2026-01-01T05:00:00Z`, `2026-01-01`), or a duration meaning that long ago
 * (`1h`, `30m`, `7d`), read from the Clock when the command line is parsed.
 */
export const InstantText = Schema.String.pipe(Schema.decodeTo(
  Schema.Date,
  SchemaTransformation.transformEffect({
    decode: (input) =>
      Effect.gen(function*() {
        const text = input.trim()
        if (ISO.test(text)) {
          const date = new Date(text)
          if (!Number.isNaN(date.getTime())) return date
        }
        const ago = parseDuration(text)
        if (Option.isNone(ago)) {
          return yield* Effect.fail(
            issue(
              input,
              `expected an ISO-8601 instant (2026-01-01T05:00:00Z) or a duration ago (1h, 30m, 7d), got "${input}"`
            )
          )
        }
        const duration = yield* Schema.decodeEffect(DurationText)(text).pipe(Effect.mapError((e) => e.issue))
        return new Date(DateTime.toEpochMillis(yield* DateTime.now) - Duration.toMillis(duration))
      }),
    encode: (date) => Effect.succeed(date.toISOString())
  })
))

/** A whole number in [min, max]: the range says where the flag means something. */
export const intFlag = (name: string, min: number, max: number) =>
  Flag.Int(name).pipe(
    Flag.filter((n) => Number.isSafeInteger(n) && n >= min && n <= max, (n) =>
      `expected a whole number from ${min} to ${max}, got ${n}`)
  )

/** `--run`: a run id as the run guard makes them (a UUID), refused as one line otherwise. */
export const runIdFlag = (name: string) =>
  Flag.String(name).pipe(
    Flag.filter(
      isRunId,
      (text) => `expected a run id (a UUID like 0f8a1c2e-5b7d-4e9a-9c3f-2a6b8d4e1f70), got "${text}"`
    )
  )

export const durationFlag = (name: string) => Flag.String(name).pipe(Flag.withSchema(DurationText))
export const budgetFlag = (name: string) => Flag.String(name).pipe(Flag.withSchema(BudgetText))
export const instantFlag = (name: string) => Flag.String(name).pipe(Flag.withSchema(InstantText))

/** The flags that take a value which may be written with a leading minus sign. */
const VALUE_FLAGS = new Set(["--limit", "--since", "--until", "--budget", "--before", "--rate", "--duration", "--now"])

/**
 * `--since -1h` is the value `-1h` for `--since`, not the short flags `-1 -h` (which would print the
 * help and exit 0): such a value is attached as `--since=-1h`, so the flag's own parser judges it
 * and refuses it in one line.
 */
export const attachDashedValues = (args: ReadonlyArray<string>): ReadonlyArray<string> => {
  const out: Array<string> = []
  for (let i = 0; i < args.length; i++) {
    const arg = args[i]!
    const next = args[i + 1]
    if (VALUE_FLAGS.has(arg) && next !== undefined && /^-[\d.]/.test(next)) {
      out.push(`${arg}=${next}`)
      i++
    } else {
      out.push(arg)
    }
  }
  return out
}
