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
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Metric from "effect/Metric"
import * as Option from "effect/Option"
import { CurrentRun } from "../../domain/Batch.ts"
import type { DatabaseName } from "../../domain/Databases.ts"
import { RepairHeld, RepairReleased } from "../../domain/Events.ts"
import {
  formatThreshold,
  formatValue,
  type HealthConfig,
  holdText,
  judge,
  type Reading,
  RECHECK_INTERVAL,
  type SignalRule,
  thresholdValue,
  throttlesInsteadOfHolding,
  type ThrottleState,
  throttleStep
} from "../../domain/Health.ts"
import * as Holds from "../../domain/HealthHolds.ts"
import { EventLog } from "../../services/EventLog.ts"
import { HealthGate, type HealthGateShape } from "../../services/HealthGate.ts"
import { HealthReport, type HealthSnapshot, type HoldReport } from "../../services/HealthReport.ts"
import { DatabaseSignals, HealthSignals } from "../../services/HealthSignals.ts"
import {
  concurrencyLimitEffectiveLimit,
  increment,
  Metrics,
  repairHeld,
  repairHeldSecondsTotal,
  setGauge
} from "../../services/Metrics.ts"
import { gateBatches, type GatedBatch, signalLabels } from "./HealthGateBatches.ts"
import { makeSampler } from "./HealthSampler.ts"

export { type GatedBatch, writeSetOf } from "./HealthGateBatches.ts"
export { ACTIVE_WINDOW, FRESH_ROUND, IDLE_INTERVAL, ROUND_WAIT, STALE_AFTER } from "./HealthSampler.ts"

export interface GateOptions {
  readonly config: HealthConfig
  readonly batches: ReadonlyArray<GatedBatch>
  /** Queues and limits SWEEPER_CONCURRENCY_LIMITS configures (concurrency-limit-resume's pushes, its gauges). */
  readonly concurrencyLimits: Readonly<Record<string, { readonly limit: number; readonly queue: string }>>
}

/** The key of a run's hold on a signal. */
const holdKey = (run: string, signal: string) => `${run}\u0000${signal}`

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

    const sampler = yield* makeSampler({
      rules: config.rules,
      writeSets,
      decomposed,
      signals,
      signalsOf
    })

    // ---- the runs' holds ---------------------------------------------------------------------------
    const heldLabels = (batch: string, signal: string) => ({
      batch,
      ...signalLabels(signal, databaseFor(signal, batch))
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
        const baseline = sampler.baselineOf(rule, batch)
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
        counted.set(holdKey(key, rule.signal), now)
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
      const last = counted.get(holdKey(key, signal)) ?? now
      counted.set(holdKey(key, signal), now)
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
      counted.delete(holdKey(key, signal))
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
          judge(rule, false, sampler.readingsFor(rule, batch, now), sampler.baselineOf(rule, batch)).held
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
            yield* sampler.ensureFresh(yield* Clock.currentTimeMillis, deadlineMillis)
            return yield* dryVerdict(batch, rules, yield* Clock.currentTimeMillis)
          }
          const key = run.runId ?? `batch:${batch}`
          const entry = runOf(key, batch)
          entry.state = Holds.enter(entry.state)
          const heldBy = new Set<string>()
          return yield* Effect.gen(function*() {
            while (true) {
              const asked = yield* Clock.currentTimeMillis
              if (writesDatabase) sampler.demanded(asked)
              yield* sampler.ensureFresh(asked, deadlineMillis)
              for (const database of writtenDatabases) {
                yield* sampler.freshReplication(database, asked, deadlineMillis)
              }
              const now = yield* Clock.currentTimeMillis
              const step = Holds.check(
                runOf(key, batch).state,
                rules,
                (rule) => sampler.readingsFor(rule, batch, now),
                (rule) => sampler.baselineOf(rule, batch)
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
          if (!run.dryRun) sampler.demanded(asked)
          yield* sampler.ensureFresh(asked, undefined)
          const now = yield* Clock.currentTimeMillis
          const previous = throttles.get(worker)
          const held = new Map(previous?.held ?? [])
          let unhealthy = false
          for (const rule of config.rules.filter(throttlesInsteadOfHolding)) {
            const readings = sampler.readingsFor(rule, batch, now)
            if (readings.length === 0) continue
            const isHeld = judge(rule, held.get(rule.signal) === true, readings, sampler.baselineOf(rule, batch)).held
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
    yield* sampler.seriesAtStart
    for (const [worker, setting] of Object.entries(options.concurrencyLimits)) {
      yield* setGauge(concurrencyLimitEffectiveLimit, setting.limit, { worker })
    }

    // ---- the report ----------------------------------------------------------------------------------
    const snapshot: Effect.Effect<HealthSnapshot> = Effect.sync(() => {
      const signalReports = sampler.signalReports()
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
