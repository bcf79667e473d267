/**
 * The supervisor: one actor per batch, each a fiber with a mailbox (Tick | RunNow), supervised in a
 * FiberMap inside this scoped layer. Pause and resume do not wait in the mailbox (a run may hold it
 * for its whole budget): they write their event first and change the state only once it is written.
 *
 * - One run at a time per batch. Ticks that arrive during a run coalesce into one pending run; the
 *   others are recorded as TickMissed{overlap} (BatchActor.ts).
 * - Ticks come from the batch's cron (UTC or SWEEPER_TIMEZONE; SWEEPER_CRON_<BATCH> overrides) and
 *   are claimed cluster-wide by the run guard's tick lease, so each tick runs in exactly one process.
 * - State is the fold of the batch's events, rebuilt at start-up; the missed-run policy then decides
 *   whether to run the latest missed tick, and every tick that will not run is recorded (MissedTicks.ts).
 * - A crashed actor is logged and restarted with backoff; a failed run is just an outcome.
 * - Shutdown: no new runs; in-flight runs get SWEEPER_SHUTDOWN_GRACE to finish, then are
 *   interrupted (their leases are released by the guard's finalizers).
 */
import * as Cause from "effect/Cause"
import * as Context from "effect/Context"
import type * as Cron from "effect/Cron"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as FiberMap from "effect/FiberMap"
import * as FiberSet from "effect/FiberSet"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Queue from "effect/Queue"
import * as Ref from "effect/Ref"
import * as Schedule from "effect/Schedule"
import * as Semaphore from "effect/Semaphore"
import { configureBatches, type ConfiguredBatch, SweeperConfig } from "../config/Config.ts"
import { type BatchHistory, foldHistory } from "../domain/BatchState.ts"
import { BatchDisabled, type PauseNotRecorded, UnknownBatch } from "../domain/Errors.ts"
import type { TickMissed } from "../domain/Events.ts"
import { DEFAULT_MISSED_RUN_POLICY, planStartup } from "../domain/Schedule.ts"
import type { RegisteredBatch } from "../programs/index.ts"
import { EventLog } from "../services/EventLog.ts"
import { initialiseSeries } from "../services/Metrics.ts"
import { closeAbandonedRuns } from "./AbandonedRuns.ts"
import type { Actor, ActorState, ActorStatus, Message, Runs } from "./Actor.ts"
import { actorLoop, ticker } from "./BatchActor.ts"
import { recordMissed } from "./MissedTicks.ts"
import { setPaused } from "./PauseState.ts"
import type { RunResult } from "./RunGuard.ts"

export interface RunNowOptions {
  readonly dryRun?: boolean | undefined
  /** Run a batch listed in SWEEPER_DISABLED_BATCHES anyway. */
  readonly force?: boolean | undefined
  /** Judge thresholds at this past instant (`sweeper events prune --before` asks prune-events this way). */
  readonly asOf?: Date | undefined
}

export interface BatchSnapshot {
  readonly batch: RegisteredBatch
  readonly cronSchedule: Cron.Cron
  readonly name: string
  readonly worker: string
  readonly description: string
  readonly cron: string
  readonly timezone: string
  readonly status: ActorStatus
  readonly nextTick: Date | undefined
  readonly pendingTick: Date | undefined
  readonly history: BatchHistory
}

export class Scheduler extends Context.Service<Scheduler, {
  readonly snapshots: Effect.Effect<ReadonlyArray<BatchSnapshot>>
  runNow(name: string, options?: RunNowOptions): Effect.Effect<RunResult, UnknownBatch | BatchDisabled>
  /** Succeeds only once BatchPaused is written: durable, and seen by every replica's next tick. */
  pause(name: string, by: string): Effect.Effect<void, UnknownBatch | PauseNotRecorded>
  resume(name: string, by: string): Effect.Effect<void, UnknownBatch | PauseNotRecorded>
}>()("sweeper/supervisor/Scheduler") {}

const HISTORY_EVENTS = 1000

