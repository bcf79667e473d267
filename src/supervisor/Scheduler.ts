/**
 * The supervisor: one actor per batch, each a fiber with a mailbox (Tick | RunNow), supervised in a
 * FiberMap inside this scoped layer. Pause and resume do not wait in the mailbox (a run may hold it
 * for its whole budget): they write their event first and change the state only once it is written.
 *
 * - One run at a time per batch. Ticks that arrive during a run coalesce into one pending run; the
 *   others are recorded as TickMissed{overlap}.
 * - Ticks come from the batch's cron (UTC or SWEEPER_TIMEZONE; SWEEPER_CRON_<BATCH> overrides) and
 *   are claimed cluster-wide by the run guard's tick lease, so each tick runs in exactly one process.
 * - State is the fold of the batch's events, rebuilt at start-up; the missed-run policy then decides
 *   whether to run the latest missed tick, and every tick that will not run is recorded.
 * - A crashed actor is logged and restarted with backoff; a failed run is just an outcome.
 * - Shutdown: no new runs; in-flight runs get SWEEPER_SHUTDOWN_GRACE to finish, then are
 *   interrupted (their leases are released by the guard's finalizers).
 */
import * as Cause from "effect/Cause"
import * as Context from "effect/Context"
import type * as Cron from "effect/Cron"
import * as DateTime from "effect/DateTime"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as FiberMap from "effect/FiberMap"
import * as FiberSet from "effect/FiberSet"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Queue from "effect/Queue"
import * as Ref from "effect/Ref"
import * as Schedule from "effect/Schedule"
import * as Semaphore from "effect/Semaphore"
import { configureBatches, SweeperConfig } from "../config/Config.ts"
import { type BatchHistory, foldHistory, isBreakerOpen, withRun } from "../domain/BatchState.ts"
import { BatchDisabled, describeError, PauseNotRecorded, UnknownBatch } from "../domain/Errors.ts"
import { BatchPaused, BatchResumed, TickMissed } from "../domain/Events.ts"
import { DEFAULT_MISSED_RUN_POLICY, nextTick, periodAt, planStartup } from "../domain/Schedule.ts"
import type { RegisteredBatch } from "../programs/index.ts"
import { EventLog } from "../services/EventLog.ts"
import { Lease } from "../services/Lease.ts"
import { increment, initialiseSeries, ticksMissedTotal } from "../services/Metrics.ts"
import { closeAbandonedRuns } from "./AbandonedRuns.ts"
import { NOT_STARTED_DATABASE_UNAVAILABLE, runBatch, type RunResult, tickLeaseName, type Trigger } from "./RunGuard.ts"

type Message =
  | { readonly _tag: "Tick"; readonly scheduledAt: Date; readonly trigger: Trigger }
  | {
    readonly _tag: "RunNow"
    readonly dryRun: boolean
    readonly asOf?: Date | undefined
    readonly reply: Deferred.Deferred<RunResult>
  }

export interface RunNowOptions {
  readonly dryRun?: boolean | undefined
  /** Run a batch listed in SWEEPER_DISABLED_BATCHES anyway. */
  readonly force?: boolean | undefined
  /** Judge thresholds at this past instant (`sweeper events prune --before` asks prune-events this way). */
  readonly asOf?: Date | undefined
}

export type ActorStatus = "idle" | "running" | "paused" | "disabled"

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

interface ActorState {
  readonly status: ActorStatus
  readonly nextTick: Date | undefined
  readonly pendingTick: Date | undefined
  readonly history: BatchHistory
}

interface Actor {
  readonly batch: RegisteredBatch
  readonly cronText: string
  readonly cron: Cron.Cron
  readonly mailbox: Queue.Queue<Message>
  readonly state: Ref.Ref<ActorState>
  /** TickMissed events that could not be written (database down), oldest first; flushed later. */
  readonly unrecorded: Ref.Ref<ReadonlyArray<TickMissed>>
  /**
   * One pause-state change at a time: a pause (write, then apply) and the refresh from the event
   * log (read, then apply) must not interleave, or a refresh that read before the pause was written
   * would apply the old state after it.
   */
  readonly pauseLock: Semaphore.Semaphore
}

/** Per batch, at most this many unwritten TickMissed events wait for the database (the oldest go). */
export const MAX_UNRECORDED_MISSED_TICKS = 1000

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

