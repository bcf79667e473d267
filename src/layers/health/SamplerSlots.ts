/**
 * The health sampler's slots: one per rule and subject some batch needs, each the latest reading of that
 * signal there, with its samples and relative baseline. Written by the sampler's fiber alone
 * (SamplerFiber.ts), which applies what a round or a fresh lag read brought back (SamplerReads.ts):
 * `applyRound`, `applyLag`; everyone else reads them. Also what the report says of a slot.
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import type * as Result from "effect/Result"
import * as SubscriptionRef from "effect/SubscriptionRef"
import * as SynchronizedRef from "effect/SynchronizedRef"
import type { DatabaseName } from "../../domain/Databases.ts"
import {
  addSample,
  databaseOfSubject,
  formatThreshold,
  formatValue,
  type Reading,
  ruleBaseline,
  type Sample,
  satisfies,
  type SignalRule,
  subjectsFor,
  unknown,
  value,
  worstOf,
  type WriteSet
} from "../../domain/Health.ts"
import * as OwnWal from "../../domain/WalBaseline.ts"
import type { SignalReport } from "../../services/HealthReport.ts"
import { type HealthSignals, SignalUnreadable } from "../../services/HealthSignals.ts"
import {
  healthSignal,
  healthSignalUnknown,
  healthSignalUnknownTotal,
  increment,
  setGauge
} from "../../services/Metrics.ts"
import { signalLabels } from "./HealthGateBatches.ts"

/** A subject not read for this long (a few rounds: a hung server, a failing sampler) is unknown. */
export const STALE_AFTER = Duration.seconds(5)

export interface Slot {
  readonly rule: SignalRule
  readonly subject: string
  /** The database a PostgreSQL signal is read on; undefined for the others. */
  readonly database: DatabaseName | undefined
  reading: Option.Option<Reading>
  readAt: number | null
  samples: ReadonlyArray<Sample>
  /** The relative baseline, computed once per round from `samples` (None while warming up). */
  baseline: Option.Option<number>
  /** The reason last logged as unknown (so a signal down for an hour is one line, not 3,600). */
  unknownLogged: string | undefined
}

/** A rule's slots on one database (undefined: a signal not read on PostgreSQL). */
export type SlotGroup = readonly [SignalRule, DatabaseName | undefined, ReadonlyArray<Slot>]

export type LagValue = { readonly bytes: number; readonly seconds: number }

/** What the sampler keeps between rounds. */
export interface SamplerState {
  readonly slots: ReadonlyMap<string, Slot>
  readonly slotGroups: ReadonlyArray<SlotGroup>
  /** The databases some slot reads, each once per round whatever number of batches write it. */
  readonly databases: ReadonlyArray<DatabaseName>
  readonly previousWal: Map<DatabaseName, OwnWal.WalMark>
  /**
   * Sweeper's own writing per database a relative walRate is read on: spans opened and closed by the
   * units' writes, taken by the round (domain/WalBaseline.ts). A SynchronizedRef, so that a span's
   * edge and the round's position are read and folded in one step, never interleaved.
   */
  readonly ownWal: ReadonlyMap<DatabaseName, SynchronizedRef.SynchronizedRef<OwnWal.OwnWal>>
  /** When the newest round started (null before the first). */
  lastRoundAt: number | null
  /** When a real run of a batch that writes the database last asked the gate (the sampler's pace). */
  lastDemandAt: number
  /**
   * How many times the readings have been published (a round, a fresh read before a unit): held
   * waiters wait for it to move instead of polling on a timer.
   */
  readonly published: SubscriptionRef.SubscriptionRef<number>
}

/** New readings are in the slots: wake whoever waits on them. */
export const publish = (state: SamplerState) => SubscriptionRef.update(state.published, (n) => n + 1)

/** What the sampler reads through. */
export interface SignalReaders {
  readonly signals: HealthSignals["Service"]
  /** The PostgreSQL signals of one database. */
  readonly signalsOf: (database: DatabaseName) => HealthSignals["Service"]
}

export interface SamplerOptions extends SignalReaders {
  readonly rules: ReadonlyArray<SignalRule>
  readonly writeSets: ReadonlyMap<string, WriteSet>
  /** ci is a database of its own (its PostgreSQL signals are read there, not on main). */
  readonly decomposed: boolean
}

export const slotKey = (signal: string, subject: string) => `${signal}\u0000${subject}`

