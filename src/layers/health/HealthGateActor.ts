/**
 * The health gate's actor: the one fiber that owns the gate's state — every run's holds
 * (domain/HealthHolds.ts), the held-seconds bookkeeping and the throttled concurrency limits — and
 * writes every RepairHeld / RepairReleased event. Waiters never touch that state: they put a request
 * on the actor's queue and wait on the Deferred it completes. The actor takes one request at a time,
 * events and metrics included, so a check can never act on holds another check changed while it
 * yielded (which is how two waiters of one run once wrote two RepairHeld for one hold).
 *
 *   waiter ──offer(Ask, Deferred)──▶ queue ──take──▶ actor: judge the run's rules on the latest
 *   readings, open/close holds, write their events ──succeed(Deferred)──▶ waiter
 *
 * What the actor holds is published in a SubscriptionRef after every request, so the report reads
 * a snapshot instead of reaching into the actor's maps. Its requests, replies and view are in
 * GateActorProtocol.ts.
 */
import * as Cause from "effect/Cause"
import * as Clock from "effect/Clock"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Metric from "effect/Metric"
import * as Option from "effect/Option"
import * as Queue from "effect/Queue"
import * as SubscriptionRef from "effect/SubscriptionRef"
import { CurrentRun, type RunInfo } from "../../domain/Batch.ts"
import { DATABASE_NAMES } from "../../domain/Databases.ts"
import { healthStream, RepairHeld, RepairReleased } from "../../domain/Events.ts"
import {
  formatThreshold,
  formatValue,
  type HealthConfig,
  heldDisplay,
  judge,
  type Reading,
  type SignalRule,
  thresholdValue,
  throttlesInsteadOfHolding,
  type ThrottleState,
  throttleStep
} from "../../domain/Health.ts"
import * as Holds from "../../domain/HealthHolds.ts"
import * as Ledger from "../../domain/HealthLedger.ts"
import { EventLog } from "../../services/EventLog.ts"
import {
  concurrencyLimitEffectiveLimit,
  increment,
  Metrics,
  repairHeld,
  repairHeldSecondsTotal,
  setGauge
} from "../../services/Metrics.ts"
import { type ActorView, type AskReply, type GateActor, holdReport, type Request } from "./GateActorProtocol.ts"
import { type GateBatches, signalLabels } from "./HealthGateBatches.ts"
import type { BatchReadings } from "./HealthSampler.ts"

/**
 * How long the actor waits for one gate event to be appended. The event log is a PostgreSQL
 * insert; one that hangs must not stop the gate from answering every other run.
 */
export const EVENT_APPEND_TIMEOUT = Duration.seconds(5)
/**
 * How far back a batch's gate events (and its RunFinished events) are read for holds a stopped
 * process left open: a hold is a pair of events, and a run writes a few pairs at most.
 */
export const RECALL_EVENTS = 200

/** Events of a run the actor never saw enter (none in practice): written with no run id. */
const NO_RUN: RunInfo = { runId: null, batch: null, dryRun: false, budget: Option.none(), fence: Option.none() }

/** The key of a run's hold on a signal. */
const holdKey = (run: string, signal: string) => `${run}\u0000${signal}`