/**
 * The one road of a pause or resume: its event, written or refused as PauseNotRecorded. The
 * supervisor (through the API) and the CLI without one (straight to the database) both take it;
 * every supervisor folds the event before its next tick.
 */
export const recordPause = (batch: string, action: "pause" | "resume", by: string) =>
  Effect.flatMap(
    EventLog,
    (events) =>
      events.append(action === "pause" ? new BatchPaused({ batch, by }) : new BatchResumed({ batch, by })).pipe(
        Effect.catchCause((cause) =>
          Effect.fail(new PauseNotRecorded({ batch, action, detail: describeError(Cause.squash(cause)) }))
        )
      )
  )

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
 * One cron tick of a batch: sleep until its next fire time (by the Clock, so TestClock drives it),
 * then post the Tick to the actor's mailbox — marked pending if a run is under way, where it will
 * coalesce. The ticker is this, forever.
 */
const nextTickOf = (actor: Actor) =>
  Effect.gen(function*() {
    const now = yield* Effect.clockWith((clock) => clock.currentTimeMillis)
    let next = nextTick(actor.cron, new Date(now))
    if (next.getTime() <= now) next = nextTick(actor.cron, new Date(now + 1))
    yield* Ref.update(actor.state, (s) => ({ ...s, nextTick: next }))
    yield* Effect.sleep(Duration.millis(next.getTime() - now))
    const state = yield* Ref.get(actor.state)
    if (state.status === "running") yield* Ref.update(actor.state, (s) => ({ ...s, pendingTick: next }))
    yield* Queue.offer(actor.mailbox, { _tag: "Tick", scheduledAt: next, trigger: "schedule" })
  })

const ticker = (actor: Actor) => Effect.forever(nextTickOf(actor))

const afterRun = (history: BatchHistory, result: RunResult, finishedAt: Date): BatchHistory => {
  const closed = (result.closed ?? []).reduce(withRun, history)
  if (result.outcome === "skipped" && result.reason === "tick claimed elsewhere") return closed
  // Never started (no RunStarted): a missed tick, not a run, so the breaker does not count it.
  if (result.reason === NOT_STARTED_DATABASE_UNAVAILABLE) return closed
  return withRun(closed, {
    runId: result.runId,
    outcome: result.outcome,
    finishedAt,
    durationMs: result.durationMs,
    summary: result.summary,
    reason: result.reason,
    error: result.error
  })
}

