/**
 * The supervisor: one actor per batch, each a fiber with a mailbox (Tick | RunNow | Pause | Resume),
 * supervised in a FiberMap inside this scoped layer.
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
import { Cause, Config, Context, type Cron, DateTime, Deferred, Duration, Effect, Exit, Fiber, FiberMap, FiberSet, Layer, Option, Queue, Ref, Result } from "effect"
import { type BatchHistory, foldHistory, isBreakerOpen, withRun } from "../domain/BatchState.ts"
import { BatchDisabled, InvalidConfig, UnknownBatch } from "../domain/Errors.ts"
import { BatchPaused, BatchResumed, TickMissed } from "../domain/Events.ts"
import { cronVariable, DEFAULT_MISSED_RUN_POLICY, leaseTtlVariable, nextTick, parseCron, periodAt, planStartup } from "../domain/Schedule.ts"
import { SweeperConfig } from "../layers/Config.ts"
import type { RegisteredBatch } from "../programs/index.ts"
import { EventLog } from "../services/EventLog.ts"
import { Lease } from "../services/Lease.ts"
import { increment, initialiseSeries, ticksMissedTotal } from "../services/Metrics.ts"
import { type RunResult, runBatch, tickLeaseName, type Trigger } from "./RunGuard.ts"

type Message =
  | { readonly _tag: "Tick"; readonly scheduledAt: Date; readonly trigger: Trigger }
  | { readonly _tag: "RunNow"; readonly dryRun: boolean; readonly reply: Deferred.Deferred<RunResult> }
  | { readonly _tag: "Pause"; readonly by: string }
  | { readonly _tag: "Resume"; readonly by: string }

export interface RunNowOptions {
  readonly dryRun?: boolean | undefined
  /** Run a batch listed in SWEEPER_DISABLED_BATCHES anyway. */
  readonly force?: boolean | undefined
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
}

export class Scheduler extends Context.Service<Scheduler, {
  readonly snapshots: Effect.Effect<ReadonlyArray<BatchSnapshot>>
  runNow(name: string, options?: RunNowOptions): Effect.Effect<RunResult, UnknownBatch | BatchDisabled>
  pause(name: string, by: string): Effect.Effect<void, UnknownBatch>
  resume(name: string, by: string): Effect.Effect<void, UnknownBatch>
}>()("sweeper/runtime/Scheduler") {}

const HISTORY_EVENTS = 1000

/** A batch's state, folded from its newest HISTORY_EVENTS events (oldest first). */
export const loadHistory = Effect.fnUntraced(function*(batch: string) {
  const events = yield* EventLog
  const stored = yield* events.query({ stream: `batch:${batch}`, newestFirst: true, limit: HISTORY_EVENTS })
  return foldHistory([...stored].reverse())
})

/** Runs `body` forever: a crash is logged and `body` restarted after a capped exponential backoff. */
export const supervise = <R>(name: string, body: Effect.Effect<unknown, unknown, R>) =>
  Effect.gen(function*() {
    let restarts = 0
    while (true) {
      const exit = yield* Effect.exit(body)
      if (Exit.isFailure(exit) && Cause.hasInterruptsOnly(exit.cause)) return
      restarts++
      yield* Effect.logError(`${name} stopped; restarting (${restarts})`, Exit.isFailure(exit) ? Cause.pretty(exit.cause) : "returned")
      yield* Effect.sleep(ACTOR_RESTART_BACKOFF(restarts))
    }
  })

/** SWEEPER_LEASE_TTL_<BATCH> (e.g. "90 seconds") replaces the TTL of a batch's exclusive lease. */
export const withLeaseOverride = (batch: RegisteredBatch) =>
  Effect.gen(function*() {
    if (Option.isNone(batch.lease)) return batch
    const variable = leaseTtlVariable(batch.name)
    const ttl = yield* Config.option(Config.Duration(variable)).pipe(
      Effect.mapError((error) => new InvalidConfig({ variable, message: error.message }))
    )
    return Option.isNone(ttl) ? batch : { ...batch, lease: Option.some({ ...batch.lease.value, ttl: ttl.value }) }
  })
/** A registered batch as configured: lease TTL override and cron (SWEEPER_CRON_<BATCH>) applied. */
export const configuredBatch = Effect.fnUntraced(function*(configured: RegisteredBatch, timezone: string) {
  const batch = yield* withLeaseOverride(configured)
  const variable = cronVariable(batch.name)
  const cronText = yield* Config.String(variable).pipe(
    Config.withDefault(batch.cron),
    Effect.mapError((error) => new InvalidConfig({ variable, message: error.message }))
  )
  const cron = parseCron(cronText, timezone)
  if (Result.isFailure(cron)) {
    return yield* new InvalidConfig({ variable, message: `batch ${batch.name}: invalid cron "${cronText}" (${cron.failure})` })
  }
  return { batch, cronText, cron: cron.success }
})

