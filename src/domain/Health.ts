/**
 * The health gate's rules, pure: what `SWEEPER_HEALTH` says, how a reading compares with
 * a threshold, the hysteresis between `stop` and `resume`, relative baselines (a signal's own
 * median over the last hour) and the throttled concurrency limit. The layer
 * (src/layers/health/HealthGateLive.ts) reads the signals and keeps the state; everything it decides is
 * decided here, so a spec can walk every transition under TestClock.
 *
 * Units, fixed per signal so a gauge and a threshold always agree: sizes in bytes, durations in
 * seconds, WAL rate in bytes per second, Redis memory as a used/max ratio, autovacuum as the number
 * of the batch's tables being vacuumed, a Prometheus rule in whatever its query returns.
 */
import * as ByteSize from "effect/ByteSize"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Result from "effect/Result"
import * as Schema from "effect/Schema"
import * as SchemaGetter from "effect/SchemaGetter"
import * as SchemaIssue from "effect/SchemaIssue"
import { type DatabaseName, databaseOfTable, databaseOfWrites } from "./Databases.ts"

/** GitLab's Redis stores, by the names the Redis layer gives them. */
export type RedisStoreName = "sharedState" | "queues" | "queuesMetadata"

/** Whether a subject names one of the Redis stores (a redisMemory slot's subject always does). */
export const isRedisStoreName: (subject: string) => subject is RedisStoreName = Schema.is(
  Schema.Literals(["sharedState", "queues", "queuesMetadata"])
)

/** What a batch unknown to the gate writes: nothing, so no rule applies to it. */
export const NO_WRITES: WriteSet = { tables: [], redisStores: [], queues: [], databases: [] }

export type Comparison = "<" | "<=" | ">" | ">="

/** A number, or a multiple of the signal's own median over the last hour (`"3x"`). */
export type Bound =
  | { readonly _tag: "Absolute"; readonly value: number }
  | { readonly _tag: "Relative"; readonly factor: number }

export interface Threshold {
  readonly op: Comparison
  readonly bound: Bound
  /** As configured (`"64MB"`, `"3x"`, `"< 0.99"`), for events, logs and the dashboard. */
  readonly text: string
}

export type Unit = "bytes" | "seconds" | "bytes/s" | "ratio" | "tables" | "value"

/** Where a rule's reading comes from. */
export type Source =
  | { readonly _tag: "ReplicationLag"; readonly measure: "bytes" | "seconds" }
  | { readonly _tag: "WalRate" }
  | { readonly _tag: "Autovacuum" }
  | { readonly _tag: "LongTransactions" }
  | { readonly _tag: "RedisMemory" }
  | { readonly _tag: "QueueLatency" }
  | { readonly _tag: "Prometheus"; readonly url: string; readonly query: string }

export type OnUnknown = "hold" | "healthy"

export interface SignalRule {
  /** The configuration key (`replicationLag`), or a Prometheus rule's `name`. */
  readonly signal: string
  readonly source: Source
  /** Holds when the reading satisfies it. */
  readonly stop: Threshold
  /** A held signal releases when the reading satisfies it (hysteresis: never inside `stop`). */
  readonly resume: Threshold
  readonly onUnknown: OnUnknown
  readonly unit: Unit
}

export interface HealthConfig {
  readonly rules: ReadonlyArray<SignalRule>
  /** concurrency-limit-resume throttles positive limits on PostgreSQL/Prometheus signals instead of holding. */
  readonly throttleLimits: boolean
}

/** How often a held batch re-checks, and the most often any signal is read per process. */
export const RECHECK_INTERVAL = Duration.seconds(1)
/** A relative threshold's baseline: the signal's median over this window. */
export const BASELINE_WINDOW = Duration.hours(1)

// ---------------------------------------------------------------------------------------------
// Parsing thresholds
// ---------------------------------------------------------------------------------------------

const SHORT_DURATION = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$/
const SHORT_UNITS: Record<string, number> = { ms: 0.001, s: 1, m: 60, h: 3600, d: 86400 }

/** `"10s"`, `"5m"`, `"1h"` (GitLab's and Prometheus' shorthand) or effect's `"10 seconds"`, in seconds. */
export const parseSeconds = (text: string): Option.Option<number> => {
  const short = SHORT_DURATION.exec(text)
  if (short !== null) return Option.some(Number(short[1]) * SHORT_UNITS[short[2]!]!)
  return Option.map(Duration.fromInput(text as Duration.Input), (d) => Duration.toMillis(d) / 1000)
}

/** `"64MB"` (10^6), `"64MiB"` (2^20), `"512kB"`, in bytes. */
export const parseBytes = (text: string): Option.Option<number> =>
  Option.map(ByteSize.fromString(text.trim()), (size) => Number(ByteSize.toBigInt(size)))