export const makeScheduler = (batches: ReadonlyArray<RegisteredBatch>) =>
  Effect.gen(function*() {
    const settings = yield* SweeperConfig
    const events = yield* EventLog
    const lease = yield* Lease

    const configured = yield* configureBatches(batches)

    // Every batch × outcome (and × missed reason) series exists from start-up at 0.
    yield* initialiseSeries(batches.map((b) => b.name))
    const shuttingDown = yield* Ref.make(false)
    const inflight = yield* FiberSet.make<RunResult>()
    const fibers = yield* FiberMap.make<string>()

    const actors = new Map<string, Actor>()
    for (const { batch, cron, cronText, disabled } of configured) {
      // Runs killed while no process was up are closed now when their budget has passed; the next
      // run under the exclusive lease closes the rest (AbandonedRuns.ts says why each is safe).
      // (Folded after closing, so the history already has them.)
      yield* closeAbandonedRuns(batch, {
        leaseEpoch: Option.none(),
        closedBy: `supervisor start-up on ${settings.node}`
      })
      const history = yield* loadHistory(batch.name)
      actors.set(batch.name, {
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
      })
    }

    /**
     * Writes the batch's TickMissed events that waited for the database, oldest first; stops at the
     * first that still cannot be written. Only the batch's own actor (or start-up, before it gets
     * any message) calls this, so two flushes of one batch never overlap.
     */
    const flushUnrecorded = (actor: Actor) =>
      Effect.gen(function*() {
        const waiting = yield* Ref.get(actor.unrecorded)
        let written = 0
        for (const event of waiting) {
          const ok = yield* events.append(event).pipe(Effect.as(true), Effect.orElseSucceed(() => false))
          if (!ok) break
          written++
        }
        if (written === 0) return
        yield* Ref.update(actor.unrecorded, (now) => now.slice(written))
        yield* Effect.logInfo(`Recorded ${written} missed tick(s) that waited for the database`)
          .pipe(Effect.annotateLogs({ batch: actor.batch.name }))
      })

    /**
     * A tick that will not run is recorded once cluster-wide: whoever claims the tick records it.
     * Except when the lease store itself is unreachable: then every replica records its own miss
     * (duplicated beats silent). When the run guard could not write the run's RunStarted
     * (`database_unavailable`), this process already holds the tick's claim. A TickMissed that
     * cannot be written waits in memory (bounded) and is written once the database answers again.
     */
    const recordMissed = (actor: Actor, scheduledAt: Date, reason: TickMissed["reason"]) =>
      Effect.gen(function*() {
        const at = DateTime.fromDateUnsafe(scheduledAt)
        if (reason !== "lease_unavailable" && reason !== "database_unavailable") {
          if (!(yield* lease.claim(tickLeaseName(actor.batch.name, at), Duration.hours(25)))) return
        }
        yield* increment(ticksMissedTotal, 1, { batch: actor.batch.name, reason })
        yield* Effect.logWarning("Tick missed")
        yield* Ref.update(actor.state, (s) => ({ ...s, history: { ...s.history, lastCoveredTick: scheduledAt } }))
        const event = new TickMissed({ batch: actor.batch.name, scheduled_at: DateTime.formatIso(at), reason })
        yield* flushUnrecorded(actor)
        const waiting = (yield* Ref.get(actor.unrecorded)).length > 0
        const written = !waiting && (yield* events.append(event).pipe(
          Effect.as(true),
          Effect.catchCause((cause) =>
            Effect.as(
              Effect.logWarning("Could not record missed tick; it waits for the database", Cause.pretty(cause)),
              false
            )
          )
        ))
        if (written) return
        const dropped = yield* Ref.modify(actor.unrecorded, (now) => {
          const next = [...now, event]
          const over = Math.max(0, next.length - MAX_UNRECORDED_MISSED_TICKS)
          return [over, next.slice(over)] as const
        })
        if (dropped > 0) {
          yield* Effect.logError(
            `${dropped} unrecorded missed tick(s) dropped: more than ${MAX_UNRECORDED_MISSED_TICKS} waiting`
          )
        }
      }).pipe(
        Effect.catchCause((cause) => Effect.logWarning("Could not record missed tick", Cause.pretty(cause))),
        Effect.annotateLogs({ batch: actor.batch.name, scheduled_at: scheduledAt.toISOString(), reason })
      )

    /**
     * Pauses are events, and not only this process writes them: `sweeper pause` against the same
     * database, or another replica's dashboard. Before each tick the actor takes the newest
     * BatchPaused / BatchResumed of its stream as the truth, so an operator's pause stops the
     * batch everywhere from its next tick. Unreadable events keep the state this process knows.
     */
    const refreshPaused = (actor: Actor) =>
      actor.pauseLock.withPermits(1)(Effect.gen(function*() {
        const stream = `batch:${actor.batch.name}`
        const [paused, resumed] = yield* Effect.all([
          events.query({ stream, type: "BatchPaused", newestFirst: true, limit: 1 }),
          events.query({ stream, type: "BatchResumed", newestFirst: true, limit: 1 })
        ])
        const lastPause = paused[0]
        const isPaused = lastPause !== undefined && (resumed[0] === undefined || resumed[0].id < lastPause.id)
        yield* Ref.update(actor.state, (s) => {
          if (s.history.paused === isPaused) return s
          const status = s.status === "disabled" || s.status === "running"
            ? s.status
            : isPaused
            ? "paused" as const
            : "idle" as const
          return isPaused
            ? {
              ...s,
              status,
              history: {
                ...s.history,
                paused: true,
                pausedBy: String(lastPause!.data.by ?? "unknown"),
                pausedAt: lastPause!.occurredAt
              }
            }
            : { ...s, status, history: { ...s.history, paused: false, pausedBy: undefined, pausedAt: undefined } }
        })
      })).pipe(
        Effect.catchCause((cause) => Effect.logWarning("Could not read the batch's pause state", Cause.pretty(cause)))
      )

    /**
     * Pause or resume: the event first, then the state. An event that cannot be written fails the
     * call with PauseNotRecorded and changes nothing: the event log is the truth every
     * replica and the refresh above fold, so a state it does not hold would be undone at the next
     * tick. A running batch keeps running; its status follows the pause when the run ends.
     */
    const setPaused = (actor: Actor, action: "pause" | "resume", by: string) =>
      actor.pauseLock.withPermits(1)(
        Effect.gen(function*() {
          yield* recordPause(actor.batch.name, action, by).pipe(Effect.provideService(EventLog, events))
          const at = new Date(yield* Effect.clockWith((clock) => clock.currentTimeMillis))
          yield* Ref.update(actor.state, (s) => {
            const keep = s.status === "disabled" || s.status === "running"
            return action === "pause"
              ? {
                ...s,
                status: keep ? s.status : "paused" as const,
                history: { ...s.history, paused: true, pausedBy: by, pausedAt: at }
              }
              : {
                ...s,
                status: keep ? s.status : "idle" as const,
                history: { ...s.history, paused: false, pausedBy: undefined, pausedAt: undefined }
              }
          })
          yield* Effect.logInfo(action === "pause" ? "Batch paused" : "Batch resumed", { by })
        }).pipe(Effect.annotateLogs({ batch: actor.batch.name }))
      )

    const execute = (
      actor: Actor,
      options: { trigger: Trigger; scheduledAt?: Date; dryRun?: boolean; asOf?: Date | undefined }
    ) =>
      Effect.gen(function*() {
        // Ticks missed during an outage are written before this run's events, in tick order.
        yield* flushUnrecorded(actor)
        yield* Ref.update(actor.state, (s) => ({ ...s, status: "running" as const, pendingTick: undefined }))
        const fiber = yield* FiberSet.run(
          inflight,
          runBatch(actor.batch, {
            trigger: options.trigger,
            dryRun: options.dryRun,
            asOf: options.asOf,
            scheduledAt: options.scheduledAt === undefined ? undefined : DateTime.fromDateUnsafe(options.scheduledAt),
            claimTick: options.scheduledAt !== undefined
          })
        )
        const result = yield* Fiber.join(fiber)
        const finishedAt = new Date(yield* Effect.clockWith((clock) => clock.currentTimeMillis))
        yield* Ref.update(actor.state, (s) => ({
          ...s,
          // Paused or resumed while it ran: the status follows the pause now.
          status: s.status === "running" ? (s.history.paused ? "paused" as const : "idle" as const) : s.status,
          // A dry run changes nothing, the batch's history included (as in the event fold).
          history: result.dryRun ? s.history : afterRun(s.history, result, finishedAt)
        }))
        if (
          result.outcome === "skipped" && result.reason === "lease unavailable" && options.scheduledAt !== undefined
        ) {
          yield* recordMissed(actor, options.scheduledAt, "lease_unavailable")
        }
        if (result.reason === NOT_STARTED_DATABASE_UNAVAILABLE && options.scheduledAt !== undefined) {
          yield* recordMissed(actor, options.scheduledAt, "database_unavailable")
        } else if (result.reason !== NOT_STARTED_DATABASE_UNAVAILABLE) {
          // The run's events were written: the database is back for the ticks that waited.
          yield* flushUnrecorded(actor)
        }
        return result
      })

    const handle = (actor: Actor, messages: ReadonlyArray<Message>) =>
      Effect.gen(function*() {
        const ticks = messages.filter((m): m is Extract<Message, { _tag: "Tick" }> => m._tag === "Tick")
        for (const message of messages) {
          switch (message._tag) {
            case "RunNow": {
              // Its asker gave up while it waited (a cancelled request, a client gone): nobody wants it now.
              if (yield* Deferred.isDone(message.reply)) break
              if (yield* Ref.get(shuttingDown)) {
                yield* Deferred.succeed(message.reply, {
                  batch: actor.batch.name,
                  runId: "",
                  outcome: "skipped",
                  summary: null,
                  reason: "shutting down",
                  durationMs: 0,
                  dryRun: message.dryRun
                })
                break
              }
              yield* Deferred.succeed(
                message.reply,
                yield* execute(actor, { trigger: "manual", dryRun: message.dryRun, asOf: message.asOf })
              )
              break
            }
            case "Tick":
              break
          }
        }
        // Coalesce: only the newest tick of this batch of messages runs; the older ones overlapped.
        const newest = ticks[ticks.length - 1]
        if (newest === undefined) return
        for (const older of ticks.slice(0, -1)) yield* recordMissed(actor, older.scheduledAt, "overlap")
        if (yield* Ref.get(shuttingDown)) return
        yield* refreshPaused(actor)
        const { status, history } = yield* Ref.get(actor.state)
        if (status === "disabled" || status === "paused") {
          return yield* recordMissed(actor, newest.scheduledAt, "disabled")
        }
        const now = new Date(
          yield* Effect.clockWith((clock) => clock.currentTimeMillis)
        )
        if (isBreakerOpen(history, now, Duration.toMillis(periodAt(actor.cron, newest.scheduledAt)))) {
          yield* Effect.logWarning(
            `Circuit breaker open after ${history.consecutiveFailures} failed runs; tick skipped`
          )
            .pipe(Effect.annotateLogs({ batch: actor.batch.name }))
          return yield* recordMissed(actor, newest.scheduledAt, "breaker_open")
        }
        yield* execute(actor, { trigger: newest.trigger, scheduledAt: newest.scheduledAt })
      })

    const actorLoop = (actor: Actor) =>
      Effect.gen(function*() {
        while (true) {
          const first = yield* Queue.take(actor.mailbox)
          const rest = yield* Queue.clear(actor.mailbox)
          // Ticks that queued while we were busy with `first` coalesce with it.
          yield* Ref.update(actor.state, (s) => ({ ...s, pendingTick: undefined }))
          yield* handle(actor, [first, ...rest])
        }
      })

    // Graceful shutdown runs before the fiber maps' own finalizers interrupt everything.
    yield* Effect.addFinalizer(() =>
      Effect.gen(function*() {
        yield* Ref.set(shuttingDown, true)
        const running = yield* FiberSet.size(inflight)
        if (running === 0) return
        yield* Effect.logInfo(
          `Shutting down: waiting up to ${Duration.format(settings.shutdownGrace)} for ${running} run(s)`
        )
        const finished = yield* FiberSet.awaitEmpty(inflight).pipe(Effect.timeoutOption(settings.shutdownGrace))
        if (Option.isNone(finished)) yield* Effect.logWarning("Grace period over: interrupting in-flight runs")
      })
    )

    // Start-up: apply the missed-run policy from each batch's folded history, then start ticking.
    const startedAt = new Date(yield* Effect.clockWith((clock) => clock.currentTimeMillis))
    for (const actor of actors.values()) {
      yield* FiberMap.run(
        fibers,
        `${actor.batch.name}:actor`,
        supervise(`Batch actor ${actor.batch.name}`, actorLoop(actor))
      )
      const state = yield* Ref.get(actor.state)
      if (state.status !== "disabled") {
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
      }
      yield* FiberMap.run(
        fibers,
        `${actor.batch.name}:ticker`,
        supervise(`Ticker of ${actor.batch.name}`, ticker(actor))
      )
    }

    const actorNamed = (name: string) => {
      const actor = actors.get(name)
      return actor === undefined
        ? Effect.fail(new UnknownBatch({ name, known: batches.map((b) => b.name) }))
        : Effect.succeed(actor)
    }

    const snapshots = Effect.forEach([...actors.values()], (actor) =>
      Effect.map(Ref.get(actor.state), (state): BatchSnapshot => ({
        batch: actor.batch,
        cronSchedule: actor.cron,
        name: actor.batch.name,
        worker: actor.batch.worker,
        description: actor.batch.description,
        cron: actor.cronText,
        timezone: settings.timezone,
        status: state.status,
        nextTick: state.nextTick,
        pendingTick: state.pendingTick,
        history: state.history
      })))

    return Scheduler.of({
      snapshots,
      runNow: (name, options = {}) =>
        Effect.gen(function*() {
          const actor = yield* actorNamed(name)
          if ((yield* Ref.get(actor.state)).status === "disabled" && options.force !== true) {
            return yield* new BatchDisabled({ name })
          }
          const reply = yield* Deferred.make<RunResult>()
          yield* Queue.offer(actor.mailbox, {
            _tag: "RunNow",
            dryRun: options.dryRun === true,
            asOf: options.asOf,
            reply
          })
          // An asker that leaves withdraws its request: the actor skips a reply that is already done.
          return yield* Deferred.await(reply).pipe(Effect.onInterrupt(() =>
            Deferred.interrupt(reply)
          ))
        }),
      pause: (name, by) => Effect.flatMap(actorNamed(name), (actor) => setPaused(actor, "pause", by)),
      resume: (name, by) => Effect.flatMap(actorNamed(name), (actor) => setPaused(actor, "resume", by))
    })
  })

export const schedulerLayer = (batches: ReadonlyArray<RegisteredBatch>) =>
  Layer.effect(Scheduler, makeScheduler(batches))
