/**
 * The health gate's holds as the layer keeps them: one pure `RunHolds` (domain/HealthHolds.ts) per
 * run, and what applying its decisions writes. A hold belongs to the run, so its concurrent waiters
 * share it: one RepairHeld … RepairReleased pair per signal and hold, in `batch:<name>:health` (never
 * in the stream the batch's state is folded from), sweeper_repair_held while it is open and its
 * wall-clock seconds in sweeper_repair_held_seconds_total.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Metric from "effect/Metric"
import * as Option from "effect/Option"
import { RepairHeld, RepairReleased } from "../../domain/Events.ts"
import {
  formatThreshold,
  formatValue,
  holdText,
  type Reading,
  type SignalRule,
  thresholdValue
} from "../../domain/Health.ts"
import * as Holds from "../../domain/HealthHolds.ts"
import { EventLog } from "../../services/EventLog.ts"
import type { HoldReport } from "../../services/HealthReport.ts"
import { increment, type Metrics, repairHeld, repairHeldSecondsTotal, setGauge } from "../../services/Metrics.ts"
import { type GateBatches, signalLabels } from "./HealthGateBatches.ts"
import type { BatchReadings } from "./HealthSampler.ts"

export interface GateHolds {
  /** A waiter of the run enters the gate. */
  readonly enter: (run: string, batch: string) => void
  /**
   * One check of the batch's rules against the run's holds: holds opened, closed and kept as
   * HealthHolds.check decides, with their events and metrics. The signals holding the run after it.
   */
  readonly check: (
    run: string,
    batch: string,
    rules: ReadonlyArray<SignalRule>,
    now: number
  ) => Effect.Effect<ReadonlyArray<string>, never, Metrics>
  /** Some hold of the run is open. */
  readonly held: (run: string, batch: string) => boolean
  /** The run's held time no earlier verdict reported (see HealthHolds.takeHeld). */
  readonly takeHeld: (run: string, now: number) => number
  /** A waiter leaves its run: the last one ends the holds still open (its deadline, an interruption). */
  readonly leave: (run: string) => Effect.Effect<void, never, Metrics>
  readonly holdReports: () => Array<HoldReport>
  /** sweeper_repair_held and its seconds at 0 for every batch and rule that can hold it, from start-up. */
  readonly seriesAtStart: Effect.Effect<void, never, Metrics>
}

/** The key of a run's hold on a signal. */
const holdKey = (run: string, signal: string) => `${run}\u0000${signal}`

/** What the report says of a run's open hold. */
const holdReport = (
  batches: GateBatches,
  rules: ReadonlyArray<SignalRule>,
  batch: string,
  signal: string,
  hold: Holds.OpenHold
): HoldReport => {
  const rule = rules.find((r) => r.signal === signal)
  const database = batches.databaseFor(signal, batch)
  return {
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
  }
}

export const makeGateHolds = (batches: GateBatches, rules: ReadonlyArray<SignalRule>, readings: BatchReadings) =>
  Effect.gen(function*() {
    const events = yield* EventLog
    /** Runs by key (run id, or the batch for a run without one), with the batch they belong to. */
    const runs = new Map<string, { readonly batch: string; state: Holds.RunHolds }>()
    const runOf = (key: string, batch: string) => {
      let entry = runs.get(key)
      if (entry === undefined) runs.set(key, entry = { batch, state: Holds.emptyRun })
      return entry
    }
    /** When each open hold's seconds were last added to sweeper_repair_held_seconds_total. */
    const counted = new Map<string, number>()
    const heldLabels = (batch: string, signal: string) => ({
      batch,
      ...signalLabels(signal, batches.databaseFor(signal, batch))
    })
    const append = (event: RepairHeld | RepairReleased) =>
      events.append(event).pipe(
        Effect.catchCause((cause) => Effect.logError("Could not record health gate event", String(cause)))
      )

    const startHold = Effect.fnUntraced(
      function*(key: string, batch: string, rule: SignalRule, reading: Reading, now: number) {
        const baseline = readings.baselineOf(rule, batch)
        const database = batches.databaseFor(rule.signal, batch)
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
      const database = batches.databaseFor(signal, batch)
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

    const check = (key: string, batch: string, batchRules: ReadonlyArray<SignalRule>, now: number) =>
      Effect.gen(function*() {
        const step = Holds.check(
          runOf(key, batch).state,
          batchRules,
          (rule) => readings.readingsFor(rule, batch, now),
          (rule) => readings.baselineOf(rule, batch)
        )
        for (const { reading, rule } of step.open) yield* startHold(key, batch, rule, reading, now)
        for (const signal of step.close) yield* endHold(key, signal, now)
        for (const signal of step.keep) yield* countHeld(key, batch, signal, now)
        return [...step.open.map(({ rule }) => rule.signal), ...step.keep]
      })

    const leave = (key: string) =>
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

    const holdReports = () =>
      [...runs.values()].flatMap(({ batch, state }) =>
        [...state.holds].map(([signal, hold]) => holdReport(batches, rules, batch, signal, hold))
      )

    const seriesAtStart = Effect.gen(function*() {
      for (const batch of batches.writeSets.keys()) {
        for (const rule of batches.holdingRules(batch)) {
          yield* setGauge(repairHeld, 0, heldLabels(batch, rule.signal))
          // `increment` skips 0; the series must exist at 0 so rate() and the dashboard see the first hold.
          yield* Metric.update(Metric.withAttributes(repairHeldSecondsTotal, heldLabels(batch, rule.signal)), 0)
        }
      }
    })

    return {
      enter: (key, batch) => {
        const entry = runOf(key, batch)
        entry.state = Holds.enter(entry.state)
      },
      check,
      held: (key, batch) => runOf(key, batch).state.holds.size > 0,
      takeHeld,
      leave,
      holdReports,
      seriesAtStart
    } satisfies GateHolds
  })