/** A batch's state, folded from its newest HISTORY_EVENTS events (oldest first). */
export const loadHistory = Effect.fnUntraced(function*(batch: string) {
  const events = yield* EventLog
  const stored = yield* events.query({ stream: `batch:${batch}`, newestFirst: true, limit: HISTORY_EVENTS })
  return foldHistory([...stored].reverse())
})

/** A crashed actor or ticker restarts after 1 s, 2 s, 4 s … at most 60 s apart. */
export const ACTOR_RESTARTS = Schedule.min([Schedule.exponential("1 second"), Schedule.spaced("60 seconds")])

/**
 * Runs `body` forever: a crash (or a return) is logged and `body` restarted on ACTOR_RESTARTS;
 * only an interruption ends it.
 */
export const supervise = <R>(name: string, body: Effect.Effect<unknown, unknown, R>) =>
  Effect.suspend(() => {
    let restarts = 0
    const once = Effect.flatMap(Effect.exit(body), (exit) => {
      if (Exit.isFailure(exit) && Cause.hasInterruptsOnly(exit.cause)) return Effect.void
      restarts++
      return Effect.logError(
        `${name} stopped; restarting (${restarts})`,
        Exit.isFailure(exit) ? Cause.pretty(exit.cause) : "returned"
      ).pipe(
        Effect.andThen(Effect.fail(exit))
      )
    })
    return Effect.retry(once, ACTOR_RESTARTS).pipe(Effect.ignore)
  })

/**
 * A batch's actor as the supervisor starts: runs killed while no process was up are closed first
 * when their budget has passed (the next run under the exclusive lease closes the rest;
 * AbandonedRuns.ts says why each is safe), then its history is folded, so it has them.
 */
const openActor = (configured: ConfiguredBatch<RegisteredBatch>, node: string) =>
  Effect.gen(function*() {
    const { batch, cron, cronText, disabled } = configured
    yield* closeAbandonedRuns(batch, { leaseEpoch: Option.none(), closedBy: `supervisor start-up on ${node}` })
    const history = yield* loadHistory(batch.name)
    return {
      batch,
      cronText,
      cron,
      mailbox: yield* Queue.unbounded<Message>(),
      unrecorded: yield* Ref.make<ReadonlyArray<TickMissed>>([]),
      pauseLock: yield* Semaphore.make(1),
      state: yield* Ref.make<ActorState>({
        status: disabled ? "disabled" : history.paused ? "paused" : "idle",
        nextTick: undefined,
        pendingTick: undefined,
        history
      })
    } satisfies Actor
  })

/**
 * The missed-run policy at start-up, from the batch's folded history: the ticks missed while no
 * process was up are recorded, and the latest one queued to run when the policy says so.
 */
const catchUp = (actor: Actor, startedAt: Date) =>
  Effect.gen(function*() {
    const state = yield* Ref.get(actor.state)
    if (state.status === "disabled") return
    const plan = planStartup(
      actor.cron,
      state.history.lastCoveredTick,
      startedAt,
      actor.batch.missedRuns ?? DEFAULT_MISSED_RUN_POLICY
    )
    for (const missed of plan.missed) yield* recordMissed(actor, missed, "downtime")
    if (plan.missedTotal > plan.missed.length) {
      yield* Effect.logWarning(
        `${plan.missedTotal} ticks were missed while down; recorded the newest ${plan.missed.length}`
      )
        .pipe(Effect.annotateLogs({ batch: actor.batch.name }))
    }
    if (plan.runTick !== undefined && state.status === "idle") {
      yield* Queue.offer(actor.mailbox, { _tag: "Tick", scheduledAt: plan.runTick, trigger: "startup" })
    }
  })