const RELATIVE = /^\s*(\d+(?:\.\d+)?)\s*x\s*$/
const COMPARISON = /^\s*(<=|>=|<|>)\s*(-?\d+(?:\.\d+)?(?:e[+-]?\d+)?)\s*$/i

const above = (value: number, text: string): Threshold => ({ op: ">", bound: { _tag: "Absolute", value }, text })
const atOrUnder = (value: number, text: string): Threshold => ({ op: "<=", bound: { _tag: "Absolute", value }, text })

type Parsed<A> = Result.Result<A, string>
const bad = (path: string, expected: string, got: unknown): Parsed<never> =>
  Result.fail(`${path}: expected ${expected}, got ${JSON.stringify(got)}`)

/** A size or a duration; `replicationLag` accepts either (bytes behind, or replay_lag). */
const sizeOrDuration = (path: string, text: string): Parsed<{ measure: "bytes" | "seconds"; value: number }> => {
  const bytes = parseBytes(text)
  if (Option.isSome(bytes)) return Result.succeed({ measure: "bytes", value: bytes.value })
  const seconds = parseSeconds(text)
  if (Option.isSome(seconds)) return Result.succeed({ measure: "seconds", value: seconds.value })
  return bad(path, `a size like "64MB" or a duration like "10s"`, text)
}

const rate = (path: string, text: string): Parsed<Bound> => {
  const relative = RELATIVE.exec(text)
  if (relative !== null) {
    const factor = Number(relative[1])
    return factor > 0 ? Result.succeed({ _tag: "Relative", factor }) : bad(path, "a factor above 0", text)
  }
  const perSecond = /^(.*)\/s$/.exec(text.trim())
  const bytes = perSecond === null ? Option.none() : parseBytes(perSecond[1]!)
  return Option.isSome(bytes)
    ? Result.succeed({ _tag: "Absolute", value: bytes.value })
    : bad(path, `a rate like "48MB/s" or a multiple of its median like "3x"`, text)
}

const duration = (path: string, text: string): Parsed<number> =>
  Option.match(parseSeconds(text), { onNone: () => bad(path, `a duration like "10m"`, text), onSome: Result.succeed })

const comparison = (path: string, text: string): Parsed<Threshold> => {
  const match = COMPARISON.exec(text)
  if (match === null) return bad(path, `a comparison like "< 0.99" or ">= 0.995"`, text)
  return Result.succeed({
    op: match[1] as Comparison,
    bound: { _tag: "Absolute", value: Number(match[2]) },
    text: text.trim()
  })
}

/**
 * A rule written without `resume` still gets hysteresis, else a reading hovering at the stop
 * threshold would hold and release on every unit. The defaults: half of stop for sizes, durations
 * and rates (`8MB` → `4MB`, `3x` → `1.5x`: a clear recovery, yet reachable on a busy platform);
 * 0.05 under stop for Redis memory, half of a stop of 0.1 or less (a ratio that sits near a steady
 * level, which half would never reach); one part in a thousand past stop for a Prometheus rule,
 * whose scale Sweeper cannot know (`< 0.99` → `>= 0.99099`).
 */
export const HALF_OF_STOP = 0.5
export const REDIS_MEMORY_GAP = 0.05
export const PROMETHEUS_GAP = 0.001

const halfText = (value: number, kind: "bytes" | "seconds" | "rate" | "factor"): string => {
  const half = value * HALF_OF_STOP
  switch (kind) {
    case "bytes":
      return `${Math.round(half)}B`
    case "seconds":
      return `${half}s`
    case "rate":
      return `${Math.round(half)}B/s`
    case "factor":
      return `${half}x`
  }
}

/**
 * Whether a `resume` leaves a gap or meets `stop` without overlapping it: a value that releases
 * a hold must never be one that holds (else the gate would release and hold on every check).
 */
const hysteresisOk = (stop: Threshold, resume: Threshold): boolean => {
  const below = (op: Comparison) => op === "<" || op === "<="
  if (below(stop.op) === below(resume.op)) return false
  if (stop.bound._tag !== resume.bound._tag) return false
  const s = stop.bound._tag === "Absolute" ? stop.bound.value : stop.bound.factor
  const r = resume.bound._tag === "Absolute" ? resume.bound.value : resume.bound.factor
  // stop "> s" (hold above) needs resume "<= r" with r <= s; stop "< s" needs resume ">= r" with r >= s.
  if (below(stop.op)) return r > s || (r === s && !(stop.op === "<=" && resume.op === ">="))
  return r < s || (r === s && !(stop.op === ">=" && resume.op === "<="))
}

