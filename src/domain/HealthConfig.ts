/**
 * What `SWEEPER_HEALTH` says, parsed and compiled: threshold texts ("48MB/s", "3x", "> 0.9"), the
 * default `resume` half of each `stop`, and the JSON config checked key by key into a HealthConfig.
 * The rules that use the compiled config (readings, baselines, judging, write sets) stay in
 * src/domain/Health.ts.
 */
import * as ByteSize from "effect/ByteSize"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Result from "effect/Result"
import * as Schema from "effect/Schema"
import * as SchemaGetter from "effect/SchemaGetter"
import * as SchemaIssue from "effect/SchemaIssue"
import type { Bound, Comparison, HealthConfig, OnUnknown, SignalRule, Threshold } from "./Health.ts"
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
/** The operators COMPARISON's first group matches, as `Comparison`. */
const isComparison: (u: unknown) => u is Comparison = Schema.is(Schema.Literals(["<", "<=", ">", ">="]))
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
  const perSecond = /^(.*)\/s$/.exec(text.trim())?.[1]
  const bytes = perSecond === undefined ? Option.none() : parseBytes(perSecond)
  return Option.isSome(bytes)
    ? Result.succeed({ _tag: "Absolute", value: bytes.value })
    : bad(path, `a rate like "48MB/s" or a multiple of its median like "3x"`, text)
}

const duration = (path: string, text: string): Parsed<number> =>
  Option.match(parseSeconds(text), { onNone: () => bad(path, `a duration like "10m"`, text), onSome: Result.succeed })

const comparison = (path: string, text: string): Parsed<Threshold> => {
  const match = COMPARISON.exec(text)
  const op = match?.[1]
  if (match === null || !isComparison(op)) return bad(path, `a comparison like "< 0.99" or ">= 0.995"`, text)
  return Result.succeed({
    op,
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