/** The actor, its fiber forked in the current scope: it answers as long as the scope lives. */
export const makeGateActor = (options: {
  readonly config: HealthConfig
  readonly batches: GateBatches
  readonly readings: BatchReadings
  readonly concurrencyLimits: Readonly<Record<string, { readonly limit: number }>>
}) =>
  Effect.gen(function*() {
    const { batches, config, readings } = options
    const events = yield* EventLog
    const metrics = yield* Metrics
    const queue = yield* Queue.unbounded<Request>()
    const view = yield* SubscriptionRef.make<ActorView>({ holds: [], throttled: [] })

    // The actor's state: read and written by the actor fiber alone.
    /** Runs by key (run id, or the batch for a run without one), with the batch they belong to. */
    const runs = new Map<string, { readonly batch: string; readonly info: RunInfo; state: Holds.RunHolds }>()
    /** When each open hold's seconds were last added to sweeper_repair_held_seconds_total. */
    const counted = new Map<string, number>()
    const throttles = new Map<
      string,
      { readonly state: ThrottleState; readonly limit: number; readonly held: ReadonlyMap<string, boolean> }
    >()
    /**
     * Holds the event log says a run of another process left open (a stopped process, or a live one
     * still holding), by batch: reported, and closed once their run's RunFinished is in the log.
     */
    const inherited = new Map<string, ReadonlyArray<Ledger.LeftOpen>>()

    const runOf = (key: string, batch: string, info: RunInfo = NO_RUN) => {
      let entry = runs.get(key)
      if (entry === undefined) runs.set(key, entry = { batch, info, state: Holds.emptyRun })
      return entry
    }
    const heldLabels = (batch: string, signal: string) => ({
      batch,
      ...signalLabels(signal, batches.databaseFor(signal, batch))
    })
    /** A gate event of run `key`, written as that run's (its run id on the row). */
    const append = (key: string, event: RepairHeld | RepairReleased) => appendAs(runs.get(key)?.info ?? NO_RUN, event)
    const appendAs = (run: RunInfo, event: RepairHeld | RepairReleased) =>
      events.append(event).pipe(
        Effect.provideService(CurrentRun, run),
        Effect.timeoutOrElse({
          duration: EVENT_APPEND_TIMEOUT,
          orElse: () => Effect.logError("Health gate event not recorded within its timeout", { type: event._tag })
        }),
        Effect.catchCause((cause) => Effect.logError("Could not record health gate event", Cause.pretty(cause)))
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
          key,
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
      const why = reason === undefined ? {} : { reason }
      yield* append(key, new RepairReleased({ batch, signal, heldMs, ...why, ...where }))
      yield* Effect.logInfo("Repair released", { batch, signal, ...where, held_ms: heldMs, ...why })
    })

    /**
     * A batch's holds left open in the event log, folded (domain/HealthLedger.ts): those whose run
     * finished are closed now, as of their run's end, under that run's id; the others are kept to report.
     */
    const recall = Effect.fnUntraced(function*(batch: string) {
      const gate = yield* events.query({ stream: healthStream(batch), newestFirst: true, limit: RECALL_EVENTS })
      const finished = yield* events.query({
        stream: `batch:${batch}`,
        type: "RunFinished",
        newestFirst: true,
        limit: RECALL_EVENTS
      })
      // This process's own runs' holds are the actor's already (a later recall sees them in the log); a
      // hold with no run id is a bare run's (a spec, the REPL), which no supervisor ran.
      const ours = new Set([...runs.values()].flatMap(({ info }) => info.runId ?? []))
      const open = Ledger.leftOpen([...gate, ...finished].sort((a, b) => a.id - b.id))
        .filter((hold) => hold.runId !== null && !ours.has(hold.runId))
      const now = yield* Clock.currentTimeMillis
      for (const hold of open) {
        if (hold.finishedAt === null) continue
        const heldMs = Ledger.heldUntilEnd(hold, now)
        const database = DATABASE_NAMES.find((name) => name === hold.held.database)
        const where = database === undefined ? {} : { database }
        const run: RunInfo = { ...NO_RUN, runId: hold.runId, batch }
        yield* appendAs(run, new RepairReleased({ batch, signal: hold.signal, heldMs, reason: "run_ended", ...where }))
        yield* Effect.logWarning("Repair released: its run ended while held", {
          batch,
          signal: hold.signal,
          ...where,
          held_ms: heldMs,
          held_run_id: hold.runId
        })
      }
      const still = open.filter((hold) => hold.finishedAt === null)
      if (still.length === 0) inherited.delete(batch)
      else inherited.set(batch, still)
    }, (effect, batch) =>
      effect.pipe(
        // The actor answers every run: a log that hangs delays it by this much once, then is left.
        Effect.timeoutOrElse({
          duration: EVENT_APPEND_TIMEOUT,
          orElse: () => Effect.logWarning("Holds left open not read within its timeout", { batch })
        }),
        Effect.catchCause((cause) =>
          Effect.logWarning("Could not read the holds left open", { batch }, Cause.pretty(cause))
        )
      ))

    const ask = Effect.fnUntraced(function*(
      key: string,
      batch: string,
      rules: ReadonlyArray<SignalRule>,
      deadlineMillis: number | undefined
    ) {
      const now = yield* Clock.currentTimeMillis
      const step = Holds.check(
        runOf(key, batch).state,
        rules,
        (rule) => readings.readingsFor(rule, batch, now),
        (rule) => readings.baselineOf(rule, batch)
      )
      for (const { reading, rule } of step.open) yield* startHold(key, batch, rule, reading, now)
      for (const signal of step.close) yield* endHold(key, signal, now)
      for (const signal of step.keep) yield* countHeld(key, batch, signal, now)
      const entry = runOf(key, batch)
      const held = entry.state.holds.size > 0
      const pastDeadline = held && deadlineMillis !== undefined && now >= deadlineMillis
      let heldMs = 0
      if (!held || pastDeadline) {
        const [taken, state] = Holds.takeHeld(entry.state, now)
        entry.state = state
        heldMs = taken
      }
      return {
        holding: [...step.open.map(({ rule }) => rule.signal), ...step.keep],
        held,
        heldMs,
        pastDeadline
      } satisfies AskReply
    })

    const leave = Effect.fnUntraced(function*(key: string) {
      const entry = runs.get(key)
      if (entry === undefined) return
      const [ending, state] = Holds.leave(entry.state)
      entry.state = state
      const now = yield* Clock.currentTimeMillis
      for (const signal of ending) yield* endHold(key, signal, now, "budget")
      if (Holds.idle(entry.state)) runs.delete(key)
    })

    const throttle = Effect.fnUntraced(
      function*(batch: string, worker: string, limit: number, dryRun: boolean) {
        const now = yield* Clock.currentTimeMillis
        const previous = throttles.get(worker)
        const held = new Map(previous?.held ?? [])
        let unhealthy = false
        for (const rule of config.rules.filter(throttlesInsteadOfHolding)) {
          const ruleReadings = readings.readingsFor(rule, batch, now)
          if (ruleReadings.length === 0) continue
          const isHeld = judge(rule, held.get(rule.signal) === true, ruleReadings, readings.baselineOf(rule, batch))
            .held
          held.set(rule.signal, isHeld)
          unhealthy ||= isHeld
        }
        const state = throttleStep(limit, Option.map(Option.fromUndefinedOr(previous), (p) => p.state), unhealthy)
        // A dry run says what the limit would be, and leaves the throttle where the real runs put it.
        if (dryRun) return state.effective
        throttles.set(worker, { state, limit, held })
        yield* setGauge(concurrencyLimitEffectiveLimit, state.effective, { worker })
        if (state.effective !== limit) {
          yield* Effect.logInfo("Concurrency limit throttled", { worker, limit, effective: state.effective })
        }
        return state.effective
      }
    )

    const publish = Effect.suspend(() =>
      SubscriptionRef.set(view, {
        holds: [
          ...[...runs.values()].flatMap(({ batch, state }) =>
            [...state.holds].map(([signal, hold]) => holdReport(batches, config.rules, batch, signal, hold))
          ),
          ...[...inherited.values()].flat().map((hold) => {
            const { display, threshold, value } = heldDisplay(hold.held)
            return holdReport(batches, config.rules, hold.batch, hold.signal, {
              since: hold.since,
              value,
              display,
              threshold
            })
          })
        ],
        throttled: [...throttles].map(([worker, t]) => ({ worker, limit: t.limit, effective: t.state.effective }))
      })
    )

    /** The view is published before the waiter hears back: what it reads next already shows its request. */
    const answer = <A>(reply: Deferred.Deferred<A>, value: A) => Effect.andThen(publish, Deferred.succeed(reply, value))

    const handle = (request: Request): Effect.Effect<void, never, Metrics> => {
      switch (request._tag) {
        case "Enter":
          return Effect.gen(function*() {
            const entry = runOf(request.run, request.batch, request.info)
            entry.state = Holds.enter(entry.state)
            // A run of the batch starting is when a run another process left held may have been
            // closed (the run guard closes abandoned runs first): its holds are closed with it.
            if (inherited.has(request.batch)) {
              yield* recall(request.batch)
              yield* publish
            }
          })
        case "Recall":
          return Effect.andThen(recall(request.batch), publish)
        case "Ask":
          return Effect.flatMap(
            ask(request.run, request.batch, request.rules, request.deadlineMillis),
            (reply) => answer(request.reply, reply)
          )
        case "Leave":
          return Effect.andThen(leave(request.run), answer(request.reply, undefined))
        case "Throttle":
          return Effect.flatMap(
            throttle(request.batch, request.worker, request.limit, request.dryRun),
            (limit) => answer(request.reply, limit)
          )
      }
    }

    /** The waiter of a request whose handling died hears the defect instead of waiting forever. */
    const dieReply = (request: Request, defect: unknown): Effect.Effect<boolean> => {
      switch (request._tag) {
        case "Enter":
        case "Recall":
          return Effect.succeed(false)
        case "Leave":
          return Deferred.die(request.reply, defect)
        case "Ask":
          return Deferred.die(request.reply, defect)
        case "Throttle":
          return Deferred.die(request.reply, defect)
      }
    }

    // One request at a time, for as long as the gate lives. A request whose handling dies (a bug) is
    // logged and its waiter hears a defect, and the actor goes on with the next request.
    yield* Queue.take(queue).pipe(
      Effect.flatMap((request) =>
        handle(request).pipe(
          Effect.catchCause((cause) =>
            Effect.andThen(
              Effect.logError("Health gate request failed", Cause.pretty(cause)),
              dieReply(request, Cause.squash(cause))
            )
          )
        )
      ),
      Effect.forever,
      Effect.provideService(Metrics, metrics),
      Effect.forkScoped
    )

    // Its first requests: each batch's holds left open by a process that stopped, from the event log.
    for (const batch of batches.writeSets.keys()) yield* Queue.offer(queue, { _tag: "Recall", batch })

    /** Offer a request and wait on what the actor completes. */
    const request = <A>(make: (reply: Deferred.Deferred<A>) => Request) =>
      Effect.gen(function*() {
        const reply = yield* Deferred.make<A>()
        yield* Queue.offer(queue, make(reply))
        return yield* Deferred.await(reply)
      })

    const seriesAtStart = Effect.gen(function*() {
      for (const batch of batches.writeSets.keys()) {
        for (const rule of batches.holdingRules(batch)) {
          yield* setGauge(repairHeld, 0, heldLabels(batch, rule.signal))
          // `increment` skips 0; the series must exist at 0 so rate() and the dashboard see the first hold.
          yield* Metric.update(Metric.withAttributes(repairHeldSecondsTotal, heldLabels(batch, rule.signal)), 0)
        }
      }
      for (const [worker, setting] of Object.entries(options.concurrencyLimits)) {
        yield* setGauge(concurrencyLimitEffectiveLimit, setting.limit, { worker })
      }
    }).pipe(Effect.provideService(Metrics, metrics))

    return {
      enter: (run, batch, info) => Effect.asVoid(Queue.offer(queue, { _tag: "Enter", run, batch, info })),
      ask: (run, batch, rules, deadlineMillis) =>
        request<AskReply>((reply) => ({ _tag: "Ask", run, batch, rules, deadlineMillis, reply })),
      leave: (run, wait) =>
        Effect.gen(function*() {
          const reply = yield* Deferred.make<void>()
          yield* Queue.offer(queue, { _tag: "Leave", run, reply })
          if (wait) yield* Deferred.await(reply)
        }),
      throttle: (batch, worker, limit, dryRun) =>
        request<number>((reply) => ({ _tag: "Throttle", batch, worker, limit, dryRun, reply })),
      view,
      seriesAtStart
    } satisfies GateActor
  })