// ---------------------------------------------------------------------------------------------
// SWEEPER_HEALTH
// ---------------------------------------------------------------------------------------------

const OnUnknownField = Schema.optionalKey(Schema.Literals(["hold", "healthy"]))
const Strict = { parseOptions: { onExcessProperty: "error" } } as const

const TextRule = Schema.Struct({
  stop: Schema.String,
  resume: Schema.optionalKey(Schema.String),
  onUnknown: OnUnknownField
})

/** The JSON as written; thresholds are still text here. Unknown keys are refused (a typo must not disable a signal). */
export const RawHealth = Schema.Struct({
  replicationLag: Schema.optionalKey(TextRule),
  walRate: Schema.optionalKey(TextRule),
  autovacuum: Schema.optionalKey(Schema.Struct({ stop: Schema.Literal(true), onUnknown: OnUnknownField })),
  longTransactions: Schema.optionalKey(TextRule),
  redisMemory: Schema.optionalKey(Schema.Struct({
    stop: Schema.Number.check(Schema.isBetween({ minimum: 0, maximum: 1, exclusiveMinimum: true })),
    resume: Schema.optionalKey(Schema.Number.check(Schema.isBetween({ minimum: 0, maximum: 1 }))),
    onUnknown: OnUnknownField
  })),
  queueLatency: Schema.optionalKey(TextRule),
  prometheus: Schema.optionalKey(Schema.Struct({
    url: Schema.String.check(Schema.isPattern(/^https?:\/\/\S+$/, { message: "expected an http(s) URL" })),
    onUnknown: OnUnknownField,
    rules: Schema.Array(Schema.Struct({
      name: Schema.String.check(
        Schema.isPattern(/^[A-Za-z_][A-Za-z0-9_]*$/, { message: "expected a name like patroniApdex" })
      ),
      query: Schema.String.check(Schema.isNonEmpty()),
      stop: Schema.String,
      resume: Schema.optionalKey(Schema.String),
      onUnknown: OnUnknownField
    }))
  })),
  throttleLimits: Schema.optionalKey(Schema.Boolean)
})
export type RawHealth = typeof RawHealth.Type

const KNOWN_KEYS = [
  "replicationLag",
  "walRate",
  "autovacuum",
  "longTransactions",
  "redisMemory",
  "queueLatency",
  "prometheus",
  "throttleLimits"
]