/** Shutdown: no new runs; in-flight runs get `grace` to finish before the fiber maps interrupt them. */
const drain = (runs: Runs, grace: Duration.Duration) =>
  Effect.gen(function*() {
    yield* Ref.set(runs.shuttingDown, true)
    const running = yield* FiberSet.size(runs.inflight)
    if (running === 0) return
    yield* Effect.logInfo(`Shutting down: waiting up to ${Duration.format(grace)} for ${running} run(s)`)
    const finished = yield* FiberSet.awaitEmpty(runs.inflight).pipe(Effect.timeoutOption(grace))
    if (Option.isNone(finished)) yield* Effect.logWarning("Grace period over: interrupting in-flight runs")
  })

const snapshotOf = (actor: Actor, state: ActorState, timezone: string): BatchSnapshot => ({
  batch: actor.batch,
  cronSchedule: actor.cron,
  name: actor.batch.name,
  worker: actor.batch.worker,
  description: actor.batch.description,
  cron: actor.cronText,
  timezone,
  status: state.status,
  nextTick: state.nextTick,
  pendingTick: state.pendingTick,
  history: state.history
})

/** Asks a batch's actor for a run and waits for its result; an asker that leaves withdraws the request. */
const askToRun = (actor: Actor, options: RunNowOptions) =>
  Effect.gen(function*() {
    if ((yield* Ref.get(actor.state)).status === "disabled" && options.force !== true) {
      return yield* new BatchDisabled({ name: actor.batch.name })
    }
    const reply = yield* Deferred.make<RunResult>()
    yield* Queue.offer(actor.mailbox, { _tag: "RunNow", dryRun: options.dryRun === true, asOf: options.asOf, reply })
    // The actor skips a reply that is already done.
    return yield* Deferred.await(reply).pipe(Effect.onInterrupt(() => Deferred.interrupt(reply)))
  })

export const makeScheduler = (batches: ReadonlyArray<RegisteredBatch>) =>
  Effect.gen(function*() {
    const settings = yield* SweeperConfig
    const events = yield* EventLog
    const configured = yield* configureBatches(batches)
    // Every batch × outcome (and × missed reason) series exists from start-up at 0.
    yield* initialiseSeries(batches.map((b) => b.name))
    const runs: Runs = { shuttingDown: yield* Ref.make(false), inflight: yield* FiberSet.make<RunResult>() }
    const fibers = yield* FiberMap.make<string>()
    const actors = new Map<string, Actor>()
    for (const batch of configured) actors.set(batch.batch.name, yield* openActor(batch, settings.node))

    // Graceful shutdown runs before the fiber maps' own finalizers interrupt everything.
    yield* Effect.addFinalizer(() => drain(runs, settings.shutdownGrace))

    const startedAt = new Date(yield* Effect.clockWith((clock) => clock.currentTimeMillis))
    for (const actor of actors.values()) {
      const name = actor.batch.name
      yield* FiberMap.run(fibers, `${name}:actor`, supervise(`Batch actor ${name}`, actorLoop(actor, runs)))
      yield* catchUp(actor, startedAt)
      yield* FiberMap.run(fibers, `${name}:ticker`, supervise(`Ticker of ${name}`, ticker(actor)))
    }

    const actorNamed = (name: string) => {
      const actor = actors.get(name)
      return actor === undefined
        ? Effect.fail(new UnknownBatch({ name, known: batches.map((b) => b.name) }))
        : Effect.succeed(actor)
    }
    const pauseOrResume = (action: "pause" | "resume") => (name: string, by: string) =>
      Effect.flatMap(actorNamed(name), (actor) => setPaused(actor, action, by)).pipe(
        Effect.provideService(EventLog, events)
      )

    return Scheduler.of({
      snapshots: Effect.forEach(
        [...actors.values()],
        (actor) => Effect.map(Ref.get(actor.state), (state) => snapshotOf(actor, state, settings.timezone))
      ),
      runNow: (name, options = {}) => Effect.flatMap(actorNamed(name), (actor) => askToRun(actor, options)),
      pause: pauseOrResume("pause"),
      resume: pauseOrResume("resume")
    })
  })

export const schedulerLayer = (batches: ReadonlyArray<RegisteredBatch>) =>
  Layer.effect(Scheduler, makeScheduler(batches))
