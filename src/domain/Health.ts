/**
 * The health gate's rules, pure: how a reading compares with a threshold, the hysteresis between
 * `stop` and `resume`, relative baselines (a signal's own median over the last hour) and the
 * throttled concurrency limit. The layer
 * (src/layers/health/HealthGateLive.ts) reads the signals and keeps the state; everything it decides is
 * decided here, so a spec can walk every transition under TestClock. What `SWEEPER_HEALTH` says
 * (parsing thresholds, compiling the JSON config) is in src/domain/HealthConfig.ts.
 *
 * Units, fixed per signal so a gauge and a threshold always agree: sizes in bytes, durations in
 * seconds, WAL rate in bytes per second, Redis memory as a used/max ratio, autovacuum as the number
 * of the batch's tables being vacuumed, a Prometheus rule in whatever its query returns.
 */
import * as Arr from "effect/Array"
import * as ByteSize from "effect/ByteSize"
import * as Duration from "effect/Duration"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import { type DatabaseName, databaseOfTable, databaseOfWrites } from "./Databases.ts"
import { type LedgerEvent, leftOpen } from "./HealthLedger.ts"

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
  if (!Arr.isReadonlyArrayNonEmpty(samples) || samples.length < BASELINE_WARMUP_SAMPLES) return Option.none()
  const span = Arr.lastNonEmpty(samples).at - Arr.headNonEmpty(samples).at
  if (span < Duration.toMillis(BASELINE_WARMUP_SPAN)) return Option.none()
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
  const sorted = samples.map((sample) => sample.value).sort((a, b) => a - b)
  const mid = Math.floor(sorted.length / 2)
  const upper = sorted[mid]
  const lower = sorted[mid - 1]
  // No upper middle: no samples. An odd count has one middle; an even one, the mean of its two.
  if (upper === undefined) return Option.none()
  return Option.some(sorted.length % 2 === 1 || lower === undefined ? upper : (lower + upper) / 2)
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

/** What a RepairHeld's fields say, as the dashboard writes them: the reading and the threshold it passed. */
export const heldDisplay = (held: Record<string, unknown>): {
  readonly display: string
  readonly threshold: string
  readonly value: number | null
  readonly prometheus: boolean
  readonly database: string | undefined
} => {
  const unit = isUnit(held.unit) ? held.unit : "value"
  const v = typeof held.value === "number" ? held.value : null
  const t = typeof held.threshold === "number" ? held.threshold : null
  const stop = typeof held.stop === "string" ? held.stop : ""
  const prometheus = /^\s*[<>]/.test(stop)
  return {
    display: v === null ? `unknown (${String(held.unknown ?? "")})` : formatValue(unit, v),
    threshold: prometheus || t === null ? stop : formatValue(unit, t),
    value: v,
    prometheus,
    database: typeof held.database === "string" ? held.database : undefined
  }
}

const isUnit = Schema.is(Schema.Literals(["bytes", "seconds", "bytes/s", "ratio", "tables", "value"]))

/**
 * The holds still open in a batch's stream (oldest event first): a RepairHeld with no
 * RepairReleased of its run after it, whose run has not finished (a run killed while held leaves no
 * RepairReleased; its RunFinished — even `abandoned` — closes the hold). The fold is domain/HealthLedger.ts'.
 */
export const openHolds = (events: ReadonlyArray<LedgerEvent>): ReadonlyArray<OpenHold> =>
  leftOpen(events).filter((hold) => hold.finishedAt === null).map((hold) => {
    const { database, display, prometheus, threshold } = heldDisplay(hold.held)
    const { batch, signal, since } = hold
    return {
      batch,
      signal,
      ...(database === undefined ? {} : { database }),
      since: new Date(since),
      text: holdText({ batch, signal, database, display, threshold, prometheus, since })
    }
  })

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