/** The decoded JSON compiled into rules; the first problem as one line naming its path. */
export const compileHealth = (raw: RawHealth): Parsed<HealthConfig> => {
  const rules: Array<SignalRule> = []
  const onUnknown = (value: OnUnknown | undefined): OnUnknown => value ?? "healthy"
  const withResume = (signal: string, stop: Threshold, resume: Threshold): Parsed<void> =>
    hysteresisOk(stop, resume)
      ? Result.succeed(undefined)
      : Result.fail(
        `${signal}.resume: ${JSON.stringify(resume.text)} must be on the healthy side of stop ${
          JSON.stringify(stop.text)
        }`
      )

  if (raw.replicationLag !== undefined) {
    const stop = sizeOrDuration("replicationLag.stop", raw.replicationLag.stop)
    if (Result.isFailure(stop)) return Result.fail(stop.failure)
    const resumeText = raw.replicationLag.resume ??
      halfText(stop.success.value, stop.success.measure)
    const resume = sizeOrDuration("replicationLag.resume", resumeText)
    if (Result.isFailure(resume)) return Result.fail(resume.failure)
    if (resume.success.measure !== stop.success.measure) {
      return Result.fail(
        `replicationLag.resume: ${JSON.stringify(resumeText)} must be a ${
          stop.success.measure === "bytes" ? "size" : "duration"
        } like stop`
      )
    }
    const rule: SignalRule = {
      signal: "replicationLag",
      source: { _tag: "ReplicationLag", measure: stop.success.measure },
      stop: above(stop.success.value, raw.replicationLag.stop),
      resume: atOrUnder(resume.success.value, resumeText),
      onUnknown: onUnknown(raw.replicationLag.onUnknown),
      unit: stop.success.measure
    }
    const ok = withResume("replicationLag", rule.stop, rule.resume)
    if (Result.isFailure(ok)) return Result.fail(ok.failure)
    rules.push(rule)
  }
  if (raw.walRate !== undefined) {
    const stop = rate("walRate.stop", raw.walRate.stop)
    if (Result.isFailure(stop)) return Result.fail(stop.failure)
    const resumeText = raw.walRate.resume ?? (stop.success._tag === "Relative"
      ? halfText(stop.success.factor, "factor")
      : halfText(stop.success.value, "rate"))
    const resume = rate("walRate.resume", resumeText)
    if (Result.isFailure(resume)) return Result.fail(resume.failure)
    const rule: SignalRule = {
      signal: "walRate",
      source: { _tag: "WalRate" },
      stop: { op: ">", bound: stop.success, text: raw.walRate.stop },
      resume: { op: "<=", bound: resume.success, text: resumeText },
      onUnknown: onUnknown(raw.walRate.onUnknown),
      unit: "bytes/s"
    }
    const ok = withResume("walRate", rule.stop, rule.resume)
    if (Result.isFailure(ok)) return Result.fail(ok.failure)
    rules.push(rule)
  }
  if (raw.autovacuum !== undefined) {
    rules.push({
      signal: "autovacuum",
      source: { _tag: "Autovacuum" },
      stop: above(0, "a vacuum on a table the batch writes"),
      resume: atOrUnder(0, "none"),
      onUnknown: onUnknown(raw.autovacuum.onUnknown),
      unit: "tables"
    })
  }
  for (const key of ["longTransactions", "queueLatency"] as const) {
    const config = raw[key]
    if (config === undefined) continue
    const stop = duration(`${key}.stop`, config.stop)
    if (Result.isFailure(stop)) return Result.fail(stop.failure)
    const resumeText = config.resume ?? halfText(stop.success, "seconds")
    const resume = duration(`${key}.resume`, resumeText)
    if (Result.isFailure(resume)) return Result.fail(resume.failure)
    const rule: SignalRule = {
      signal: key,
      source: key === "longTransactions" ? { _tag: "LongTransactions" } : { _tag: "QueueLatency" },
      stop: above(stop.success, config.stop),
      resume: atOrUnder(resume.success, resumeText),
      onUnknown: onUnknown(config.onUnknown),
      unit: "seconds"
    }
    const ok = withResume(key, rule.stop, rule.resume)
    if (Result.isFailure(ok)) return Result.fail(ok.failure)
    rules.push(rule)
  }
  if (raw.redisMemory !== undefined) {
    // A stop at or under the gap would get a resume of 0, which no store in use ever reaches: half
    // of stop there, as for the other signals.
    const stop = raw.redisMemory.stop
    const resume = raw.redisMemory.resume ??
      Math.round((stop > 2 * REDIS_MEMORY_GAP ? stop - REDIS_MEMORY_GAP : stop * HALF_OF_STOP) * 1e6) / 1e6
    const rule: SignalRule = {
      signal: "redisMemory",
      source: { _tag: "RedisMemory" },
      stop: above(raw.redisMemory.stop, String(raw.redisMemory.stop)),
      resume: atOrUnder(resume, String(resume)),
      onUnknown: onUnknown(raw.redisMemory.onUnknown),
      unit: "ratio"
    }
    const ok = withResume("redisMemory", rule.stop, rule.resume)
    if (Result.isFailure(ok)) return Result.fail(ok.failure)
    rules.push(rule)
  }
  if (raw.prometheus !== undefined) {
    const seen = new Set<string>()
    for (const [i, config] of raw.prometheus.rules.entries()) {
      const path = `prometheus.rules[${i}]`
      if (KNOWN_KEYS.includes(config.name) || seen.has(config.name)) {
        return Result.fail(`${path}.name: ${JSON.stringify(config.name)} is already a signal's name`)
      }
      seen.add(config.name)
      const stop = comparison(`${path}.stop`, config.stop)
      if (Result.isFailure(stop)) return Result.fail(stop.failure)
      const resume = config.resume === undefined
        ? Result.succeed<Threshold>(prometheusResume(stop.success))
        : comparison(`${path}.resume`, config.resume)
      if (Result.isFailure(resume)) return Result.fail(resume.failure)
      const ok = withResume(`${path}`, stop.success, resume.success)
      if (Result.isFailure(ok)) return Result.fail(ok.failure)
      rules.push({
        signal: config.name,
        source: { _tag: "Prometheus", url: raw.prometheus.url, query: config.query },
        stop: stop.success,
        resume: resume.success,
        onUnknown: onUnknown(config.onUnknown ?? raw.prometheus.onUnknown),
        unit: "value"
      })
    }
  }
  if (rules.length === 0) {
    return Result.fail("no signal configured: set at least one of " + KNOWN_KEYS.slice(0, 7).join(", "))
  }
  return Result.succeed({ rules, throttleLimits: raw.throttleLimits ?? false })
}

const isHealthConfig = (u: unknown): u is HealthConfig =>
  typeof u === "object" && u !== null && "rules" in u && Array.isArray(u.rules)