const ACTOR_RESTART_BACKOFF = (restarts: number) => Duration.millis(Math.min(60_000, 1000 * 2 ** Math.min(restarts - 1, 6)))

const afterRun = (history: BatchHistory, result: RunResult, finishedAt: Date): BatchHistory => {
  if (result.outcome === "skipped" && result.reason === "tick claimed elsewhere") return history
  return withRun(history, {
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

    const unknownDisabled = settings.disabledBatches.filter((name) => !batches.some((b) => b.name === name))
    if (unknownDisabled.length > 0) {
      return yield* new InvalidConfig({
        variable: "SWEEPER_DISABLED_BATCHES",
        message: `unknown batch ${unknownDisabled.join(", ")}; known: ${batches.map((b) => b.name).join(", ")}`
      })
    }

    // Every batch × outcome (and × missed reason) series exists from start-up at 0.
    yield* initialiseSeries(batches.map((b) => b.name))
    const shuttingDown = yield* Ref.make(false)
    const inflight = yield* FiberSet.make<RunResult>()
    const fibers = yield* FiberMap.make<string>()

    const actors = new Map<string, Actor>()
    for (const configured of batches) {
      const { batch, cronText, cron } = yield* configuredBatch(configured, settings.timezone)
      const history = yield* loadHistory(batch.name)
      const disabled = settings.disabledBatches.includes(batch.name)
      actors.set(batch.name, {
        batch,
        cronText,
        cron,
        mailbox: yield* Queue.unbounded<Message>(),
        state: yield* Ref.make<ActorState>({
          status: disabled ? "disabled" : history.paused ? "paused" : "idle",
          nextTick: undefined,
          pendingTick: undefined,
          history
        })
      })
    }

    /**
     * A tick that will not run is recorded once cluster-wide: whoever claims the tick records it.
     * Except when the lease store itself is unreachable: then every replica records its own miss
     * (duplicated beats silent).
     */
    const recordMissed = (actor: Actor, scheduledAt: Date, reason: TickMissed["reason"]) =>
      Effect.gen(function*() {
        const at = DateTime.fromDateUnsafe(scheduledAt)
        if (reason !== "lease_unavailable") {
          if (!(yield* lease.claim(tickLeaseName(actor.batch.name, at), Duration.hours(25)))) return
        }
        yield* events.append(new TickMissed({ batch: actor.batch.name, scheduled_at: DateTime.formatIso(at), reason }))
        yield* increment(ticksMissedTotal, 1, { batch: actor.batch.name, reason })
        yield* Ref.update(actor.state, (s) => ({ ...s, history: { ...s.history, lastCoveredTick: scheduledAt } }))
      }).pipe(
        Effect.catchCause((cause) => Effect.logWarning("Could not record missed tick", Cause.pretty(cause))),
        Effect.annotateLogs({ batch: actor.batch.name, scheduled_at: scheduledAt.toISOString(), reason })
      )

    const execute = (actor: Actor, options: { trigger: Trigger; scheduledAt?: Date; dryRun?: boolean }) =>
      Effect.gen(function*() {
        yield* Ref.update(actor.state, (s) => ({ ...s, status: "running" as const, pendingTick: undefined }))
        const fiber = yield* FiberSet.run(inflight, runBatch(actor.batch, {
          trigger: options.trigger,
          dryRun: options.dryRun,
          scheduledAt: options.scheduledAt === undefined ? undefined : DateTime.fromDateUnsafe(options.scheduledAt),
          claimTick: options.scheduledAt !== undefined
        }))
        const result = yield* Fiber.join(fiber)
        const finishedAt = new Date(yield* Effect.clockWith((clock) => clock.currentTimeMillis))
        yield* Ref.update(actor.state, (s) => ({
          ...s,
          status: s.status === "running" ? "idle" as const : s.status,
          // A dry run changes nothing, the batch's history included (as in the event fold).
          history: result.dryRun ? s.history : afterRun(s.history, result, finishedAt)
        }))
        if (result.outcome === "skipped" && result.reason === "lease unavailable" && options.scheduledAt !== undefined) {
          yield* recordMissed(actor, options.scheduledAt, "lease_unavailable")
        }
        return result
      })

    const handle = (actor: Actor, messages: ReadonlyArray<Message>) =>
      Effect.gen(function*() {
        const ticks = messages.filter((m): m is Extract<Message, { _tag: "Tick" }> => m._tag === "Tick")
        for (const message of messages) {
          switch (message._tag) {
            case "Pause": {
              const pausedAt = new Date(yield* Effect.clockWith((clock) => clock.currentTimeMillis))
              yield* events.append(new BatchPaused({ batch: actor.batch.name, by: message.by })).pipe(Effect.ignore)
              yield* Ref.update(actor.state, (s) => ({
                ...s,
                status: s.status === "disabled" ? s.status : "paused" as const,
                history: { ...s.history, paused: true, pausedBy: message.by, pausedAt }
              }))
              break
            }
            case "Resume":
              yield* events.append(new BatchResumed({ batch: actor.batch.name, by: message.by })).pipe(Effect.ignore)
              yield* Ref.update(actor.state, (s) => ({
                ...s,
                status: s.status === "disabled" ? s.status : "idle" as const,
                history: { ...s.history, paused: false, pausedBy: undefined, pausedAt: undefined }
              }))
              break
            case "RunNow": {
              if (yield* Ref.get(shuttingDown)) {
                yield* Deferred.succeed(message.reply, { batch: actor.batch.name, runId: "", outcome: "skipped", summary: null, reason: "shutting down", durationMs: 0, dryRun: message.dryRun })
                break
              }
              yield* Deferred.succeed(message.reply, yield* execute(actor, { trigger: "manual", dryRun: message.dryRun }))
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
        const { status, history } = yield* Ref.get(actor.state)
        if (status === "disabled" || status === "paused") return yield* recordMissed(actor, newest.scheduledAt, "disabled")
        const now = new Date(yield* Effect.clockWith((clock) => clock.currentTimeMillis))
        if (isBreakerOpen(history, now, Duration.toMillis(periodAt(actor.cron, newest.scheduledAt)))) {
          yield* Effect.logWarning(`Circuit breaker open after ${history.consecutiveFailures} failed runs; tick skipped`)
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

    const ticker = (actor: Actor) =>
      Effect.gen(function*() {
        while (true) {
          const now = yield* Effect.clockWith((clock) => clock.currentTimeMillis)
          let next = nextTick(actor.cron, new Date(now))
          if (next.getTime() <= now) next = nextTick(actor.cron, new Date(now + 1))
          yield* Ref.update(actor.state, (s) => ({ ...s, nextTick: next }))
          yield* Effect.sleep(Duration.millis(next.getTime() - now))
          const state = yield* Ref.get(actor.state)
          if (state.status === "running") yield* Ref.update(actor.state, (s) => ({ ...s, pendingTick: next }))
          yield* Queue.offer(actor.mailbox, { _tag: "Tick", scheduledAt: next, trigger: "schedule" })
        }
      })

    // Graceful shutdown runs before the fiber maps' own finalizers interrupt everything.
    yield* Effect.addFinalizer(() =>
      Effect.gen(function*() {
        yield* Ref.set(shuttingDown, true)
        const running = yield* FiberSet.size(inflight)
        if (running === 0) return
        yield* Effect.logInfo(`Shutting down: waiting up to ${Duration.format(settings.shutdownGrace)} for ${running} run(s)`)
        const finished = yield* FiberSet.awaitEmpty(inflight).pipe(Effect.timeoutOption(settings.shutdownGrace))
        if (Option.isNone(finished)) yield* Effect.logWarning("Grace period over: interrupting in-flight runs")
      })
    )

    // Start-up: apply the missed-run policy from each batch's folded history, then start ticking.
    const startedAt = new Date(yield* Effect.clockWith((clock) => clock.currentTimeMillis))
    for (const actor of actors.values()) {
      yield* FiberMap.run(fibers, `${actor.batch.name}:actor`, supervise(`Batch actor ${actor.batch.name}`, actorLoop(actor)))
      const state = yield* Ref.get(actor.state)
      if (state.status !== "disabled") {
        const plan = planStartup(actor.cron, state.history.lastCoveredTick, startedAt, actor.batch.missedRuns ?? DEFAULT_MISSED_RUN_POLICY)
        for (const missed of plan.missed) yield* recordMissed(actor, missed, "downtime")
        if (plan.missedTotal > plan.missed.length) {
          yield* Effect.logWarning(`${plan.missedTotal} ticks were missed while down; recorded the newest ${plan.missed.length}`)
            .pipe(Effect.annotateLogs({ batch: actor.batch.name }))
        }
        if (plan.runTick !== undefined && state.status === "idle") {
          yield* Queue.offer(actor.mailbox, { _tag: "Tick", scheduledAt: plan.runTick, trigger: "startup" })
        }
      }
      yield* FiberMap.run(fibers, `${actor.batch.name}:ticker`, supervise(`Ticker of ${actor.batch.name}`, ticker(actor)))
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
          yield* Queue.offer(actor.mailbox, { _tag: "RunNow", dryRun: options.dryRun === true, reply })
          return yield* Deferred.await(reply)
        }),
      pause: (name, by) => Effect.flatMap(actorNamed(name), (actor) => Queue.offer(actor.mailbox, { _tag: "Pause", by })).pipe(Effect.asVoid),
      resume: (name, by) => Effect.flatMap(actorNamed(name), (actor) => Queue.offer(actor.mailbox, { _tag: "Resume", by })).pipe(Effect.asVoid)
    })
  })

export const schedulerLayer = (batches: ReadonlyArray<RegisteredBatch>) => Layer.effect(Scheduler, makeScheduler(batches))
