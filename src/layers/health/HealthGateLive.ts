/**
 * The health gate as configured by SWEEPER_HEALTH. What it decides is decided in the
 * domain (domain/Health.ts judges a rule's readings, domain/HealthHolds.ts keeps a run's holds);
 * this layer reads the signals, keeps the state and writes the events.
 *
 * - A sampler reads every signal on every subject the registered batches write (their tables,
 *   Redis stores, Sidekiq queues), off the repair path: once a second while a batch of this process
 *   writes, every IDLE_INTERVAL otherwise. It is supervised (a failed or crashed round is logged and
 *   the schedule goes on), and relative baselines are computed once per round.
 * - `beforeUnit` never decides on stale readings: a round older than FRESH_ROUND is re-read first
 *   (the wait bounded by the unit's deadline), and a subject not read for STALE_AFTER counts as
 *   unknown. Before every unit of a real run the WAL-position signal (replication lag) is read
 *   fresh — one query on the primary — so a batch stops within one unit of its threshold instead of
 *   within a second of writes.
 * - PostgreSQL's signals are read on each GitLab database a batch may write (main, and ci when it is a
 *   database of its own: DatabaseSignals): a batch is judged on the database it writes
 *   (`databasesOf`), its autovacuum on the database that holds each table. Without a separate ci
 *   database there is one, named main, read once.
 * - Holds belong to the run: its concurrent waiters share them (one RepairHeld … RepairReleased
 *   pair per signal and hold, in `batch:<name>:health`, never in the stream the batch's state is
 *   folded from), held time is wall-clock, and a hold ends when its signal releases or its last
 *   waiter leaves.
 * - A dry run is never held: it writes no gate event and waits for nothing; its verdict names the
 *   signals that would have held it.
 *
 * A signal that cannot be read is `unknown`: logged when it becomes unknown (and when it recovers),
 * counted every sample, healthy for an open rule unless it says `onUnknown: "hold"`, and never the
 * end of a hold.
 */
import * as Cause from "effect/Cause"
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Metric from "effect/Metric"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Semaphore from "effect/Semaphore"
import { CurrentRun } from "../../domain/Batch.ts"
import type { DatabaseName } from "../../domain/Databases.ts"
import { RepairHeld, RepairReleased } from "../../domain/Events.ts"
import {
  addSample,
  baselineOf as warmBaseline,
  databaseOfSubject,
  formatThreshold,
  formatValue,
  type HealthConfig,
  holdText,
  judge,
  type Reading,
  RECHECK_INTERVAL,
  type RedisStoreName,
  type Sample,
  satisfies,
  type SignalRule,
  subjectsFor,
  thresholdValue,
  throttlesInsteadOfHolding,
  type ThrottleState,
  throttleStep,
  unknown,
  value,
  worstOf
} from "../../domain/Health.ts"
import * as Holds from "../../domain/HealthHolds.ts"
import { EventLog } from "../../services/EventLog.ts"
import { HealthGate, type HealthGateShape } from "../../services/HealthGate.ts"
import { HealthReport, type HealthSnapshot, type HoldReport, type SignalReport } from "../../services/HealthReport.ts"
import { DatabaseSignals, HealthSignals, type SignalUnreadable } from "../../services/HealthSignals.ts"
import {
  concurrencyLimitEffectiveLimit,
  healthSignal,
  healthSignalUnknown,
  healthSignalUnknownTotal,
  increment,
  Metrics,
  repairHeld,
  repairHeldSecondsTotal,
  setGauge
} from "../../services/Metrics.ts"
import { gateBatches, type GatedBatch, signalLabels } from "./HealthGateBatches.ts"

export { type GatedBatch, writeSetOf } from "./HealthGateBatches.ts"

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

export interface GateOptions {
  readonly config: HealthConfig
  readonly batches: ReadonlyArray<GatedBatch>
  /** Queues and limits SWEEPER_CONCURRENCY_LIMITS configures (concurrency-limit-resume's pushes, its gauges). */
  readonly concurrencyLimits: Readonly<Record<string, { readonly limit: number; readonly queue: string }>>
}

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

