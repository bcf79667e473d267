/**
 * The health gate's sampler: it reads every signal on every subject the gate's batches write, off the
 * repair path, and keeps the latest reading of each (a slot per rule and subject).
 *
 * - Rounds run on a supervised schedule, once a second while a batch of this process writes and every
 *   IDLE_INTERVAL otherwise; a round that fails or dies is logged and the next one is still taken.
 *   Relative baselines are computed once per round.
 * - Freshness: a unit never decides on a round older than FRESH_ROUND (`ensureFresh` takes one first),
 *   a subject not read for STALE_AFTER counts as unknown, and the WAL-position signal (replication lag)
 *   is re-read per unit on the database the batch writes (`freshReplication`), one query shared by the
 *   units that asked before it began.
 * - Shared reads: replication lag and vacuums are read once per round and database, whatever number of
 *   slots need them.
 */
import * as Cause from "effect/Cause"
import * as Clock from "effect/Clock"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import type * as Exit from "effect/Exit"
import * as Option from "effect/Option"
import * as Queue from "effect/Queue"
import type * as Result from "effect/Result"
import * as Schedule from "effect/Schedule"
import * as Stream from "effect/Stream"
import * as SubscriptionRef from "effect/SubscriptionRef"
import * as SynchronizedRef from "effect/SynchronizedRef"
import type { DatabaseName } from "../../domain/Databases.ts"
import {
  addSample,
  databaseOfSubject,
  formatThreshold,
  formatValue,
  isRedisStoreName,
  NO_WRITES,
  type Reading,
  RECHECK_INTERVAL,
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
  type Metrics,
  setGauge
} from "../../services/Metrics.ts"
import { signalLabels } from "./HealthGateBatches.ts"

/** How often the sampler reads while no batch of this process has written for ACTIVE_WINDOW. */
export const IDLE_INTERVAL = Duration.seconds(10)
/** A batch that asked the gate this recently keeps the sampler at RECHECK_INTERVAL. */
export const ACTIVE_WINDOW = Duration.seconds(30)
/** A unit never decides on a round older than this: it takes a new one first (an idle sampler's are older). */
export const FRESH_ROUND = Duration.millis(1500)
/** A subject not read for this long (a few rounds: a hung server, a failing sampler) is unknown. */
export const STALE_AFTER = Duration.seconds(5)
/** The longest a unit waits for a fresh round when it has no deadline of its own. */
export const ROUND_WAIT = Duration.seconds(5)
/**
 * The longest a write waits for the WAL position at its span's edge: past it the span is unmeasured
 * (that round adds no baseline sample) and the write goes on.
 */
export const OWN_WAL_MARK_WAIT = Duration.seconds(1)

