/**
 * The health gate as configured by SWEEPER_HEALTH: a sampler fiber reads every signal on
 * every subject the registered batches write (their tables, Redis stores, Sidekiq queues) once a
 * second, off the repair path; `beforeUnit` only compares the latest readings with the thresholds,
 * so a healthy gate costs a few comparisons per page. While any signal is past its stop threshold
 * the batch holds — no writes; the run guard keeps renewing its lease and its budget keeps running —
 * re-checking every second, and each signal releases once at or under its resume threshold (the
 * hysteresis, domain/Health.ts). Every hold is one `RepairHeld` … `RepairReleased` pair in the
 * batch's stream, a log line at each end, and the `sweeper_repair_held*` series.
 *
 * A signal that cannot be read is `unknown`: logged when it becomes unknown (and when it recovers),
 * counted every sample, and healthy unless its rule says `onUnknown: "hold"`.
 */
import { Clock, Context, Deferred, Duration, Effect, Layer, Metric, Option, Schedule } from "effect"
import type { BatchWrites } from "../../domain/Batch.ts"
import { RepairHeld, RepairReleased } from "../../domain/Events.ts"
import {
  addSample,
  formatThreshold,
  formatValue,
  type HealthConfig,
  holdText,
  median,
  nextHeld,
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
  worstOf,
  type WriteSet
} from "../../domain/Health.ts"
import { EventLog } from "../../services/EventLog.ts"
import { HealthGate, type HealthGateShape } from "../../services/HealthGate.ts"
import { HealthReport, type HealthSnapshot, type HoldReport, type SignalReport } from "../../services/HealthReport.ts"
import { HealthSignals, type SignalUnreadable } from "../../services/HealthSignals.ts"
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

/** A batch as the gate needs it: its name and what it writes. */
export interface GatedBatch {
  readonly name: string
  readonly writes?: BatchWrites | undefined
}

export interface GateOptions {
  readonly config: HealthConfig
  readonly batches: ReadonlyArray<GatedBatch>
  /** Queues and limits SWEEPER_CONCURRENCY_LIMITS configures (concurrency-limit-resume's pushes, its gauges). */
  readonly concurrencyLimits: Readonly<Record<string, { readonly limit: number; readonly queue: string }>>
}

interface Slot {
  readonly rule: SignalRule
  readonly subject: string
  reading: Option.Option<Reading>
  readAt: number | null
  samples: ReadonlyArray<Sample>
  /** The reason last logged as unknown (so a signal down for an hour is one line, not 3,600). */
  unknownLogged: string | undefined
}

interface Hold {
  readonly since: number
  readonly value: number | null
  readonly display: string
  readonly threshold: string
  lastCounted: number
}

const slotKey = (signal: string, subject: string) => `${signal}\u0000${subject}`

const isRelative = (rule: SignalRule) => rule.stop.bound._tag === "Relative" || rule.resume.bound._tag === "Relative"

export const writeSetOf = (batch: GatedBatch, limitQueues: ReadonlyArray<string>): WriteSet => ({
  tables: batch.writes?.tables ?? [],
  redisStores: batch.writes?.redisStores ?? [],
  queues: [
    ...new Set([...(batch.writes?.queues ?? []), ...(batch.writes?.concurrencyLimitQueues === true ? limitQueues : [])])
  ]
})

