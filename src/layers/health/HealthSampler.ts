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
 * - One writer: the sampler's fiber applies every reading; a unit asks it for a round or a fresh lag
 *   read and waits (bounded) for what it publishes.
 *
 * The parts, each in its own file: the slots and how a reading is applied to them (SamplerSlots.ts),
 * what a round reads (SamplerReads.ts), the fiber that owns the slots (SamplerFiber.ts), and the
 * measure of Sweeper's own WAL for a relative walRate (OwnWalSpans.ts). This file composes them: the
 * schedule, the freshness waits and the readings as a batch is judged on them.
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Stream from "effect/Stream"
import * as SubscriptionRef from "effect/SubscriptionRef"
import * as SynchronizedRef from "effect/SynchronizedRef"
import type { DatabaseName } from "../../domain/Databases.ts"
import {
  NO_WRITES,
  type Reading,
  RECHECK_INTERVAL,
  type SignalRule,
  subjectsFor,
  unknown
} from "../../domain/Health.ts"
import * as OwnWal from "../../domain/WalBaseline.ts"
import type { SignalReport } from "../../services/HealthReport.ts"
import { healthSignalUnknown, type Metrics, setGauge } from "../../services/Metrics.ts"
import { signalLabels } from "./HealthGateBatches.ts"
import { ownWrite } from "./OwnWalSpans.ts"
import { startSampling } from "./SamplerFiber.ts"
import {
  isRelative,
  type SamplerOptions,
  type SamplerState,
  slotGroupsOf,
  slotKey,
  slotReport,
  slotsFor,
  STALE_AFTER
} from "./SamplerSlots.ts"

export { OWN_WAL_MARK_WAIT } from "./OwnWalSpans.ts"
export { type SamplerOptions, type SignalReaders, STALE_AFTER } from "./SamplerSlots.ts"

/** How often the sampler reads while no batch of this process has written for ACTIVE_WINDOW. */
export const IDLE_INTERVAL = Duration.seconds(10)
/** A batch that asked the gate this recently keeps the sampler at RECHECK_INTERVAL. */
export const ACTIVE_WINDOW = Duration.seconds(30)
/** A unit never decides on a round older than this: it takes a new one first (an idle sampler's are older). */
export const FRESH_ROUND = Duration.millis(1500)
/** The longest a unit waits for a fresh round when it has no deadline of its own. */
export const ROUND_WAIT = Duration.seconds(5)

/** How long a unit may wait for a reading: ROUND_WAIT, and never past its deadline. */
const waitBound = (now: number, deadlineMillis: number | undefined) =>
  Duration.millis(Math.max(1, Math.min(Duration.toMillis(ROUND_WAIT), (deadlineMillis ?? Infinity) - now)))

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