/** A Prometheus rule's default resume: the negated comparison, PROMETHEUS_GAP of stop on the healthy side. */
const prometheusResume = (stop: Threshold): Threshold => {
  const bound = stop.bound._tag === "Absolute" ? stop.bound.value : 0
  const gap = bound === 0 ? PROMETHEUS_GAP : Math.abs(bound) * PROMETHEUS_GAP
  const holdsBelow = stop.op === "<" || stop.op === "<="
  const v = Number((holdsBelow ? bound + gap : bound - gap).toPrecision(12))
  const op = holdsBelow ? ">=" : "<="
  return { op, bound: { _tag: "Absolute", value: v }, text: `${op} ${v}` }
}

/** `SWEEPER_HEALTH` from its JSON text: unknown keys, bad thresholds and hysteresis that overlaps are refused. */
export const HealthJson = Schema.fromJsonString(Schema.Unknown).pipe(
  Schema.decodeTo(Schema.declare(isHealthConfig), {
    decode: SchemaGetter.transformEffect((raw: unknown) =>
      Effect.gen(function*() {
        if (typeof raw === "object" && raw !== null && !Array.isArray(raw)) {
          const unknown = Object.keys(raw).find((key) => !KNOWN_KEYS.includes(key))
          if (unknown !== undefined) {
            return yield* Effect.fail(
              new SchemaIssue.InvalidValue({
                message: `unknown signal ${JSON.stringify(unknown)}; known: ${KNOWN_KEYS.join(", ")}`
              })
            )
          }
        }
        const decoded = yield* Schema.decodeUnknownEffect(RawHealth)(raw, Strict.parseOptions).pipe(
          Effect.mapError((error) => error.issue)
        )
        const compiled = compileHealth(decoded)
        return Result.isSuccess(compiled)
          ? compiled.success
          : yield* Effect.fail(new SchemaIssue.InvalidValue({ message: compiled.failure }))
      })
    ),
    encode: SchemaGetter.forbidden(() => "SWEEPER_HEALTH is never encoded")
  })
)

// ---------------------------------------------------------------------------------------------
// Readings, baselines, hysteresis
// ---------------------------------------------------------------------------------------------

/** A signal as last read: a number in its unit, or why it could not be read. */
export type Reading =
  | { readonly _tag: "Value"; readonly value: number }
  | { readonly _tag: "Unknown"; readonly reason: string }

export const value = (v: number): Reading => ({ _tag: "Value", value: v })
export const unknown = (reason: string): Reading => ({ _tag: "Unknown", reason })

export interface Sample {
  readonly at: number
  readonly value: number
}

/** Adds a sample and forgets those older than the window (epoch milliseconds). */
export const addSample = (
  samples: ReadonlyArray<Sample>,
  at: number,
  v: number,
  window: Duration.Duration = BASELINE_WINDOW
): Array<Sample> => {
  const from = at - Duration.toMillis(window)
  const kept = samples.filter((sample) => sample.at > from)
  kept.push({ at, value: v })
  return kept
}

/**
 * A relative threshold's warm-up: its baseline exists once it has this many samples spread over
 * at least BASELINE_WARMUP_SPAN. Until then the median of a handful of samples (or of a burst)
 * would define "normal", so a relative rule neither holds nor releases on it.
 */
export const BASELINE_WARMUP_SAMPLES = 30
export const BASELINE_WARMUP_SPAN = Duration.minutes(5)

/** The median once warmed up (BASELINE_WARMUP_SAMPLES over BASELINE_WARMUP_SPAN), else None. */
export const baselineOf = (samples: ReadonlyArray<Sample>): Option.Option<number> => {
  if (samples.length < BASELINE_WARMUP_SAMPLES) return Option.none()
  if (samples[samples.length - 1]!.at - samples[0]!.at < Duration.toMillis(BASELINE_WARMUP_SPAN)) return Option.none()
  return median(samples)
}

/**
 * The lowest a relative `walRate` baseline goes: the median of a quiet database can be 0 B/s, and
 * "three times nothing" would hold on any WAL at all (50 B/s held a batch). Under 1 MB/s a database
 * is quiet; a multiple of that is still no burst worth holding repairs for.
 */
export const WAL_RATE_BASELINE_FLOOR = 1_000_000

/** A rule's baseline as its thresholds use it: the warmed-up median, never under the rule's floor. */
export const ruleBaseline = (rule: SignalRule, samples: ReadonlyArray<Sample>): Option.Option<number> =>
  Option.map(
    baselineOf(samples),
    (median) => rule.source._tag === "WalRate" ? Math.max(median, WAL_RATE_BASELINE_FLOOR) : median
  )

