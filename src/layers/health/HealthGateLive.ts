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
 *
 * The parts, each in its own file: what the gate knows of its batches (HealthGateBatches.ts), the
 * sampler and its freshness (HealthSampler.ts), and the actor that owns the runs' holds, their events
 * and the throttled concurrency limits (HealthGateActor.ts). This file composes them and decides a
 * unit: a dry run's verdict, or a real run's wait — asking the actor, then sleeping until the sampler
 * publishes new readings or the deadline comes — until its holds release or its deadline passes.
 */
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as SubscriptionRef from "effect/SubscriptionRef"
import { CurrentRun } from "../../domain/Batch.ts"
import type { DatabaseName } from "../../domain/Databases.ts"
import { type HealthConfig, judge, type SignalRule } from "../../domain/Health.ts"
import { type GateVerdict, HealthGate, type HealthGateShape } from "../../services/HealthGate.ts"
import { HealthReport, type HealthSnapshot } from "../../services/HealthReport.ts"
import { DatabaseSignals, HealthSignals } from "../../services/HealthSignals.ts"
import { Metrics } from "../../services/Metrics.ts"
import { makeGateActor } from "./HealthGateActor.ts"
import { gateBatches, type GatedBatch } from "./HealthGateBatches.ts"
import { makeSampler } from "./HealthSampler.ts"

export { type GatedBatch, writeSetOf } from "./HealthGateBatches.ts"
export { ACTIVE_WINDOW, FRESH_ROUND, IDLE_INTERVAL, ROUND_WAIT, STALE_AFTER } from "./HealthSampler.ts"

export interface GateOptions {
  readonly config: HealthConfig
  readonly batches: ReadonlyArray<GatedBatch>
  /** Queues and limits SWEEPER_CONCURRENCY_LIMITS configures (concurrency-limit-resume's pushes, its gauges). */
  readonly concurrencyLimits: Readonly<Record<string, { readonly limit: number; readonly queue: string }>>
}

const PROCEED: GateVerdict = { proceed: true, heldMs: 0, heldBy: [] }