const slotKey = (signal: string, subject: string) => `${signal}\u0000${subject}`

const isRelative = (rule: SignalRule) => rule.stop.bound._tag === "Relative" || rule.resume.bound._tag === "Relative"

/** The gate and its report, over HealthSignals and EventLog; its sampler lives as long as the layer. */
export const makeHealthGate = (options: GateOptions) =>
  Effect.gen(function*() {
    const signals = yield* HealthSignals
    const byDatabase = yield* Effect.serviceOption(DatabaseSignals)
    // Without a ci database of its own, every PostgreSQL signal is read on the one client, as main.
    const decomposed = Option.isSome(byDatabase)
    const signalsOf = (database: DatabaseName): HealthSignals["Service"] =>
      Option.isSome(byDatabase) ? byDatabase.value[database] : signals
    const events = yield* EventLog
    // Captured once: beforeUnit and effectiveLimit are called from programs, which need not know
    // that the gate counts its holds.
    const metrics = yield* Metrics
    const { config } = options
    const limitQueues = [...new Set(Object.values(options.concurrencyLimits).map((setting) => setting.queue))]

    const { databaseFor, holdingRules, throttling, writeSets } = gateBatches(
      config,
      options.batches,
      limitQueues,
      decomposed
    )

    // One slot per rule and subject any batch needs: the sampler's work list.
    const slots = new Map<string, Slot>()
    for (const rule of config.rules) {
      for (const writes of writeSets.values()) {
        for (const subject of subjectsFor(rule, writes)) {
          const key = slotKey(rule.signal, subject)
          if (!slots.has(key)) {
            slots.set(key, {
              rule,
              subject,
              database: databaseOfSubject(rule, subject, decomposed),
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
    const slotsOf = (rule: SignalRule) => [...slots.values()].filter((slot) => slot.rule === rule)
    /** The databases some slot reads, each once per round whatever number of batches write it. */
    const databases = [...new Set([...slots.values()].flatMap((slot) => slot.database ?? []))]
    const vacuumTables = (database: DatabaseName) => [
      ...new Set(
        [...slots.values()].filter((slot) => slot.rule.source._tag === "Autovacuum" && slot.database === database)
          .map((slot) => slot.subject)
      )
    ]

    /** A rule's slots by database (one group, undefined, for a signal not read on PostgreSQL). */
    const slotGroups = config.rules.flatMap((rule) => {
      const ruleSlots = slotsOf(rule)
      return [...new Set(ruleSlots.map((slot) => slot.database))].map((database) =>
        [rule, database, ruleSlots.filter((slot) => slot.database === database)] as const
      )
    })

    // ---- the sampler -----------------------------------------------------------------------------
    const previousWal = new Map<DatabaseName, { at: number; position: number }>()
    /** When the newest round started (null before the first). */
    let lastRoundAt: number | null = null
    /** When a real run of a batch that writes the database last asked the gate (its own WAL). */
    let lastDemandAt = Number.NEGATIVE_INFINITY
    const roundLock = yield* Semaphore.make(1)
    const asReading = (effect: Effect.Effect<number, SignalUnreadable>) =>
      Effect.match(effect, {
        onFailure: (error) => unknown(error.reason === "" ? error.message : `${error.source}: ${error.reason}`),
        onSuccess: value
      })

    const replicationSlots = [...slots.values()].filter((slot) => slot.rule.source._tag === "ReplicationLag")
    const replicationReading = (
      result: Effect.Effect<{ readonly bytes: number; readonly seconds: number }, SignalUnreadable>,
      measure: "bytes" | "seconds"
    ) => asReading(Effect.map(result, (lag) => lag[measure]))

    const record = (slot: Slot, reading: Reading, at: number) =>
      Effect.gen(function*() {
        slot.reading = Option.some(reading)
        slot.readAt = at
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

    const sampleRound = Effect.gen(function*() {
      const at = yield* Clock.currentTimeMillis
      // Read once per round and database what several slots share.
      type Lag = Effect.Effect<{ readonly bytes: number; readonly seconds: number }, SignalUnreadable>
      const replication = new Map<DatabaseName, Lag>()
      const vacuumed = new Map<DatabaseName, Effect.Effect<ReadonlyArray<string>, SignalUnreadable>>()
      for (const database of databases) {
        replication.set(database, yield* Effect.cached(signalsOf(database).replicationLag))
        const tables = vacuumTables(database)
        vacuumed.set(
          database,
          yield* Effect.cached(
            tables.length === 0 ? Effect.succeed([] as ReadonlyArray<string>) : signalsOf(database).vacuuming(tables)
          )
        )
      }
      const read = (slot: Slot): Effect.Effect<Option.Option<Reading>> => {
        const source = slot.rule.source
        const database = slot.database ?? "main"
        switch (source._tag) {
          case "ReplicationLag":
            return Effect.map(replicationReading(replication.get(database)!, source.measure), Option.some)
          case "WalRate":
            return Effect.map(Effect.result(signalsOf(database).walPosition), (result) => {
              if (result._tag === "Failure") {
                previousWal.delete(database)
                return Option.some(unknown(result.failure.message))
              }
              const before = previousWal.get(database)
              previousWal.set(database, { at, position: result.success })
              // The first sample has nothing to take a rate against: no reading yet (not unknown).
              if (before === undefined || at <= before.at) return Option.none()
              const rate = Math.max(0, (result.success - before.position) / ((at - before.at) / 1000))
              // The baseline is the platform's normal: WAL written while this process's batches
              // wrote (within ACTIVE_WINDOW) is partly Sweeper's own, so it is left out of it.
              if (isRelative(slot.rule) && before.at - lastDemandAt > Duration.toMillis(ACTIVE_WINDOW)) {
                slot.samples = addSample(slot.samples, at, rate)
              }
              return Option.some(value(rate))
            })
          case "Autovacuum":
            return Effect.map(
              asReading(Effect.map(vacuumed.get(database)!, (tables) => tables.includes(slot.subject) ? 1 : 0)),
              Option.some
            )
          case "LongTransactions":
            return Effect.map(asReading(signalsOf(database).oldestTransaction), Option.some)
          case "RedisMemory":
            return Effect.map(asReading(signals.redisMemory(slot.subject as RedisStoreName)), Option.some)
          case "QueueLatency":
            return Effect.map(asReading(signals.queueLatency(slot.subject)), Option.some)
          case "Prometheus":
            return Effect.map(asReading(signals.prometheus(source.url, source.query)), Option.some)
        }
      }
      yield* Effect.forEach([...slots.values()], (slot) =>
        Effect.gen(function*() {
          const reading = yield* read(slot)
          if (Option.isNone(reading)) {
            // Read, but nothing to judge yet (the WAL rate's first sample).
            slot.readAt = at
            return
          }
          const r = reading.value
          if (r._tag === "Value" && isRelative(slot.rule) && slot.rule.source._tag !== "WalRate") {
            slot.samples = addSample(slot.samples, at, r.value)
          }
          yield* record(slot, r, at)
        }), { concurrency: "unbounded", discard: true })
      // Baselines once per round, not per unit or per report.
      for (const slot of slots.values()) if (isRelative(slot.rule)) slot.baseline = warmBaseline(slot.samples)
      lastRoundAt = at
      // Gauges: per signal (and database) the worst reading over its subjects, and whether any is unknown.
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

    /** One round at a time; a round that fails or dies is logged, and the next one is still taken. */
    const guardedRound = (when: (now: number) => boolean) =>
      roundLock.withPermits(1)(
        Effect.flatMap(Clock.currentTimeMillis, (now) => when(now) ? sampleRound : Effect.void)
      ).pipe(
        Effect.catchCause((cause) =>
          Cause.hasInterruptsOnly(cause)
            ? Effect.failCause(cause)
            : Effect.logError("Health sampler round failed; the next one is on schedule", cause)
        )
      )
    const isStale = (now: number) => lastRoundAt === null || now - lastRoundAt > Duration.toMillis(FRESH_ROUND)
    const active = (now: number) => now - lastDemandAt <= Duration.toMillis(ACTIVE_WINDOW)

    // Supervised by its schedule, which ticks every RECHECK_INTERVAL: a round on every tick while a
    // batch of this process runs, on every IDLE_INTERVAL otherwise, so a starting batch is never
    // left waiting on an idle sleep.
    // A round a unit took itself less than half a tick ago serves the tick.
    yield* guardedRound((now) =>
      lastRoundAt === null ||
      (active(now)
        ? now - lastRoundAt >= Duration.toMillis(RECHECK_INTERVAL) / 2
        : now - lastRoundAt >= Duration.toMillis(IDLE_INTERVAL))
    ).pipe(
      Effect.repeat(Schedule.spaced(RECHECK_INTERVAL)),
      Effect.forkScoped
    )

    /** How long a unit may wait for a reading: ROUND_WAIT, and never past its deadline. */
    const waitBound = (now: number, deadlineMillis: number | undefined) =>
      Duration.millis(Math.max(1, Math.min(Duration.toMillis(ROUND_WAIT), (deadlineMillis ?? Infinity) - now)))

    /** Readings from a round no older than FRESH_ROUND before deciding, waiting at most until `deadline` for them. */
    const ensureFresh = (now: number, deadlineMillis: number | undefined) =>
      isStale(now)
        ? guardedRound(isStale).pipe(Effect.timeoutOption(waitBound(now, deadlineMillis)), Effect.asVoid)
        : Effect.void

    // The WAL-position signal read fresh before a unit, on the database the batch writes. Each ask
    // takes a ticket; a read covers every ticket issued before it began, so concurrent units share a
    // read but none uses one begun before it asked.
    const tickets = new Map<DatabaseName, { readonly lock: Semaphore.Semaphore; issued: number; covered: number }>()
    for (const database of databases) tickets.set(database, { lock: yield* Semaphore.make(1), issued: 0, covered: 0 })
    const freshReplication = (database: DatabaseName) =>
      Effect.suspend(() => {
        const mine = replicationSlots.filter((slot) => slot.database === database)
        const state = tickets.get(database)
        if (mine.length === 0 || state === undefined) return Effect.void
        const ticket = ++state.issued
        return state.lock.withPermits(1)(Effect.gen(function*() {
          if (state.covered >= ticket) return
          state.covered = state.issued
          const at = yield* Clock.currentTimeMillis
          const lag = yield* Effect.cached(signalsOf(database).replicationLag)
          for (const slot of mine) {
            const source = slot.rule.source as { readonly measure: "bytes" | "seconds" }
            yield* record(slot, yield* replicationReading(lag, source.measure), at)
          }
        }))
      })

    // ---- judging a batch -------------------------------------------------------------------------
    /** A rule's baseline as it applies to a batch: on the batch's own subject (its database's WAL rate). */
    const baselineOf = (rule: SignalRule, batch: string): Option.Option<number> => {
      const subject = subjectsFor(rule, writeSets.get(batch)!)[0] ?? ""
      const slot = slots.get(slotKey(rule.signal, subject)) ?? slotsOf(rule)[0]
      return slot === undefined ? Option.none() : slot.baseline
    }
    const heldLabels = (batch: string, signal: string) => ({
      batch,
      ...signalLabels(signal, databaseFor(signal, batch))
    })
    /** A rule's readings on the batch's subjects; one not read for STALE_AFTER is unknown. */
    const readingsFor = (rule: SignalRule, batch: string, now: number): ReadonlyArray<Reading> =>
      subjectsFor(rule, writeSets.get(batch)!).flatMap((subject) => {
        const slot = slots.get(slotKey(rule.signal, subject))
        if (slot === undefined) return []
        if (slot.readAt === null) return [unknown("not read yet")]
        if (now - slot.readAt > Duration.toMillis(STALE_AFTER)) {
          return [unknown(`not read for ${Math.round((now - slot.readAt) / 1000)} s`)]
        }
        return Option.toArray(slot.reading)
      })

    /** Runs by key (run id, or the batch for a run without one), with the batch they belong to. */
    const runs = new Map<string, { readonly batch: string; state: Holds.RunHolds }>()
    const runOf = (key: string, batch: string) => {
      let entry = runs.get(key)
      if (entry === undefined) runs.set(key, entry = { batch, state: Holds.emptyRun })
      return entry
    }
    /** When each open hold's seconds were last added to sweeper_repair_held_seconds_total. */
    const counted = new Map<string, number>()
    const append = (event: RepairHeld | RepairReleased) =>
      events.append(event).pipe(
        Effect.catchCause((cause) => Effect.logError("Could not record health gate event", String(cause)))
      )

    const startHold = Effect.fnUntraced(
      function*(key: string, batch: string, rule: SignalRule, reading: Reading, now: number) {
        const baseline = baselineOf(rule, batch)
        const database = databaseFor(rule.signal, batch)
        const threshold = Option.getOrNull(thresholdValue(rule.stop, baseline))
        const v = reading._tag === "Value" ? reading.value : null
        const display = reading._tag === "Value" ? formatValue(rule.unit, reading.value) : `unknown (${reading.reason})`
        const thresholdText = formatThreshold(rule, rule.stop, baseline)
        const entry = runOf(key, batch)
        entry.state = Holds.openHold(entry.state, rule.signal, {
          since: now,
          value: v,
          display,
          threshold: thresholdText
        })
        counted.set(slotKey(key, rule.signal), now)
        yield* setGauge(repairHeld, 1, heldLabels(batch, rule.signal))
        yield* append(
          new RepairHeld({
            batch,
            signal: rule.signal,
            value: v,
            threshold,
            stop: rule.stop.text,
            unit: rule.unit,
            ...(reading._tag === "Unknown" ? { unknown: reading.reason } : {}),
            ...(database === undefined ? {} : { database })
          })
        )
        yield* Effect.logWarning("Repair held", {
          batch,
          signal: rule.signal,
          ...(database === undefined ? {} : { database }),
          value: display,
          threshold: thresholdText
        })
      }
    )

    const countHeld = (key: string, batch: string, signal: string, now: number) => {
      const last = counted.get(slotKey(key, signal)) ?? now
      counted.set(slotKey(key, signal), now)
      const seconds = (now - last) / 1000
      return seconds > 0 ? increment(repairHeldSecondsTotal, seconds, heldLabels(batch, signal)) : Effect.void
    }

    const endHold = Effect.fnUntraced(function*(key: string, signal: string, now: number, reason?: "budget") {
      const entry = runs.get(key)
      const hold = entry?.state.holds.get(signal)
      if (entry === undefined || hold === undefined) return
      const batch = entry.batch
      entry.state = Holds.closeHold(entry.state, signal, now)
      yield* countHeld(key, batch, signal, now)
      counted.delete(slotKey(key, signal))
      yield* setGauge(repairHeld, 0, heldLabels(batch, signal))
      const heldMs = now - hold.since
      const database = databaseFor(signal, batch)
      const where = database === undefined ? {} : { database }
      yield* append(
        new RepairReleased({ batch, signal, heldMs, ...(reason === undefined ? {} : { reason }), ...where })
      )
      yield* Effect.logInfo("Repair released", {
        batch,
        signal,
        ...where,
        held_ms: heldMs,
        ...(reason === undefined ? {} : { reason })
      })
    })

    /** A waiter leaves its run: the last one ends the holds still open (its deadline, an interruption). */
    const leaveRun = (key: string) =>
      Effect.gen(function*() {
        const entry = runs.get(key)
        if (entry === undefined) return
        const [ending, state] = Holds.leave(entry.state)
        entry.state = state
        const now = yield* Clock.currentTimeMillis
        for (const signal of ending) yield* endHold(key, signal, now, "budget")
        if (Holds.idle(entry.state)) runs.delete(key)
      })

    const takeHeld = (key: string, now: number) => {
      const entry = runs.get(key)!
      const [ms, state] = Holds.takeHeld(entry.state, now)
      entry.state = state
      return ms
    }

    const PROCEED = { proceed: true, heldMs: 0, heldBy: [] as ReadonlyArray<string> }

    const dryLogged = new Map<string, string>()
    /** A dry run: judged as if nothing held it, waiting for nothing and writing nothing. */
    const dryVerdict = (batch: string, rules: ReadonlyArray<SignalRule>, now: number) =>
      Effect.gen(function*() {
        const wouldHold = rules.filter((rule) =>
          judge(rule, false, readingsFor(rule, batch, now), baselineOf(rule, batch)).held
        )
          .map((rule) => rule.signal)
        const said = wouldHold.join(", ")
        // Once per change, not once per page of a long dry run.
        if (dryLogged.get(batch) !== said) {
          dryLogged.set(batch, said)
          if (said !== "") yield* Effect.logInfo("Dry run not held; a real run would be", { batch, signals: said })
        }
        return wouldHold.length === 0 ? PROCEED : { proceed: true, heldMs: 0, heldBy: wouldHold }
      })

    const beforeUnit: HealthGateShape["beforeUnit"] = ({ batch, deadlineMillis }) =>
      Effect.provideService(
        Effect.gen(function*() {
          const rules = holdingRules(batch)
          if (rules.length === 0) return PROCEED
          const run = yield* CurrentRun
          const writtenDatabases = writeSets.get(batch)?.databases ?? []
          const writesDatabase = writtenDatabases.length > 0
          if (run.dryRun) {
            yield* ensureFresh(yield* Clock.currentTimeMillis, deadlineMillis)
            return yield* dryVerdict(batch, rules, yield* Clock.currentTimeMillis)
          }
          const key = run.runId ?? `batch:${batch}`
          const entry = runOf(key, batch)
          entry.state = Holds.enter(entry.state)
          const heldBy = new Set<string>()
          return yield* Effect.gen(function*() {
            while (true) {
              const asked = yield* Clock.currentTimeMillis
              if (writesDatabase) lastDemandAt = asked
              yield* ensureFresh(asked, deadlineMillis)
              for (const database of writtenDatabases) {
                yield* Effect.timeoutOption(freshReplication(database), waitBound(asked, deadlineMillis))
              }
              const now = yield* Clock.currentTimeMillis
              const step = Holds.check(
                runOf(key, batch).state,
                rules,
                (rule) => readingsFor(rule, batch, now),
                (rule) => baselineOf(rule, batch)
              )
              for (const { reading, rule } of step.open) yield* startHold(key, batch, rule, reading, now)
              for (const signal of step.close) yield* endHold(key, signal, now)
              for (const signal of step.keep) yield* countHeld(key, batch, signal, now)
              for (const signal of [...step.open.map(({ rule }) => rule.signal), ...step.keep]) heldBy.add(signal)
              if (runOf(key, batch).state.holds.size === 0) {
                return heldBy.size === 0 ? PROCEED : { proceed: true, heldMs: takeHeld(key, now), heldBy: [...heldBy] }
              }
              if (deadlineMillis !== undefined && now >= deadlineMillis) {
                return { proceed: false, heldMs: takeHeld(key, now), heldBy: [...heldBy] }
              }
              const wait = deadlineMillis === undefined
                ? Duration.toMillis(RECHECK_INTERVAL)
                : Math.min(Duration.toMillis(RECHECK_INTERVAL), deadlineMillis - now)
              yield* Effect.sleep(Duration.millis(Math.max(1, wait)))
            }
          }).pipe(
            // Returned, reached its deadline or interrupted: the last waiter out closes what is still open.
            Effect.ensuring(leaveRun(key))
          )
        }),
        Metrics,
        metrics
      )

    // ---- throttled concurrency limits --------------------------------------------------------------
    const throttles = new Map<string, { state: ThrottleState; limit: number; held: Map<string, boolean> }>()
    const effectiveLimit: HealthGateShape["effectiveLimit"] = ({ batch, worker, limit }) =>
      Effect.provideService(
        Effect.gen(function*() {
          if (!config.throttleLimits || !throttling.has(batch)) return limit
          const run = yield* CurrentRun
          const asked = yield* Clock.currentTimeMillis
          if (!run.dryRun) lastDemandAt = asked
          yield* ensureFresh(asked, undefined)
          const now = yield* Clock.currentTimeMillis
          const previous = throttles.get(worker)
          const held = new Map(previous?.held ?? [])
          let unhealthy = false
          for (const rule of config.rules.filter(throttlesInsteadOfHolding)) {
            const readings = readingsFor(rule, batch, now)
            if (readings.length === 0) continue
            const isHeld = judge(rule, held.get(rule.signal) === true, readings, baselineOf(rule, batch)).held
            held.set(rule.signal, isHeld)
            unhealthy ||= isHeld
          }
          const state = throttleStep(limit, Option.map(Option.fromUndefinedOr(previous), (p) => p.state), unhealthy)
          // A dry run says what the limit would be, and leaves the throttle where the real runs put it.
          if (run.dryRun) return state.effective
          throttles.set(worker, { state, limit, held })
          yield* setGauge(concurrencyLimitEffectiveLimit, state.effective, { worker })
          if (state.effective !== limit) {
            yield* Effect.logInfo("Concurrency limit throttled", { worker, limit, effective: state.effective })
          }
          return state.effective
        }),
        Metrics,
        metrics
      )

    // ---- series present from start-up --------------------------------------------------------------
    for (const batch of writeSets.keys()) {
      for (const rule of holdingRules(batch)) {
        yield* setGauge(repairHeld, 0, heldLabels(batch, rule.signal))
        // `increment` skips 0; the series must exist at 0 so rate() and the dashboard see the first hold.
        yield* Metric.update(Metric.withAttributes(repairHeldSecondsTotal, heldLabels(batch, rule.signal)), 0)
      }
    }
    for (const rule of config.rules) {
      const groups = slotGroups.filter(([r]) => r === rule)
      // A rule no batch reads still says it is not unknown.
      if (groups.length === 0) yield* setGauge(healthSignalUnknown, 0, { signal: rule.signal })
      for (const [, database] of groups) yield* setGauge(healthSignalUnknown, 0, signalLabels(rule.signal, database))
    }
    for (const [worker, setting] of Object.entries(options.concurrencyLimits)) {
      yield* setGauge(concurrencyLimitEffectiveLimit, setting.limit, { worker })
    }

    // ---- the report ----------------------------------------------------------------------------------
    const snapshot: Effect.Effect<HealthSnapshot> = Effect.sync(() => {
      const signalReports: Array<SignalReport> = [...slots.values()].map((slot) => {
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
      })
      const holdReports: Array<HoldReport> = []
      for (const { batch, state } of runs.values()) {
        for (const [signal, hold] of state.holds) {
          const rule = config.rules.find((r) => r.signal === signal)
          const database = databaseFor(signal, batch)
          holdReports.push({
            batch,
            signal,
            ...(database === undefined ? {} : { database }),
            value: hold.value,
            display: hold.display,
            threshold: hold.threshold,
            since: new Date(hold.since).toISOString(),
            text: holdText({
              batch,
              signal,
              database,
              display: hold.display,
              threshold: hold.threshold,
              prometheus: rule?.source._tag === "Prometheus",
              since: hold.since
            })
          })
        }
      }
      const throttled = [...throttles].map(([worker, t]) => ({ worker, limit: t.limit, effective: t.state.effective }))
      return { configured: true, signals: signalReports, holds: holdReports, throttled }
    })

    return { gate: { beforeUnit, effectiveLimit } satisfies HealthGateShape, report: { snapshot } }
  })

/** HealthGate and HealthReport as configured; needs HealthSignals and EventLog, samples while the layer lives. */
export const HealthGateLive = (options: GateOptions) =>
  Layer.effectContext(
    Effect.map(makeHealthGate(options), ({ gate, report }) =>
      Context.make(HealthGate, gate).pipe(Context.add(HealthReport, report)))
  )
