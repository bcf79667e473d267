/**
 * One batch's actor: a fiber that takes its mailbox's messages (Tick | RunNow) one batch of them at a
 * time, so runs never overlap and ticks that queued during a run coalesce into one; and its ticker,
 * which posts the cron's ticks. The scheduler (Scheduler.ts) creates, starts and supervises both.
 */
import * as DateTime from "effect/DateTime"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as FiberSet from "effect/FiberSet"
import * as Queue from "effect/Queue"
import * as Ref from "effect/Ref"
import { type BatchHistory, isBreakerOpen, withRun } from "../domain/BatchState.ts"
import { nextTick, periodAt, tickClaimTtl } from "../domain/Schedule.ts"
import type { Actor, Message, Runs } from "./Actor.ts"
import { flushUnrecorded, recordMissed } from "./MissedTicks.ts"
import { refreshPaused } from "./PauseState.ts"
import { NOT_STARTED_DATABASE_UNAVAILABLE, runBatch, type RunResult, type Trigger } from "./RunGuard.ts"

const currentDate = Effect.map(Effect.clockWith((clock) => clock.currentTimeMillis), (now) => new Date(now))

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

export const ticker = (actor: Actor) => Effect.forever(nextTickOf(actor))

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

/** One run through the run guard, in the scheduler's set of runs in flight; the state follows it. */
const execute = (
  actor: Actor,
  runs: Runs,
  options: { trigger: Trigger; scheduledAt?: Date; dryRun?: boolean; asOf?: Date | undefined }
) =>
  Effect.gen(function*() {
    // Ticks missed during an outage are written before this run's events, in tick order.
    yield* flushUnrecorded(actor)
    yield* Ref.update(actor.state, (s) => ({ ...s, status: "running" as const, pendingTick: undefined }))
    const fiber = yield* FiberSet.run(
      runs.inflight,
      runBatch(actor.batch, {
        trigger: options.trigger,
        dryRun: options.dryRun,
        asOf: options.asOf,
        scheduledAt: options.scheduledAt === undefined ? undefined : DateTime.fromDateUnsafe(options.scheduledAt),
        tickClaimTtl: options.scheduledAt === undefined
          ? undefined
          : tickClaimTtl(periodAt(actor.cron, options.scheduledAt))
      })
    )
    const result = yield* Fiber.join(fiber)
    const finishedAt = yield* currentDate
    yield* Ref.update(actor.state, (s) => ({
      ...s,
      // Paused or resumed while it ran: the status follows the pause now.
      status: s.status === "running" ? (s.history.paused ? "paused" as const : "idle" as const) : s.status,
      // A dry run changes nothing, the batch's history included (as in the event fold).
      history: result.dryRun ? s.history : afterRun(s.history, result, finishedAt)
    }))
    if (result.outcome === "skipped" && result.reason === "lease unavailable" && options.scheduledAt !== undefined) {
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

/** A manual run, answered on its reply; skipped while shutting down, dropped if its asker left. */
const runNow = (actor: Actor, runs: Runs, message: Extract<Message, { _tag: "RunNow" }>) =>
  Effect.gen(function*() {
    // Its asker gave up while it waited (a cancelled request, a client gone): nobody wants it now.
    if (yield* Deferred.isDone(message.reply)) return
    if (yield* Ref.get(runs.shuttingDown)) {
      yield* Deferred.succeed(message.reply, {
        batch: actor.batch.name,
        runId: "",
        outcome: "skipped",
        summary: null,
        reason: "shutting down",
        durationMs: 0,
        dryRun: message.dryRun
      })
      return
    }
    yield* Deferred.succeed(
      message.reply,
      yield* execute(actor, runs, { trigger: "manual", dryRun: message.dryRun, asOf: message.asOf })
    )
  })

/**
 * A pause is the operator's decision, not a fault: its first missed tick says so once, at Info;
 * the ones after it are recorded and counted without a line each.
 */
const logPauseOnce = (actor: Actor) =>
  Effect.gen(function*() {
    const { history, pauseLogged } = yield* Ref.get(actor.state)
    const pause = history.pausedAt?.getTime() ?? 0
    if (pauseLogged === pause) return
    yield* Ref.update(actor.state, (s) => ({ ...s, pauseLogged: pause }))
    yield* Effect.logInfo(
      `Tick missed: paused${
        history.pausedBy === undefined ? "" : ` by ${history.pausedBy}`
      }; its ticks are skipped until it is resumed`
    )
  })

/**
 * The ticks of one batch of messages: only the newest runs, the older ones overlapped. A tick
 * runs unless the batch is disabled or paused, or its circuit breaker is open.
 */
const runTicks = (actor: Actor, runs: Runs, ticks: ReadonlyArray<Extract<Message, { _tag: "Tick" }>>) =>
  Effect.gen(function*() {
    const newest = ticks[ticks.length - 1]
    if (newest === undefined) return
    for (const older of ticks.slice(0, -1)) yield* recordMissed(actor, older.scheduledAt, "overlap")
    if (yield* Ref.get(runs.shuttingDown)) return
    yield* refreshPaused(actor)
    const { status, history } = yield* Ref.get(actor.state)
    if (status === "disabled") return yield* recordMissed(actor, newest.scheduledAt, "disabled")
    if (status === "paused") return yield* recordMissed(actor, newest.scheduledAt, "paused", logPauseOnce(actor))
    const now = yield* currentDate
    if (isBreakerOpen(history, now, Duration.toMillis(periodAt(actor.cron, newest.scheduledAt)))) {
      yield* Effect.logWarning(`Circuit breaker open after ${history.consecutiveFailures} failed runs; tick skipped`)
        .pipe(Effect.annotateLogs({ batch: actor.batch.name }))
      return yield* recordMissed(actor, newest.scheduledAt, "breaker_open")
    }
    yield* execute(actor, runs, { trigger: newest.trigger, scheduledAt: newest.scheduledAt })
  })

/** The actor: manual runs in the order they came, then the coalesced tick. Forever. */
export const actorLoop = (actor: Actor, runs: Runs) =>
  Effect.gen(function*() {
    while (true) {
      const first = yield* Queue.take(actor.mailbox)
      const rest = yield* Queue.clear(actor.mailbox)
      // Ticks that queued while we were busy with `first` coalesce with it.
      yield* Ref.update(actor.state, (s) => ({ ...s, pendingTick: undefined }))
      const messages = [first, ...rest]
      for (const message of messages) if (message._tag === "RunNow") yield* runNow(actor, runs, message)
      yield* runTicks(actor, runs, messages.filter((m): m is Extract<Message, { _tag: "Tick" }> => m._tag === "Tick"))
    }
  })