export const isRelative = (rule: SignalRule) =>
  rule.stop.bound._tag === "Relative" || rule.resume.bound._tag === "Relative"

/** One slot per rule and subject any batch needs: the sampler's work list. */
export const slotsFor = (options: SamplerOptions): Map<string, Slot> => {
  const slots = new Map<string, Slot>()
  for (const rule of options.rules) {
    for (const writes of options.writeSets.values()) {
      for (const subject of subjectsFor(rule, writes)) {
        const key = slotKey(rule.signal, subject)
        if (!slots.has(key)) {
          slots.set(key, {
            rule,
            subject,
            database: databaseOfSubject(rule, subject, options.decomposed),
            reading: Option.none(),
            readAt: null,
            samples: [],
            baseline: Option.none(),
            unknownLogged: undefined
          })
        }
      }
    }
  }
  return slots
}

export const slotGroupsOf = (rules: ReadonlyArray<SignalRule>, slots: ReadonlyMap<string, Slot>): Array<SlotGroup> =>
  rules.flatMap((rule) => {
    const ruleSlots = [...slots.values()].filter((slot) => slot.rule === rule)
    return [...new Set(ruleSlots.map((slot) => slot.database))].map((database) =>
      [rule, database, ruleSlots.filter((slot) => slot.database === database)] as const
    )
  })

/**
 * Whether a failed read leaves the slot's last reading in place: it does while that reading is still
 * fresh (read within STALE_AFTER) and over stop. A read that fails or times out when the primary is
 * struggling is no news that it has stopped struggling; replacing a fresh bad value with "unknown"
 * would let a rule that treats unknown as healthy wave the next unit through.
 */
export const keepsWorse = (slot: Slot, reading: Reading, at: number): boolean => {
  if (reading._tag !== "Unknown" || slot.readAt === null || at - slot.readAt > Duration.toMillis(STALE_AFTER)) {
    return false
  }
  const last = Option.getOrUndefined(slot.reading)
  return last !== undefined && last._tag === "Value" && satisfies(slot.rule.stop, last.value, slot.baseline)
}

/** A slot's new reading: counted while unknown, logged when it becomes unknown and when it recovers. */
export const record = (slot: Slot, reading: Reading, at: number) =>
  Effect.gen(function*() {
    if (!keepsWorse(slot, reading, at)) {
      slot.reading = Option.some(reading)
      slot.readAt = at
    }
    const where = {
      signal: slot.rule.signal,
      ...(slot.subject === "" ? {} : { subject: slot.subject }),
      ...(slot.database === undefined ? {} : { database: slot.database })
    }
    if (reading._tag === "Unknown") {
      yield* increment(healthSignalUnknownTotal, 1, signalLabels(slot.rule.signal, slot.database))
      if (slot.unknownLogged !== reading.reason) {
        slot.unknownLogged = reading.reason
        yield* Effect.logWarning("Health signal unknown", {
          ...where,
          reason: reading.reason,
          treatedAs: slot.rule.onUnknown
        })
      }
    } else if (slot.unknownLogged !== undefined) {
      slot.unknownLogged = undefined
      yield* Effect.logInfo("Health signal readable again", where)
    }
  })

/** Per signal (and database) the worst reading over its subjects, and whether any is unknown. */
export const setSignalGauges = (slotGroups: ReadonlyArray<SlotGroup>) =>
  Effect.gen(function*() {
    for (const [rule, database, group] of slotGroups) {
      const readings = group.flatMap((slot) => Option.toArray(slot.reading))
      if (readings.length === 0) continue
      const known = readings.filter((r) => r._tag === "Value")
      // Nothing readable: NaN, not a reassuring 0 (sweeper_health_signal_unknown says why).
      const worst = known.length === 0 ? value(Number.NaN) : worstOf(rule, known)
      const labels = signalLabels(rule.signal, database)
      yield* setGauge(healthSignal, worst._tag === "Value" ? worst.value : Number.NaN, labels)
      yield* setGauge(healthSignalUnknown, readings.some((r) => r._tag === "Unknown") ? 1 : 0, labels)
    }
  })

/** What a round read of a slot, before the sampler applies it to the slot. */
export type SlotRead =
  | { readonly _tag: "Reading"; readonly reading: Reading }
  | {
    readonly _tag: "WalPosition"
    readonly result: Result.Result<number, SignalUnreadable>
    /** Sweeper's own writing taken out of this round's WAL (nothing for an absolute rule). */
    readonly own: OwnWal.OwnShare
  }