/** The median of the samples (None when there are none). */
export const median = (samples: ReadonlyArray<Sample>): Option.Option<number> => {
  if (samples.length === 0) return Option.none()
  const sorted = samples.map((sample) => sample.value).sort((a, b) => a - b)
  const mid = Math.floor(sorted.length / 2)
  return Option.some(sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2)
}

/** The threshold as a number now (a relative one needs a baseline; None without one). */
export const thresholdValue = (threshold: Threshold, baseline: Option.Option<number>): Option.Option<number> => {
  const bound = threshold.bound
  return bound._tag === "Absolute" ? Option.some(bound.value) : Option.map(baseline, (b) => b * bound.factor)
}

const compare = (op: Comparison, a: number, b: number) =>
  op === "<" ? a < b : op === "<=" ? a <= b : op === ">" ? a > b : a >= b

/** Whether `v` satisfies the threshold; a relative one with no baseline yet is never satisfied. */
export const satisfies = (threshold: Threshold, v: number, baseline: Option.Option<number> = Option.none()): boolean =>
  Option.match(thresholdValue(threshold, baseline), { onNone: () => false, onSome: (t) => compare(threshold.op, v, t) })

/** Worst known value of a rule's readings (the largest, or the smallest for a rule that holds below). */
const worstKnown = (rule: SignalRule, readings: ReadonlyArray<Reading>): number | undefined => {
  const known = readings.flatMap((r) => r._tag === "Value" ? [r.value] : [])
  if (known.length === 0) return undefined
  const holdsBelow = rule.stop.op === "<" || rule.stop.op === "<="
  return holdsBelow ? Math.min(...known) : Math.max(...known)
}

/** What a rule decides for a batch now: held or not, and the reading that says why. */
export interface Judgement {
  readonly held: boolean
  readonly reading: Reading
}

/**
 * The hysteresis, over a rule's readings on every subject the batch touches. An open rule holds
 * once its worst known reading satisfies `stop`, or, with `onUnknown: "hold"`, once some subject
 * cannot be read. A held rule is judged against `resume` only: it releases once every subject is
 * read and the worst satisfies `resume`. An unknown reading never ends a hold (a slow read in the
 * middle of an incident is no news that the incident is over), whatever `onUnknown` says.
 * No reading at all (none taken yet) changes nothing.
 */
export const judge = (
  rule: SignalRule,
  held: boolean,
  readings: ReadonlyArray<Reading>,
  baseline: Option.Option<number> = Option.none()
): Judgement => {
  const worst = worstKnown(rule, readings)
  const unknownReading = readings.find((r) => r._tag === "Unknown")
  const shown = worst === undefined ? unknownReading ?? value(Number.NaN) : value(worst)
  if (readings.length === 0) return { held, reading: shown }
  if (held) {
    if (unknownReading !== undefined) return { held: true, reading: unknownReading }
    return { held: !satisfies(rule.resume, worst!, baseline), reading: shown }
  }
  if (worst !== undefined && satisfies(rule.stop, worst, baseline)) return { held: true, reading: value(worst) }
  if (unknownReading !== undefined) return { held: rule.onUnknown === "hold", reading: unknownReading }
  return { held: false, reading: shown }
}

/** `judge` for one reading. */
export const nextHeld = (
  rule: SignalRule,
  held: boolean,
  reading: Reading,
  baseline: Option.Option<number> = Option.none()
): boolean => judge(rule, held, [reading], baseline).held

/**
 * One rule's readings over the subjects a batch touches (its tables, stores, queues) as one, for
 * display: the worst known value; unknown only when no known value already holds and some subject is unknown.
 */
export const worstOf = (
  rule: SignalRule,
  readings: ReadonlyArray<Reading>,
  baseline: Option.Option<number> = Option.none()
): Reading => {
  const worst = worstKnown(rule, readings)
  const unknownReading = readings.find((r) => r._tag === "Unknown")
  if (worst !== undefined && satisfies(rule.stop, worst, baseline)) return value(worst)
  if (unknownReading !== undefined) return unknownReading
  return worst === undefined ? value(0) : value(worst)
}

/** The rules that hold a batch under `throttleLimits` instead of throttling its limits: Redis and Sidekiq ones. */
export const throttlesInsteadOfHolding = (rule: SignalRule): boolean =>
  rule.source._tag !== "QueueLatency" && rule.source._tag !== "RedisMemory"

/**
 * What a batch writes, as far as the gate cares: which rules apply to it and on which subjects.
 * Autovacuum is read per table (1 while a vacuum works on it, else 0).
 */
export interface WriteSet {
  readonly tables: ReadonlyArray<string>
  readonly redisStores: ReadonlyArray<RedisStoreName>
  readonly queues: ReadonlyArray<string>
  /**
   * The GitLab databases whose database-wide signals (replication lag, WAL rate, long transactions)
   * gate the batch: the one it repairs (`databasesOf`), none when it writes no table.
   */
  readonly databases: ReadonlyArray<DatabaseName>
}