/** The gate and its report, over HealthSignals and EventLog; its sampler lives as long as the layer. */
export const makeHealthGate = (options: GateOptions) =>
  Effect.gen(function*() {
    const signals = yield* HealthSignals
    const byDatabase = yield* Effect.serviceOption(DatabaseSignals)
    // Without a ci database of its own, every PostgreSQL signal is read on the one client, as main.
    const decomposed = Option.isSome(byDatabase)
    const signalsOf = (database: DatabaseName): HealthSignals["Service"] =>
      Option.isSome(byDatabase) ? byDatabase.value[database] : signals
    // Captured once: beforeUnit and effectiveLimit are called from programs, which need not know
    // that the gate counts its holds.
    const metrics = yield* Metrics
    const { config } = options
    const limitQueues = [...new Set(Object.values(options.concurrencyLimits).map((setting) => setting.queue))]
    const batches = gateBatches(config, options.batches, limitQueues, decomposed)

    const sampler = yield* makeSampler({
      rules: config.rules,
      writeSets: batches.writeSets,
      decomposed,
      signals,
      signalsOf
    })
    const actor = yield* makeGateActor({
      config,
      batches,
      readings: sampler,
      concurrencyLimits: options.concurrencyLimits
    })

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

    /**
     * A real run's unit: the WAL position read fresh, then the actor asked; while held, the waiter
     * sleeps until the sampler publishes new readings or its deadline comes, and asks again.
     */
    const waitForRelease = (
      key: string,
      batch: string,
      rules: ReadonlyArray<SignalRule>,
      deadlineMillis: number | undefined
    ) =>
      Effect.gen(function*() {
        const writtenDatabases = batches.writeSets.get(batch)?.databases ?? []
        const heldBy = new Set<string>()
        let first = true
        while (true) {
          const asked = yield* Clock.currentTimeMillis
          // A held batch keeps the sampler at its active pace: its readings are what wakes it.
          if (writtenDatabases.length > 0) sampler.demanded(asked)
          yield* sampler.ensureFresh(asked, deadlineMillis)
          // The unit's own read of the WAL position; a held waiter is woken by a round that read it.
          if (first) {
            for (const database of writtenDatabases) yield* sampler.freshReplication(database, asked, deadlineMillis)
          }
          first = false
          const seen = yield* sampler.published
          const reply = yield* actor.ask(key, batch, rules, deadlineMillis)
          for (const signal of reply.holding) heldBy.add(signal)
          if (!reply.held) {
            return heldBy.size === 0 ? PROCEED : { proceed: true, heldMs: reply.heldMs, heldBy: [...heldBy] }
          }
          if (reply.pastDeadline) return { proceed: false, heldMs: reply.heldMs, heldBy: [...heldBy] }
          const now = yield* Clock.currentTimeMillis
          const untilNews = sampler.publishedAfter(seen)
          yield* deadlineMillis === undefined
            ? untilNews
            : Effect.timeoutOption(untilNews, Duration.millis(Math.max(1, deadlineMillis - now)))
        }
      })

    const beforeUnit: HealthGateShape["beforeUnit"] = ({ batch, deadlineMillis }) =>
      Effect.provideService(
        Effect.gen(function*() {
          const rules = batches.holdingRules(batch)
          if (rules.length === 0) return PROCEED
          const run = yield* CurrentRun
          if (run.dryRun) {
            yield* sampler.ensureFresh(yield* Clock.currentTimeMillis, deadlineMillis)
            return yield* dryVerdict(batch, rules, yield* Clock.currentTimeMillis)
          }
          const key = run.runId ?? `batch:${batch}`
          // Returned, reached its deadline or interrupted: the last waiter out closes what is still open.
          return yield* Effect.acquireUseRelease(
            actor.enter(key, batch, run),
            () => waitForRelease(key, batch, rules, deadlineMillis),
            // An interrupted waiter does not wait for the actor (which may be closing with the gate).
            (_, exit) => actor.leave(key, !Exit.hasInterrupts(exit))
          )
        }),
        Metrics,
        metrics
      )

    const effectiveLimit: HealthGateShape["effectiveLimit"] = ({ batch, limit, worker }) =>
      Effect.gen(function*() {
        if (!config.throttleLimits || !batches.throttling.has(batch)) return limit
        const run = yield* CurrentRun
        const asked = yield* Clock.currentTimeMillis
        if (!run.dryRun) sampler.demanded(asked)
        yield* sampler.ensureFresh(asked, run.deadline)
        return yield* actor.throttle(batch, worker, limit, run.dryRun)
      }).pipe(Effect.provideService(Metrics, metrics))

    const ownWrite: HealthGateShape["ownWrite"] = (batch) => (write) =>
      Effect.flatMap(CurrentRun, (run) =>
        run.dryRun ? write : sampler.ownWrite(batches.writeSets.get(batch)?.databases ?? [])(write))

    // Every series exists from start-up, at rest, so that rate() and the dashboard see its first change.
    yield* actor.seriesAtStart
    yield* Effect.provideService(sampler.seriesAtStart, Metrics, metrics)

    const snapshot: Effect.Effect<HealthSnapshot> = Effect.map(SubscriptionRef.get(actor.view), (view) => ({
      configured: true,
      signals: sampler.signalReports(),
      holds: view.holds,
      throttled: view.throttled
    }))

    return { gate: { beforeUnit, effectiveLimit, ownWrite } satisfies HealthGateShape, report: { snapshot } }
  })

/** HealthGate and HealthReport as configured; needs HealthSignals and EventLog, samples while the layer lives. */
export const HealthGateLive = (options: GateOptions) =>
  Layer.effectContext(
    Effect.map(makeHealthGate(options), ({ gate, report }) =>
      Context.make(HealthGate, gate).pipe(Context.add(HealthReport, report)))
  )