/** What one round read: every slot's read, from the time it began. */
export interface RoundRead {
  readonly at: number
  readonly reads: ReadonlyArray<readonly [Slot, SlotRead]>
}

/**
 * The WAL rate since the position the previous round read on the database. None for the first sample,
 * which has nothing to take a rate against (no reading yet, not unknown). A relative rule's sample is
 * the platform's rate, Sweeper's own writing taken out.
 */
export const applyWalPosition = (
  state: SamplerState,
  slot: Slot,
  database: DatabaseName,
  at: number,
  read: Extract<SlotRead, { _tag: "WalPosition" }>
): Option.Option<Reading> => {
  if (read.result._tag === "Failure") {
    state.previousWal.delete(database)
    return Option.some(unknown(read.result.failure.message))
  }
  const before = state.previousWal.get(database)
  const mark = { at, position: read.result.success }
  state.previousWal.set(database, mark)
  if (before === undefined || at <= before.at) return Option.none()
  if (isRelative(slot.rule)) {
    const sample = OwnWal.platformRate(before, mark, read.own)
    if (Option.isSome(sample)) slot.samples = addSample(slot.samples, at, sample.value)
  }
  return Option.some(value(Math.max(0, (mark.position - before.position) / ((at - before.at) / 1000))))
}

/** A round applied by the sampler's fiber: every slot's reading, baselines once, the signal gauges. */
export const applyRound = (state: SamplerState, { at, reads }: RoundRead) =>
  Effect.gen(function*() {
    for (const [slot, read] of reads) {
      const reading = read._tag === "Reading"
        ? Option.some(read.reading)
        : applyWalPosition(state, slot, slot.database ?? "main", at, read)
      if (Option.isNone(reading)) {
        // Read, but nothing to judge yet (the WAL rate's first sample).
        slot.readAt = at
        continue
      }
      const r = reading.value
      if (r._tag === "Value" && isRelative(slot.rule) && slot.rule.source._tag !== "WalRate") {
        slot.samples = addSample(slot.samples, at, r.value)
      }
      yield* record(slot, r, at)
    }
    // Baselines once per round, not per unit or per report, over the window as of this round: samples
    // older than it are forgotten whether or not this round added one.
    for (const slot of state.slots.values()) {
      if (!isRelative(slot.rule)) continue
      slot.samples = OwnWal.windowed(slot.samples, at)
      slot.baseline = ruleBaseline(slot.rule, slot.samples)
    }
    state.lastRoundAt = at
    yield* setSignalGauges(state.slotGroups)
    yield* publish(state)
  })

/** The replication lag read fresh on a database, applied by the sampler's fiber to its lag slots. */
export const applyLag = (
  state: SamplerState,
  database: DatabaseName,
  at: number,
  lag: Result.Result<LagValue, SignalUnreadable>
) =>
  Effect.gen(function*() {
    for (const slot of state.slots.values()) {
      const source = slot.rule.source
      if (source._tag !== "ReplicationLag" || slot.database !== database) continue
      yield* record(
        slot,
        lag._tag === "Failure"
          ? unknown(lag.failure.reason === "" ? lag.failure.message : `${lag.failure.source}: ${lag.failure.reason}`)
          : value(lag.success[source.measure]),
        at
      )
    }
    yield* publish(state)
  })

/** What the report says of a slot. */
export const slotReport = (slot: Slot): SignalReport => {
  const baseline = slot.baseline
  const reading = Option.getOrUndefined(slot.reading)
  const base = {
    signal: slot.rule.signal,
    subject: slot.subject,
    ...(slot.database === undefined ? {} : { database: slot.database }),
    stop: formatThreshold(slot.rule, slot.rule.stop, baseline),
    resume: formatThreshold(slot.rule, slot.rule.resume, baseline),
    readAt: slot.readAt === null ? null : new Date(slot.readAt).toISOString()
  }
  if (reading === undefined) return { ...base, state: "pending" as const, value: null, display: "not read yet" }
  if (reading._tag === "Unknown") {
    return { ...base, state: "unknown" as const, value: null, display: "unknown", reason: reading.reason }
  }
  return {
    ...base,
    state: satisfies(slot.rule.stop, reading.value, baseline) ? "over" as const : "ok" as const,
    value: reading.value,
    display: formatValue(slot.rule.unit, reading.value)
  }
}