/** The gate and its report, over HealthSignals and EventLog; its sampler lives as long as the layer. */
export const makeHealthGate = (options: GateOptions) =>
  Effect.gen(function*() {
    const signals = yield* HealthSignals
    const events = yield* EventLog
    // Captured once: beforeUnit and effectiveLimit are called from programs, which need not know
    // that the gate counts its holds.
    const metrics = yield* Metrics
    const { config } = options
    const limitQueues = [...new Set(Object.values(options.concurrencyLimits).map((setting) => setting.queue))]

    // What each batch writes, and which rules can hold it (on which subjects).
    const writeSets = new Map(options.batches.map((batch) => [batch.name, writeSetOf(batch, limitQueues)]))
    const throttling = new Set(
      options.batches.filter((batch) => batch.writes?.concurrencyLimitQueues === true).map((batch) => batch.name)
    )
    const holdingRules = (batch: string): ReadonlyArray<SignalRule> => {
      const writes = writeSets.get(batch)
      if (writes === undefined) return []
      return config.rules.filter((rule) =>
        subjectsFor(rule, writes).length > 0 &&
        !(config.throttleLimits && throttling.has(batch) && throttlesInsteadOfHolding(rule))
      )
    }

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
              reading: Option.none(),
              readAt: null,
              samples: [],
              unknownLogged: undefined
            })
          }
        }
      }
    }
    const slotsOf = (rule: SignalRule) => [...slots.values()].filter((slot) => slot.rule === rule)
    const vacuumTables = [
      ...new Set(
        [...slots.values()].filter((slot) => slot.rule.source._tag === "Autovacuum").map((slot) => slot.subject)
      )
    ]

    // ---- the sampler: every slot once a second, off the repair path ------------------------------
    let previousWal: { at: number; position: number } | undefined
    const asReading = (effect: Effect.Effect<number, SignalUnreadable>) =>
      Effect.match(effect, {
        onFailure: (error) => unknown(error.reason === "" ? error.message : `${error.source}: ${error.reason}`),
        onSuccess: value
      })

    const sampleRound = Effect.gen(function*() {
      const at = yield* Clock.currentTimeMillis
      // Read once per round what several slots share.
      const replication = yield* Effect.cached(Effect.result(signals.replicationLag))
      const vacuuming = vacuumTables.length === 0
        ? Effect.succeed([] as ReadonlyArray<string>)
        : signals.vacuuming(vacuumTables)
      const vacuumed = yield* Effect.cached(vacuuming)
      const read = (slot: Slot): Effect.Effect<Option.Option<Reading>> => {
        const source = slot.rule.source
        switch (source._tag) {
          case "ReplicationLag":
            return Effect.map(replication, (result) =>
              Option.some(
                result._tag === "Success" ? value(result.success[source.measure]) : unknown(result.failure.message)
              ))
          case "WalRate":
            return Effect.map(Effect.result(signals.walPosition), (result) => {
              if (result._tag === "Failure") {
                previousWal = undefined
                return Option.some(unknown(result.failure.message))
              }
              const before = previousWal
              previousWal = { at, position: result.success }
              // The first sample has nothing to take a rate against: no reading yet (not unknown).
              if (before === undefined || at <= before.at) {
                return Option.none()
              }
              return Option.some(value(Math.max(0, (result.success - before.position) / ((at - before.at) / 1000))))
            })
          case "Autovacuum":
            return Effect.map(
              asReading(Effect.map(vacuumed, (tables) => tables.includes(slot.subject) ? 1 : 0)),
              Option.some
            )
          case "LongTransactions":
            return Effect.map(asReading(signals.oldestTransaction), Option.some)
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
          if (Option.isNone(reading)) return
          slot.reading = reading
          slot.readAt = at
          const r = reading.value
          const where = { signal: slot.rule.signal, ...(slot.subject === "" ? {} : { subject: slot.subject }) }
          if (r._tag === "Unknown") {
            yield* increment(healthSignalUnknownTotal, 1, { signal: slot.rule.signal })
            if (slot.unknownLogged !== r.reason) {
              slot.unknownLogged = r.reason
              yield* Effect.logWarning("Health signal unknown", {
                ...where,
                reason: r.reason,
                treatedAs: slot.rule.onUnknown
              })
            }
          } else {
            if (slot.unknownLogged !== undefined) {
              slot.unknownLogged = undefined
              yield* Effect.logInfo("Health signal readable again", where)
            }
            if (isRelative(slot.rule)) slot.samples = addSample(slot.samples, at, r.value)
          }
        }), { concurrency: "unbounded", discard: true })
      // Gauges: per signal the worst reading over its subjects, and whether any is unknown.
      for (const rule of config.rules) {
        const readings = slotsOf(rule).flatMap((slot) => Option.toArray(slot.reading))
        if (readings.length === 0) continue
        const known = readings.filter((r) => r._tag === "Value")
        // Nothing readable: NaN, not a reassuring 0 (sweeper_health_signal_unknown says why).
        const worst = known.length === 0 ? value(Number.NaN) : worstOf(rule, known)
        yield* setGauge(healthSignal, worst._tag === "Value" ? worst.value : Number.NaN, { signal: rule.signal })
        yield* setGauge(healthSignalUnknown, readings.some((r) => r._tag === "Unknown") ? 1 : 0, {
          signal: rule.signal
        })
      }
    })

    const firstRound = yield* Deferred.make<void>()
    yield* sampleRound.pipe(
      Effect.andThen(Deferred.succeed(firstRound, undefined)),
      // Spaced after each round: a slow server (up to READ_TIMEOUT) never makes rounds overlap.
      Effect.repeat(Schedule.spaced(RECHECK_INTERVAL)),
      Effect.forkScoped
    )

    // ---- judging a batch -------------------------------------------------------------------------
    const baselineOf = (rule: SignalRule, subject = ""): Option.Option<number> => {
      const slot = slots.get(slotKey(rule.signal, subject)) ?? slotsOf(rule)[0]
      return slot === undefined ? Option.none() : median(slot.samples)
    }
    const readingFor = (rule: SignalRule, batch: string): Reading => {
      const writes = writeSets.get(batch)!
      const readings = subjectsFor(rule, writes).flatMap((subject) =>
        Option.toArray(slots.get(slotKey(rule.signal, subject))?.reading ?? Option.none())
      )
      // Not read yet (WAL rate's first sample): nothing to hold on.
      if (readings.length === 0) return value(Number.NaN)
      return worstOf(rule, readings, baselineOf(rule))
    }

    const holds = new Map<string, Map<string, Hold>>()
    const holdsOf = (batch: string) => {
      let held = holds.get(batch)
      if (held === undefined) holds.set(batch, held = new Map())
      return held
    }
    const append = (event: RepairHeld | RepairReleased) =>
      events.append(event).pipe(
        Effect.catchCause((cause) => Effect.logError("Could not record health gate event", String(cause)))
      )

    const startHold = Effect.fnUntraced(function*(batch: string, rule: SignalRule, reading: Reading, now: number) {
      const baseline = baselineOf(rule)
      const threshold = Option.getOrNull(thresholdValue(rule.stop, baseline))
      const v = reading._tag === "Value" ? reading.value : null
      const display = reading._tag === "Value" ? formatValue(rule.unit, reading.value) : `unknown (${reading.reason})`
      const thresholdText = formatThreshold(rule, rule.stop, baseline)
      holdsOf(batch).set(rule.signal, { since: now, value: v, display, threshold: thresholdText, lastCounted: now })
      yield* setGauge(repairHeld, 1, { batch, signal: rule.signal })
      yield* append(
        new RepairHeld({
          batch,
          signal: rule.signal,
          value: v,
          threshold,
          stop: rule.stop.text,
          unit: rule.unit,
          ...(reading._tag === "Unknown" ? { unknown: reading.reason } : {})
        })
      )
      yield* Effect.logWarning("Repair held", { batch, signal: rule.signal, value: display, threshold: thresholdText })
    })

    const countHeld = (batch: string, signal: string, hold: Hold, now: number) => {
      const seconds = (now - hold.lastCounted) / 1000
      hold.lastCounted = now
      return seconds > 0 ? increment(repairHeldSecondsTotal, seconds, { batch, signal }) : Effect.void
    }

    const endHold = Effect.fnUntraced(function*(batch: string, signal: string, now: number, reason?: "budget") {
      const hold = holdsOf(batch).get(signal)
      if (hold === undefined) return
      holdsOf(batch).delete(signal)
      yield* countHeld(batch, signal, hold, now)
      yield* setGauge(repairHeld, 0, { batch, signal })
      const heldMs = now - hold.since
      yield* append(new RepairReleased({ batch, signal, heldMs, ...(reason === undefined ? {} : { reason }) }))
      yield* Effect.logInfo("Repair released", {
        batch,
        signal,
        held_ms: heldMs,
        ...(reason === undefined ? {} : { reason })
      })
    })

    const PROCEED = { proceed: true, heldMs: 0, heldBy: [] as ReadonlyArray<string> }

    const beforeUnit: HealthGateShape["beforeUnit"] = ({ batch, deadlineMillis }) =>
      Effect.provideService(
        Effect.gen(function*() {
          const rules = holdingRules(batch)
          if (rules.length === 0) return PROCEED
          yield* Deferred.await(firstRound)
          const started = yield* Clock.currentTimeMillis
          const heldBy = new Set<string>()
          const held = holdsOf(batch)
          while (true) {
            const now = yield* Clock.currentTimeMillis
            for (const rule of rules) {
              const reading = readingFor(rule, batch)
              if (reading._tag === "Value" && Number.isNaN(reading.value)) continue
              const hold = held.get(rule.signal)
              const isHeld = nextHeld(rule, hold !== undefined, reading, baselineOf(rule))
              if (hold === undefined && isHeld) {
                heldBy.add(rule.signal)
                yield* startHold(batch, rule, reading, now)
              } else if (hold !== undefined && !isHeld) {
                yield* endHold(batch, rule.signal, now)
              } else if (hold !== undefined) {
                heldBy.add(rule.signal)
                yield* countHeld(batch, rule.signal, hold, now)
              }
            }
            if (held.size === 0) {
              return heldBy.size === 0
                ? PROCEED
                : { proceed: true, heldMs: now - started, heldBy: [...heldBy] }
            }
            if (deadlineMillis !== undefined && now >= deadlineMillis) {
              for (const signal of Array.from(held.keys())) yield* endHold(batch, signal, now, "budget")
              return { proceed: false, heldMs: now - started, heldBy: [...heldBy] }
            }
            const wait = deadlineMillis === undefined
              ? Duration.toMillis(RECHECK_INTERVAL)
              : Math.min(Duration.toMillis(RECHECK_INTERVAL), deadlineMillis - now)
            yield* Effect.sleep(Duration.millis(Math.max(1, wait)))
          }
        }).pipe(
          // Interrupted while held (shutdown, hard timeout): the pair is still closed.
          Effect.onInterrupt(() =>
            Effect.gen(function*() {
              const now = yield* Clock.currentTimeMillis
              for (const signal of Array.from(holdsOf(batch).keys())) yield* endHold(batch, signal, now, "budget")
            })
          )
        ),
        Metrics,
        metrics
      )

    // ---- throttled concurrency limits --------------------------------------------------------------
    const throttles = new Map<string, { state: ThrottleState; limit: number; held: Map<string, boolean> }>()
    const effectiveLimit: HealthGateShape["effectiveLimit"] = ({ batch, worker, limit }) =>
      Effect.provideService(
        Effect.gen(function*() {
          if (!config.throttleLimits || !throttling.has(batch)) return limit
          yield* Deferred.await(firstRound)
          const previous = throttles.get(worker)
          const held = previous?.held ?? new Map<string, boolean>()
          let unhealthy = false
          for (const rule of config.rules.filter(throttlesInsteadOfHolding)) {
            const reading = readingFor(rule, batch)
            if (reading._tag === "Value" && Number.isNaN(reading.value)) continue
            const isHeld = nextHeld(rule, held.get(rule.signal) === true, reading, baselineOf(rule))
            held.set(rule.signal, isHeld)
            unhealthy ||= isHeld
          }
          const state = throttleStep(limit, Option.map(Option.fromUndefinedOr(previous), (p) => p.state), unhealthy)
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
        yield* setGauge(repairHeld, 0, { batch, signal: rule.signal })
        // `increment` skips 0; the series must exist at 0 so rate() and the dashboard see the first hold.
        yield* Metric.update(Metric.withAttributes(repairHeldSecondsTotal, { batch, signal: rule.signal }), 0)
      }
    }
    for (const rule of config.rules) yield* setGauge(healthSignalUnknown, 0, { signal: rule.signal })
    for (const [worker, setting] of Object.entries(options.concurrencyLimits)) {
      yield* setGauge(concurrencyLimitEffectiveLimit, setting.limit, { worker })
    }

    // ---- the report ----------------------------------------------------------------------------------
    const snapshot: Effect.Effect<HealthSnapshot> = Effect.sync(() => {
      const signalReports: Array<SignalReport> = [...slots.values()].map((slot) => {
        const baseline = median(slot.samples)
        const reading = Option.getOrUndefined(slot.reading)
        const base = {
          signal: slot.rule.signal,
          subject: slot.subject,
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
      for (const [batch, held] of holds) {
        for (const [signal, hold] of held) {
          const rule = config.rules.find((r) => r.signal === signal)
          holdReports.push({
            batch,
            signal,
            value: hold.value,
            display: hold.display,
            threshold: hold.threshold,
            since: new Date(hold.since).toISOString(),
            text: holdText({
              batch,
              signal,
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