/**
 * The database a batch's writes go to, as the gate reads it: with a decomposed GitLab the one its
 * GitLab tables live in (drop-* batches write ci), else the one database, named main. A batch that
 * writes no table is gated by no database signal.
 */
export const databasesOf = (
  // BatchWrites, by shape: Batch.ts asks this file for RedisStoreName.
  writes: { readonly tables?: ReadonlyArray<string> | undefined } | undefined,
  decomposed: boolean
): ReadonlyArray<DatabaseName> => (writes?.tables ?? []).length === 0 ? [] : [databaseOfWrites(writes, decomposed)]

/** Sweeper's own tables (its event ledger, run rollups): `sweeper_…`. */
export const isSweeperTable = (table: string): boolean => table.startsWith("sweeper_")

/** The rules read on PostgreSQL: each belongs to one database. */
export const isPostgresSignal = (rule: SignalRule): boolean =>
  rule.source._tag === "ReplicationLag" || rule.source._tag === "WalRate" ||
  rule.source._tag === "Autovacuum" || rule.source._tag === "LongTransactions"

/**
 * The subjects a rule is read on for a batch; empty: the rule does not apply to it. A database-wide
 * PostgreSQL signal's subject is the database (`main`, `ci`); "" = the whole server (Prometheus).
 */
export const subjectsFor = (rule: SignalRule, writes: WriteSet): ReadonlyArray<string> => {
  switch (rule.source._tag) {
    case "ReplicationLag":
    case "WalRate":
    case "LongTransactions":
      return writes.databases
    case "Autovacuum":
      // A vacuum of Sweeper's own ledger harms no one Sweeper's writes would: it never holds.
      return writes.tables.filter((table) => !isSweeperTable(table))
    case "RedisMemory":
      return writes.redisStores
    case "QueueLatency":
      return writes.queues
    case "Prometheus":
      return [""]
  }
}

/**
 * The database a PostgreSQL rule reads a subject on: a database-wide signal's subject names it, a
 * table is read where GitLab keeps it (all in main when ci is not decomposed). Undefined: not a
 * PostgreSQL signal.
 */
export const databaseOfSubject = (
  rule: SignalRule,
  subject: string,
  decomposed: boolean
): DatabaseName | undefined => {
  if (!isPostgresSignal(rule)) return undefined
  if (rule.source._tag !== "Autovacuum") return subject === "ci" ? "ci" : "main"
  return databaseOfTable(subject, decomposed)
}

/** A reading as the dashboard writes it: `38 MB`, `12 s`, `48 MB/s`, `0.93`. */
export const formatValue = (unit: Unit, v: number): string => {
  switch (unit) {
    case "bytes":
      return ByteSize.format(ByteSize.bytes(Math.max(0, Math.round(v))), { system: "decimal", precision: 3 })
    case "bytes/s":
      return `${ByteSize.format(ByteSize.bytes(Math.max(0, Math.round(v))), { system: "decimal", precision: 3 })}/s`
    case "seconds":
      return v >= 120 ? `${Math.round(v / 60)} min` : `${Math.round(v * 10) / 10} s`
    case "tables":
      return v > 0 ? "vacuum running" : "no vacuum"
    case "ratio":
    case "value":
      return `${Math.round(v * 10000) / 10000}`
  }
}

/** The stop threshold as the dashboard writes it (`8 MB`, `3x median (12 MB/s)`, `< 0.99`). */
export const formatThreshold = (rule: SignalRule, threshold: Threshold, baseline: Option.Option<number>): string => {
  if (rule.source._tag === "Prometheus") return threshold.text
  if (rule.source._tag === "Autovacuum") return "0 tables"
  if (threshold.bound._tag === "Relative") {
    return Option.match(thresholdValue(threshold, baseline), {
      onNone: () => `${threshold.bound._tag === "Relative" ? threshold.bound.factor : 0}x median (no baseline yet)`,
      onSome: (t) => `${threshold.text} median (${formatValue(rule.unit, t)})`
    })
  }
  return formatValue(rule.unit, threshold.bound.value)
}

/** `06:45:10` (UTC), as the dashboard and `sweeper status` write a hold's start. */
export const clockTime = (millis: number) => new Date(millis).toISOString().slice(11, 19)