interface Slot {
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
type SlotGroup = readonly [SignalRule, DatabaseName | undefined, ReadonlyArray<Slot>]

type LagValue = { readonly bytes: number; readonly seconds: number }
type Lag = Effect.Effect<LagValue, SignalUnreadable>

/** What the sampler keeps between rounds. */
interface SamplerState {
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
const publish = (state: SamplerState) => SubscriptionRef.update(state.published, (n) => n + 1)

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

const slotKey = (signal: string, subject: string) => `${signal}\u0000${subject}`

const isRelative = (rule: SignalRule) => rule.stop.bound._tag === "Relative" || rule.resume.bound._tag === "Relative"

/** One slot per rule and subject any batch needs: the sampler's work list. */
const slotsFor = (options: SamplerOptions): Map<string, Slot> => {
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

const slotGroupsOf = (rules: ReadonlyArray<SignalRule>, slots: ReadonlyMap<string, Slot>): Array<SlotGroup> =>
  rules.flatMap((rule) => {
    const ruleSlots = [...slots.values()].filter((slot) => slot.rule === rule)
    return [...new Set(ruleSlots.map((slot) => slot.database))].map((database) =>
      [rule, database, ruleSlots.filter((slot) => slot.database === database)] as const
    )
  })

const asReading = (effect: Effect.Effect<number, SignalUnreadable>) =>
  Effect.match(effect, {
    onFailure: (error) => unknown(error.reason === "" ? error.message : `${error.source}: ${error.reason}`),
    onSuccess: value
  })

const replicationReading = (result: Lag, measure: "bytes" | "seconds") =>
  asReading(Effect.map(result, (lag) => lag[measure]))

/**
 * Whether a failed read leaves the slot's last reading in place: it does while that reading is still
 * fresh (read within STALE_AFTER) and over stop. A read that fails or times out when the primary is
 * struggling is no news that it has stopped struggling; replacing a fresh bad value with "unknown"
 * would let a rule that treats unknown as healthy wave the next unit through.
 */
const keepsWorse = (slot: Slot, reading: Reading, at: number): boolean => {
  if (reading._tag !== "Unknown" || slot.readAt === null || at - slot.readAt > Duration.toMillis(STALE_AFTER)) {
    return false
  }
  const last = Option.getOrUndefined(slot.reading)
  return last !== undefined && last._tag === "Value" && satisfies(slot.rule.stop, last.value, slot.baseline)
}

/** A slot's new reading: counted while unknown, logged when it becomes unknown and when it recovers. */
const record = (slot: Slot, reading: Reading, at: number) =>
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

/** The tables whose vacuums some slot watches on the database. */
const vacuumTables = (slots: ReadonlyMap<string, Slot>, database: DatabaseName) => [
  ...new Set(
    [...slots.values()].filter((slot) => slot.rule.source._tag === "Autovacuum" && slot.database === database)
      .map((slot) => slot.subject)
  )
]

/** What one round reads once per database and shares between the slots that need it. */
interface SharedReads {
  readonly replication: ReadonlyMap<DatabaseName, Lag>
  readonly vacuumed: ReadonlyMap<DatabaseName, Effect.Effect<ReadonlyArray<string>, SignalUnreadable>>
}

const sharedReads = (state: SamplerState, readers: SignalReaders) =>
  Effect.gen(function*() {
    const replication = new Map<DatabaseName, Lag>()
    const vacuumed = new Map<DatabaseName, Effect.Effect<ReadonlyArray<string>, SignalUnreadable>>()
    for (const database of state.databases) {
      replication.set(database, yield* Effect.cached(readers.signalsOf(database).replicationLag))
      const tables = vacuumTables(state.slots, database)
      vacuumed.set(
        database,
        yield* Effect.cached(
          tables.length === 0
            ? Effect.succeed([] as ReadonlyArray<string>)
            : readers.signalsOf(database).vacuuming(tables)
        )
      )
    }
    return { replication, vacuumed } satisfies SharedReads
  })

/** What a round read of a slot, before the sampler applies it to the slot. */
type SlotRead =
  | { readonly _tag: "Reading"; readonly reading: Reading }
  | {
    readonly _tag: "WalPosition"
    readonly result: Result.Result<number, SignalUnreadable>
    /** Sweeper's own writing taken out of this round's WAL (nothing for an absolute rule). */
    readonly own: OwnWal.OwnShare
  }

const NOTHING_OWN: OwnWal.OwnShare = { bytes: 0, millis: 0, unmeasured: false }

/**
 * The database's WAL position, read in one step with the spans the units' writes open and close
 * (a relative rule's own share; domain/WalBaseline.ts), so no span edge falls between the two.
 */
const readWalPosition = (
  state: SamplerState,
  readers: SignalReaders,
  slot: Slot,
  database: DatabaseName,
  at: number
): Effect.Effect<SlotRead> => {
  const own = isRelative(slot.rule) ? state.ownWal.get(database) : undefined
  const read = Effect.result(readers.signalsOf(database).walPosition)
  if (own === undefined) return Effect.map(read, (result) => ({ _tag: "WalPosition", result, own: NOTHING_OWN }))
  return SynchronizedRef.modifyEffect(
    own,
    (ownState) =>
      Effect.map(read, (result): readonly [SlotRead, OwnWal.OwnWal] => {
        if (result._tag === "Failure") return [{ _tag: "WalPosition", result, own: NOTHING_OWN }, ownState]
        const [share, next] = OwnWal.takeOwn(ownState, { at, position: result.success })
        return [{ _tag: "WalPosition", result, own: share }, next]
      })
  )
}

/**
 * The WAL rate since the position the previous round read on the database. None for the first sample,
 * which has nothing to take a rate against (no reading yet, not unknown). A relative rule's sample is
 * the platform's rate, Sweeper's own writing taken out.
 */
const applyWalPosition = (
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

/**
 * `write`, with the span it writes the databases recorded as Sweeper's own: the position read when the
 * first unit starts writing and when the last one stops (concurrent units share one span).
 */
const ownWrite =
  (state: SamplerState, readers: SignalReaders, databases: ReadonlyArray<DatabaseName>) =>
  <A, E, R>(write: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> => {
    const refs = databases.flatMap((database) => {
      const ref = state.ownWal.get(database)
      return ref === undefined ? [] : [[database, ref] as const]
    })
    if (refs.length === 0) return write
    const mark = (database: DatabaseName) =>
      Effect.gen(function*() {
        const position = yield* Effect.option(
          Effect.timeoutOption(readers.signalsOf(database).walPosition, OWN_WAL_MARK_WAIT)
        )
        const at = yield* Clock.currentTimeMillis
        return Option.map(Option.flatten(position), (p): OwnWal.WalMark => ({ at, position: p }))
      })
    const edge = (
      needsMark: (s: OwnWal.OwnWal) => boolean,
      step: (s: OwnWal.OwnWal, m: Option.Option<OwnWal.WalMark>) => OwnWal.OwnWal
    ) =>
      Effect.forEach(
        refs,
        ([database, ref]) =>
          SynchronizedRef.updateEffect(ref, (s) =>
            needsMark(s) ? Effect.map(mark(database), (m) => step(s, m)) : Effect.succeed(step(s, Option.none()))),
        {
          discard: true
        }
      )
    return Effect.acquireUseRelease(
      edge(OwnWal.startsSpan, OwnWal.writeStarted),
      () => write,
      () => edge(OwnWal.endsSpan, OwnWal.writeEnded)
    )
  }

/** A read the round shares, by database: every database a slot reads has one (sharedReads). */
const sharedRead = <A>(
  reads: ReadonlyMap<DatabaseName, Effect.Effect<A, SignalUnreadable>>,
  database: DatabaseName
): Effect.Effect<A, SignalUnreadable> =>
  reads.get(database) ??
    Effect.fail(new SignalUnreadable({ source: database, reason: "not read this round" }))

/** What the round that began at `at` reads of a slot: it reads, and writes nothing to the slot. */
const readSlot = (
  state: SamplerState,
  readers: SignalReaders,
  shared: SharedReads,
  slot: Slot,
  at: number
): Effect.Effect<SlotRead> => {
  const source = slot.rule.source
  const database = slot.database ?? "main"
  const reading = (effect: Effect.Effect<Reading>): Effect.Effect<SlotRead> =>
    Effect.map(effect, (r) => ({ _tag: "Reading", reading: r }))
  switch (source._tag) {
    case "ReplicationLag":
      return reading(replicationReading(sharedRead(shared.replication, database), source.measure))
    case "WalRate":
      return readWalPosition(state, readers, slot, database, at)
    case "Autovacuum":
      return reading(asReading(
        Effect.map(sharedRead(shared.vacuumed, database), (tables) => tables.includes(slot.subject) ? 1 : 0)
      ))
    case "LongTransactions":
      return reading(asReading(readers.signalsOf(database).oldestTransaction))
    case "RedisMemory":
      return isRedisStoreName(slot.subject)
        ? reading(asReading(readers.signals.redisMemory(slot.subject)))
        : Effect.succeed({ _tag: "Reading", reading: unknown(`${slot.subject} is not a Redis store`) })
    case "QueueLatency":
      return reading(asReading(readers.signals.queueLatency(slot.subject)))
    case "Prometheus":
      return reading(asReading(readers.signals.prometheus(source.url, source.query)))
  }
}

/** Per signal (and database) the worst reading over its subjects, and whether any is unknown. */
const setSignalGauges = (slotGroups: ReadonlyArray<SlotGroup>) =>
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

/** What one round read: every slot's read, from the time it began. */
interface RoundRead {
  readonly at: number
  readonly reads: ReadonlyArray<readonly [Slot, SlotRead]>
}

/** One round's reads, every slot concurrently; nothing is written until the sampler applies them. */
const readRound = (state: SamplerState, readers: SignalReaders): Effect.Effect<RoundRead> =>
  Effect.gen(function*() {
    const at = yield* Clock.currentTimeMillis
    const shared = yield* sharedReads(state, readers)
    const reads = yield* Effect.forEach(
      [...state.slots.values()],
      (slot) => Effect.map(readSlot(state, readers, shared, slot, at), (read) => [slot, read] as const),
      { concurrency: "unbounded" }
    )
    return { at, reads }
  })

/** A round applied by the sampler's fiber: every slot's reading, baselines once, the signal gauges. */
const applyRound = (state: SamplerState, { at, reads }: RoundRead) =>
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
const applyLag = (
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

/**
 * A read forked by the sampler's fiber starts at once: one that needs no I/O wait (a reading at hand)
 * is back in the mailbox before the fiber takes its next message.
 */
const IMMEDIATELY = { startImmediately: true } as const

/** What the sampler's fiber is asked, and what the reads it forked tell it back. */
type Message =
  | { readonly _tag: "Round"; readonly when: (now: number) => boolean; readonly reply: Deferred.Deferred<void> | null }
  | { readonly _tag: "RoundRead"; readonly exit: Exit.Exit<RoundRead> }
  | { readonly _tag: "FreshLag"; readonly database: DatabaseName; readonly reply: Deferred.Deferred<void> }
  | {
    readonly _tag: "LagRead"
    readonly database: DatabaseName
    readonly at: number
    readonly lag: Result.Result<LagValue, SignalUnreadable>
  }

/** A unit waiting on a round: `when` says whether it still needs one once the round in flight is in. */
interface RoundWaiter {
  readonly when: (now: number) => boolean
  readonly reply: Deferred.Deferred<void>
  /** It joined a round that began before it asked. */
  readonly joined: boolean
}

/**
 * The sampler's fiber: the one writer of the slots. Rounds and fresh lag reads are asked of it through
 * its mailbox; it forks the reads (a slow server never keeps it from answering) and applies what they
 * bring back, one message at a time, then publishes. A fresh lag read serves the units that asked
 * before it began; those asking while it is in flight get the next one. A unit that stops waiting
 * (its deadline) leaves the read running for the others.
 */
const startSampling = (state: SamplerState, readers: SignalReaders) =>
  Effect.gen(function*() {
    const mailbox = yield* Queue.unbounded<Message>()
    const lagDatabases = new Set(
      [...state.slots.values()].flatMap((slot) =>
        slot.rule.source._tag === "ReplicationLag" && slot.database !== undefined ? [slot.database] : []
      )
    )
    // The fiber's own bookkeeping: the round being read (null: none) and each database's lag read.
    let round: Array<RoundWaiter> | null = null
    const lagReads = new Map<
      DatabaseName,
      { readonly waiting: Array<Deferred.Deferred<void>>; next: Array<Deferred.Deferred<void>> }
    >()
    const done = (replies: ReadonlyArray<Deferred.Deferred<void>>) =>
      Effect.forEach(replies, (reply) => Deferred.succeed(reply, undefined), { discard: true })

    const startRound = (waiters: Array<RoundWaiter>) =>
      Effect.suspend(() => {
        round = waiters
        return Effect.asVoid(
          Effect.forkChild(IMMEDIATELY)(
            Effect.flatMap(
              Effect.exit(readRound(state, readers)),
              (exit) => Queue.offer(mailbox, { _tag: "RoundRead", exit })
            )
          )
        )
      })
    const startLag = (database: DatabaseName, waiting: Array<Deferred.Deferred<void>>) =>
      Effect.suspend(() => {
        lagReads.set(database, { waiting, next: [] })
        return Effect.asVoid(
          Effect.forkChild(IMMEDIATELY)(Effect.gen(function*() {
            const at = yield* Clock.currentTimeMillis
            const lag = yield* Effect.result(readers.signalsOf(database).replicationLag)
            yield* Queue.offer(mailbox, { _tag: "LagRead", database, at, lag })
          }))
        )
      })

    const handle = (message: Message): Effect.Effect<void, never, Metrics> => {
      switch (message._tag) {
        case "Round": {
          const waiter = message.reply === null ? [] : [{ when: message.when, reply: message.reply, joined: true }]
          if (round !== null) return Effect.sync(() => void round?.push(...waiter))
          return Effect.flatMap(Clock.currentTimeMillis, (now) =>
            message.when(now)
              ? startRound(waiter.map((w) => ({ ...w, joined: false })))
              : done(waiter.map((w) => w.reply)))
        }
        case "RoundRead": {
          const waiters = round ?? []
          round = null
          return Effect.gen(function*() {
            if (message.exit._tag === "Success") yield* applyRound(state, message.exit.value)
            else yield* Effect.logError("Health sampler round failed; the next one is on schedule", message.exit.cause)
            // Who joined a round begun before it asked and still finds the readings stale gets one more.
            const now = yield* Clock.currentTimeMillis
            const again = waiters.filter((w) => w.joined && w.when(now)).map((w) => ({ ...w, joined: false }))
            yield* done(waiters.filter((w) => !again.some((a) => a.reply === w.reply)).map((w) => w.reply))
            if (again.length > 0) yield* startRound(again)
          })
        }
        case "FreshLag": {
          if (!lagDatabases.has(message.database)) return Deferred.succeed(message.reply, undefined)
          const inFlight = lagReads.get(message.database)
          if (inFlight !== undefined) return Effect.sync(() => void inFlight.next.push(message.reply))
          return startLag(message.database, [message.reply])
        }
        case "LagRead": {
          const reads = lagReads.get(message.database)
          lagReads.delete(message.database)
          return Effect.gen(function*() {
            yield* applyLag(state, message.database, message.at, message.lag)
            yield* done(reads?.waiting ?? [])
            if (reads !== undefined && reads.next.length > 0) yield* startLag(message.database, reads.next)
          })
        }
      }
    }

    // One message at a time, for as long as the sampler lives; one whose handling dies (a bug) is logged.
    yield* Queue.take(mailbox).pipe(
      Effect.flatMap((message) =>
        handle(message).pipe(
          Effect.catchCause((cause) =>
            Cause.hasInterruptsOnly(cause)
              ? Effect.failCause(cause)
              : Effect.logError("Health sampler message failed", Cause.pretty(cause))
          )
        )
      ),
      Effect.forever,
      Effect.forkScoped
    )

    const ask = (make: (reply: Deferred.Deferred<void>) => Message) =>
      Effect.gen(function*() {
        const reply = yield* Deferred.make<void>()
        yield* Queue.offer(mailbox, make(reply))
        yield* Deferred.await(reply)
      })
    return {
      /** A round if `when` says one is due (a schedule tick): nothing waits for it. */
      tick: (when: (now: number) => boolean) =>
        Effect.asVoid(Queue.offer(mailbox, { _tag: "Round", when, reply: null })),
      /** A round if `when` says one is due, returning once its readings are published. */
      round: (when: (now: number) => boolean) => ask((reply) => ({ _tag: "Round", when, reply })),
      /** The database's replication lag read after this call, returning once it is published. */
      freshLag: (database: DatabaseName) => ask((reply) => ({ _tag: "FreshLag", database, reply }))
    }
  })

/** How long a unit may wait for a reading: ROUND_WAIT, and never past its deadline. */
const waitBound = (now: number, deadlineMillis: number | undefined) =>
  Duration.millis(Math.max(1, Math.min(Duration.toMillis(ROUND_WAIT), (deadlineMillis ?? Infinity) - now)))

/** What the report says of a slot. */
const slotReport = (slot: Slot): SignalReport => {
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

/** The sampler's latest readings as a batch is judged on them. */
export interface BatchReadings {
  /** A rule's readings on the batch's subjects; one not read for STALE_AFTER is unknown. */
  readonly readingsFor: (rule: SignalRule, batch: string, now: number) => ReadonlyArray<Reading>
  /** A rule's baseline as it applies to a batch: on the batch's own subject (its database's WAL rate). */
  readonly baselineOf: (rule: SignalRule, batch: string) => Option.Option<number>
}

export interface Sampler extends BatchReadings {
  /** A batch of this process asked the gate at `at`: the sampler stays at RECHECK_INTERVAL a while. */
  readonly demanded: (at: number) => void
  /** A unit's write on the databases, its WAL counted as Sweeper's own (not the platform's baseline). */
  readonly ownWrite: (
    databases: ReadonlyArray<DatabaseName>
  ) => <A, E, R>(write: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
  /** Readings from a round no older than FRESH_ROUND, waiting at most ROUND_WAIT and never past the deadline. */
  readonly ensureFresh: (now: number, deadlineMillis: number | undefined) => Effect.Effect<void, never, Metrics>
  /** The database's replication lag read after this call, waiting as `ensureFresh` does. */
  readonly freshReplication: (
    database: DatabaseName,
    now: number,
    deadlineMillis: number | undefined
  ) => Effect.Effect<void, never, Metrics>
  /** How many times readings have been published so far. */
  readonly published: Effect.Effect<number>
  /** Returns once readings newer than publication `seen` are out (a round, a fresh read). */
  readonly publishedAfter: (seen: number) => Effect.Effect<void>
  readonly signalReports: () => Array<SignalReport>
  /** sweeper_health_signal_unknown at 0 for every rule (and database) from start-up. */
  readonly seriesAtStart: Effect.Effect<void, never, Metrics>
}

/** The sampler, its rounds scheduled in the current scope: they run as long as it lives. */
export const makeSampler = (options: SamplerOptions) =>
  Effect.gen(function*() {
    const slots = slotsFor(options)
    const ownWal = new Map<DatabaseName, SynchronizedRef.SynchronizedRef<OwnWal.OwnWal>>()
    for (const slot of slots.values()) {
      if (slot.rule.source._tag === "WalRate" && isRelative(slot.rule) && slot.database !== undefined) {
        ownWal.set(slot.database, yield* SynchronizedRef.make(OwnWal.NO_OWN_WAL))
      }
    }
    const state: SamplerState = {
      slots,
      slotGroups: slotGroupsOf(options.rules, slots),
      databases: [...new Set([...slots.values()].flatMap((slot) => slot.database ?? []))],
      previousWal: new Map(),
      ownWal,
      lastRoundAt: null,
      lastDemandAt: Number.NEGATIVE_INFINITY,
      published: yield* SubscriptionRef.make(0)
    }
    const sampling = yield* startSampling(state, options)
    const isStale = (now: number) =>
      state.lastRoundAt === null || now - state.lastRoundAt > Duration.toMillis(FRESH_ROUND)
    const active = (now: number) => now - state.lastDemandAt <= Duration.toMillis(ACTIVE_WINDOW)

    // The schedule ticks every RECHECK_INTERVAL: a round on every tick while a batch of this process
    // runs, on every IDLE_INTERVAL otherwise, so a starting batch is never left waiting on an idle sleep.
    // A round a unit took itself less than half a tick ago serves the tick.
    yield* sampling.tick((now) =>
      state.lastRoundAt === null ||
      (active(now)
        ? now - state.lastRoundAt >= Duration.toMillis(RECHECK_INTERVAL) / 2
        : now - state.lastRoundAt >= Duration.toMillis(IDLE_INTERVAL))
    ).pipe(
      Effect.repeat(Schedule.spaced(RECHECK_INTERVAL)),
      Effect.forkScoped
    )

    const ensureFresh = (now: number, deadlineMillis: number | undefined) =>
      isStale(now)
        ? sampling.round(isStale).pipe(Effect.timeoutOption(waitBound(now, deadlineMillis)), Effect.asVoid)
        : Effect.void
    const freshReplication = (database: DatabaseName, now: number, deadlineMillis: number | undefined) =>
      Effect.asVoid(Effect.timeoutOption(sampling.freshLag(database), waitBound(now, deadlineMillis)))

    const baselineOf = (rule: SignalRule, batch: string): Option.Option<number> => {
      const subject = subjectsFor(rule, options.writeSets.get(batch) ?? NO_WRITES)[0] ?? ""
      const slot = slots.get(slotKey(rule.signal, subject)) ?? [...slots.values()].find((s) => s.rule === rule)
      return slot === undefined ? Option.none() : slot.baseline
    }
    const readingsFor = (rule: SignalRule, batch: string, now: number): ReadonlyArray<Reading> =>
      subjectsFor(rule, options.writeSets.get(batch) ?? NO_WRITES).flatMap((subject) => {
        const slot = slots.get(slotKey(rule.signal, subject))
        if (slot === undefined) return []
        if (slot.readAt === null) return [unknown("not read yet")]
        if (now - slot.readAt > Duration.toMillis(STALE_AFTER)) {
          return [unknown(`not read for ${Math.round((now - slot.readAt) / 1000)} s`)]
        }
        return Option.toArray(slot.reading)
      })

    const seriesAtStart = Effect.gen(function*() {
      for (const rule of options.rules) {
        const groups = state.slotGroups.filter(([r]) => r === rule)
        // A rule no batch reads still says it is not unknown.
        if (groups.length === 0) yield* setGauge(healthSignalUnknown, 0, { signal: rule.signal })
        for (const [, database] of groups) yield* setGauge(healthSignalUnknown, 0, signalLabels(rule.signal, database))
      }
    })

    return {
      demanded: (at) => {
        state.lastDemandAt = at
      },
      ownWrite: (databases) => ownWrite(state, options, databases),
      ensureFresh,
      freshReplication,
      published: SubscriptionRef.get(state.published),
      publishedAfter: (seen) =>
        SubscriptionRef.changes(state.published).pipe(
          Stream.filter((n) => n > seen),
          Stream.take(1),
          Stream.runDrain
        ),
      readingsFor,
      baselineOf,
      signalReports: () => [...slots.values()].map(slotReport),
      seriesAtStart
    } satisfies Sampler
  })