/** One line: `drop-canceling-builds held by replicationLag on ci: 38 MB > 8 MB since 06:45:10`. */
export const holdText = (hold: {
  readonly batch: string
  readonly signal: string
  /** The database a PostgreSQL signal was read on (absent for Redis, Sidekiq, Prometheus). */
  readonly database?: string | undefined
  readonly display: string
  readonly threshold: string
  /** A Prometheus rule's threshold carries its own comparison (`< 0.99`). */
  readonly prometheus: boolean
  readonly since: number
}) =>
  `${hold.batch} held by ${hold.signal}${hold.database === undefined ? "" : ` on ${hold.database}`}: ${hold.display} ${
    hold.prometheus ? "" : "> "
  }${hold.threshold} since ${clockTime(hold.since)}`

/** A hold as the event log shows it (any process's), for `sweeper status`. */
export interface OpenHold {
  readonly batch: string
  readonly signal: string
  /** The database a PostgreSQL signal held on. */
  readonly database?: string
  readonly since: Date
  readonly text: string
}

/**
 * The holds still open in a batch's stream (oldest event first): a RepairHeld with no
 * RepairReleased after it for the same signal, whose run has not finished (a run killed while
 * held leaves no RepairReleased; its RunFinished — even `abandoned` — closes the hold).
 */
export const openHolds = (
  events: ReadonlyArray<{
    readonly type: string
    readonly data: Record<string, unknown>
    readonly runId: string | null
    readonly occurredAt: Date
  }>
): ReadonlyArray<OpenHold> => {
  const open = new Map<string, OpenHold & { readonly runId: string | null }>()
  for (const event of events) {
    const signal = typeof event.data.signal === "string" ? event.data.signal : ""
    const batch = typeof event.data.batch === "string" ? event.data.batch : ""
    if (event.type === "RepairHeld") {
      const unit = (typeof event.data.unit === "string" ? event.data.unit : "value") as Unit
      const v = typeof event.data.value === "number" ? event.data.value : null
      const t = typeof event.data.threshold === "number" ? event.data.threshold : null
      const stop = typeof event.data.stop === "string" ? event.data.stop : ""
      const prometheus = /^\s*[<>]/.test(stop)
      const display = v === null ? `unknown (${String(event.data.unknown ?? "")})` : formatValue(unit, v)
      const threshold = prometheus || t === null ? stop : formatValue(unit, t)
      const database = typeof event.data.database === "string" ? event.data.database : undefined
      open.set(signal, {
        batch,
        signal,
        ...(database === undefined ? {} : { database }),
        since: event.occurredAt,
        runId: event.runId,
        text: holdText({ batch, signal, database, display, threshold, prometheus, since: event.occurredAt.getTime() })
      })
    } else if (event.type === "RepairReleased") {
      open.delete(signal)
    } else if (event.type === "RunFinished") {
      for (const [key, hold] of open) if (hold.runId === event.runId) open.delete(key)
    }
  }
  return [...open.values()].map(({ runId: _, ...hold }) => hold)
}

// ---------------------------------------------------------------------------------------------
// Throttled concurrency limits (GitLab's numbers)
// ---------------------------------------------------------------------------------------------

export const SOFT_THROTTLE = 0.8
export const HARD_THROTTLE = 0.5
/** Unhealthy passes in a row before the soft factor becomes the hard one. */
export const SOFT_PASSES = 3
export const RECOVERY_FACTOR = 1.1

export interface ThrottleState {
  /** The limit in force for the next pass. */
  readonly effective: number
  /** Unhealthy passes in a row so far (0 after a healthy one). */
  readonly unhealthyPasses: number
}

/**
 * The limit for this pass, given the worker's configured limit and whether the platform is
 * unhealthy now: ×0.8 per unhealthy pass, ×0.5 from the fourth in a row on, never below 1 (0 would
 * mean unlimited); back up by max(+1, ×1.1) per healthy pass, never above the configured limit.
 * Only a positive limit is throttled: 0 (unlimited) and negative (breaker open) pass through.
 */
export const throttleStep = (
  limit: number,
  previous: Option.Option<ThrottleState>,
  unhealthy: boolean
): ThrottleState => {
  if (limit <= 0) return { effective: limit, unhealthyPasses: 0 }
  const current = Option.match(previous, { onNone: () => limit, onSome: (state) => Math.min(state.effective, limit) })
  if (unhealthy) {
    const passes = Option.match(previous, { onNone: () => 0, onSome: (state) => state.unhealthyPasses }) + 1
    const factor = passes > SOFT_PASSES ? HARD_THROTTLE : SOFT_THROTTLE
    return { effective: Math.max(1, Math.floor(current * factor)), unhealthyPasses: passes }
  }
  const recovered = Math.max(current + 1, Math.floor(current * RECOVERY_FACTOR))
  return { effective: Math.min(limit, recovered), unhealthyPasses: 0 }
}
