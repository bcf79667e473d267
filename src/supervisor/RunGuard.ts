/**
 * The run guard: everything a run needs that is not the program's business, applied
 * once for every batch and every trigger (cron tick, CLI, REPL, HTTP):
 *
 *   tick lease → exclusive lease (renewed, fenced) → span + log annotations → time budget →
 *   retry of transient errors → RunStarted / RunFinished events → metrics → every failure caught.
 *
 * RunFinished comes after every repair event of the run in the ledger, or says how many are still
 * owed (a decomposed GitLab's relay; see RunLedger), and the result says so (`eventsOwed`).
 *
 * It never fails: whatever happens is an outcome in the returned RunResult.
 */
import * as Cause from "effect/Cause"
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Option from "effect/Option"
import * as Predicate from "effect/Predicate"
import * as Ref from "effect/Ref"
import * as Schedule from "effect/Schedule"
import { randomUUID } from "node:crypto"
import { SweeperConfig } from "../config/Config.ts"
import { type Batch, CurrentRun, type Fence, HARD_TIMEOUT_GRACE, type Outcome } from "../domain/Batch.ts"
import type { LastRun } from "../domain/BatchState.ts"
import { describeError, isTransient, LeaseLost, type RedisError } from "../domain/Errors.ts"
import { LeaseLostEvent, RunFinished, RunStarted } from "../domain/Events.ts"
import type { ShadowProposal } from "../domain/Shadow.ts"
import { repairedItems, RunProgress } from "../domain/Summary.ts"
import { EventLog } from "../services/EventLog.ts"
import { Lease, type LeaseHandle } from "../services/Lease.ts"
import {
  increment,
  lastSuccessTimestamp,
  leaseSkipsTotal,
  type Metrics,
  observe,
  runDurationSeconds,
  runsTotal,
  setGauge
} from "../services/Metrics.ts"
import { RunLedger } from "../services/RunLedger.ts"
import { closeAbandonedRuns } from "./AbandonedRuns.ts"
import { trackRun } from "./LiveProgress.ts"
import { shadowStep } from "./ShadowReconcile.ts"

export type Trigger = "schedule" | "manual" | "startup"

export interface RunOptions {
  readonly trigger: Trigger
  readonly dryRun?: boolean | undefined
  /** Overrides the batch's budget for this run. */
  readonly budget?: Duration.Duration | undefined
  /** The cron tick this run is for; with `tickClaimTtl` only one process in the cluster runs it. */
  readonly scheduledAt?: DateTime.Utc | undefined
  /** How long the tick's claim is kept (domain/Schedule.ts's `tickClaimTtl` of the batch's period). */
  readonly tickClaimTtl?: Duration.Duration | undefined
  /** `--now T`: the instant the program judges thresholds at (events and writes keep the real clock). */
  readonly asOf?: Date | undefined
}

/** A dry run lists at most this many would-be targets (the total is always counted). */
export const MAX_LISTED_TARGETS = 100

export interface RunResult {
  readonly batch: string
  readonly runId: string
  readonly outcome: Outcome
  readonly summary: unknown
  readonly reason?: string | undefined
  readonly error?: string | undefined
  readonly durationMs: number
  /** Earlier runs of the batch this run closed as `abandoned` before it started. */
  readonly closed?: ReadonlyArray<LastRun> | undefined
  readonly dryRun: boolean
  /** A dry run's would-be targets (first MAX_LISTED_TARGETS) and how many there were in all. */
  readonly targets?: ReadonlyArray<string> | undefined
  readonly targetsTotal?: number | undefined
  /**
   * How many of the run's repair events were not yet in the ledger when it ended (a decomposed
   * GitLab's ci repairs: still in ci's outbox); absent when none.
   */
  readonly eventsOwed?: number | undefined
  /** Where RunFinished went when not into the ledger: ci's outbox behind the run's events, or nowhere. */
  readonly runFinished?: "outbox" | "nowhere" | undefined
}

/** Whether the ledger has everything of the run: its RunFinished and every one of its repair events. */
export const fullyRecorded = (result: Pick<RunResult, "eventsOwed" | "runFinished">) =>
  (result.eventsOwed ?? 0) === 0 && result.runFinished === undefined

/** Transient infrastructure errors: exponential backoff from 200 ms, capped at 5 s, jittered, 3 retries. */
export const transientRetry = Schedule.min([Schedule.exponential("200 millis"), Schedule.spaced("5 seconds")]).pipe(
  Schedule.jittered,
  Schedule.upTo({ times: 3 }),
  Schedule.setInputType<unknown>(),
  Schedule.while(({ input }) => isTransient(input))
)

/**
 * The reason of a run that never started because its RunStarted could not be written (PostgreSQL
 * unreachable): nothing ran, no event exists; the scheduler records the tick as missed.
 */
export const NOT_STARTED_DATABASE_UNAVAILABLE = "database unavailable"

/**
 * A connection cut under a transaction fails the statement and then the ROLLBACK, which @effect/sql
 * turns into a defect: `Effect.retry` would never see it. A cause made only of transient failures
 * and transient defects (no interruption, nothing else) becomes a plain failure so
 * `transientRetry` retries it; any other cause — a bug, a LeaseLost, a permanent SQL error — is
 * left exactly as it was.
 */
export const transientDefectsAsFailures = <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, unknown, R> =>
  Effect.catchCause(effect, (cause) => {
    let transient: { readonly error: unknown } | undefined
    for (const reason of cause.reasons) {
      if (Cause.isInterruptReason(reason)) return Effect.failCause(cause)
      const error = Cause.isFailReason(reason) ? reason.error : reason.defect
      if (!isTransient(error)) return Effect.failCause(cause)
      transient ??= { error }
    }
    return transient === undefined ? Effect.failCause(cause) : Effect.fail(transient.error)
  })

export const tickLeaseName = (batch: string, scheduledAt: DateTime.Utc) =>
  `sweeper/tick/${batch}/${DateTime.formatIso(scheduledAt)}`

/** The failure as one line with its whole cause chain (SQL state and message, Redis error, host). */
export const describe = (cause: Cause.Cause<unknown>): string => describeError(Cause.squash(cause))

/** A renewal that errs is tried again soon (≈ 1.5 s in all), far inside the TTL/3 before the next one. */
const renewalRetry = Schedule.exponential("100 millis").pipe(Schedule.upTo({ times: 4 }))

/**
 * What the run knows of its lease: held, lost (another token, or no key: never ours again), or
 * unknown since a renewal erred (the error, which says nothing about who holds it).
 */
type LeaseState = "held" | "lost" | RedisError

/**
 * Holds the batch's exclusive lease for the scope: renewed every TTL/3. Only a renewal or a read
 * that finds another token (or none) means lost: the next safe point (`Fence.check`) stops the run
 * with LeaseLost. A renewal that errs is retried on `renewalRetry`; if it still errs, the cause is
 * logged and the lease is unknown. The next check does not trust that error either: it renews once
 * more (the same compare-and-extend, on the same retry), and the run goes on if the lease is still
 * ours; only if that errs too does the check fail with the error (transient: the guard retries the
 * run, whose first write checks again). A held lease is read at each check; a read that fails fails
 * the check the same way. Released when the scope closes.
 */
const holdLease = Effect.fnUntraced(function*(handle: LeaseHandle) {
  const lease = yield* Lease
  const state = yield* Ref.make<LeaseState>("held")
  // Lost is final: a check that found the lease ours a moment ago must not undo a later renewal's "lost".
  const learn = (next: LeaseState) => Ref.update(state, (now) => now === "lost" ? now : next)
  const annotated = Effect.annotateLogs({ lease: handle.name })
  const renewEvery = Duration.divideUnsafe(handle.ttl, 3)
  /** Compare-and-extend, retried on `renewalRetry`: true while ours, false once lost; records either. */
  const renewed = lease.renew(handle).pipe(
    Effect.retry(renewalRetry),
    Effect.tap((ours) =>
      ours
        ? learn("held")
        : Effect.andThen(learn("lost"), Effect.logWarning("Exclusive lease lost").pipe(annotated))
    )
  )
  const renewal = renewed.pipe(
    Effect.catch((error) =>
      Effect.as(
        Effect.andThen(
          learn(error),
          Effect.logWarning("Exclusive lease renewal failed; the next check reads the lease again", error).pipe(
            annotated
          )
        ),
        true
      )
    )
  )
  yield* renewal.pipe(
    Effect.delay(renewEvery),
    Effect.repeat({ while: (kept) => kept }),
    Effect.forkScoped
  )
  yield* Effect.addFinalizer(() => lease.release(handle).pipe(Effect.ignore))
  const fail = new LeaseLost({ lease: handle.name, epoch: handle.epoch })
  /** After a renewal erred: renew again; ours → held, on with the run; not ours → lost; an error → the check fails. */
  const reconfirm = renewed.pipe(
    Effect.tapError((error) =>
      Effect.andThen(
        learn(error),
        Effect.logWarning("Lease still unknown; writing nothing until it can be renewed", describeError(error))
          .pipe(annotated)
      )
    ),
    Effect.flatMap((ours) =>
      ours ? Effect.logInfo("Exclusive lease renewed after a failed renewal").pipe(annotated) : fail
    )
  )
  const fence: Fence = {
    lease: handle.name,
    epoch: handle.epoch,
    check: Effect.gen(function*() {
      const now = yield* Ref.get(state)
      if (now === "lost") return yield* fail
      if (now !== "held") return yield* reconfirm
      // A read that fails says nothing about who holds the lease: no write on an unknown lease.
      // The RedisError is transient, so the guard retries the run, whose first write checks again.
      const held = yield* lease.isHeld(handle).pipe(
        Effect.tapError((error) =>
          Effect.logWarning("Lease check failed; writing nothing until the lease can be read", describeError(error))
            .pipe(annotated)
        )
      )
      if (!held) {
        yield* learn("lost")
        return yield* fail
      }
    })
  }
  return fence
})

export const runBatch = <S, E, R>(batch: Batch<S, E, R>, options: RunOptions) =>
  Effect.gen(function*(): Effect.fn.Return<RunResult, never, R | SweeperConfig | Lease | EventLog | Metrics> {
    const config = yield* SweeperConfig
    const lease = yield* Lease
    const events = yield* EventLog
    const ledger = yield* RunLedger
    const runId = randomUUID()
    // A batch in shadow mode runs as a dry run that records what it proposes (see ShadowReconcile);
    // `--dry-run` stays a plain dry run, recording nothing.
    const shadow = batch.mode === "shadow" && options.dryRun !== true
    const dryRun = options.dryRun === true || shadow
    const proposals: Array<readonly [string, ShadowProposal]> = []
    const budget = options.budget ?? batch.budget
    const startedAt = yield* DateTime.now
    const startedMs = DateTime.toEpochMillis(startedAt)
    const targets: Array<string> = []
    let targetsTotal = 0
    const wouldChange = (stream: string, proposal?: ShadowProposal) =>
      Effect.sync(() => {
        if (targetsTotal++ < MAX_LISTED_TARGETS) targets.push(stream)
        if (shadow && proposal !== undefined) proposals.push([stream, proposal])
      })
    // One deadline for the whole run, whatever runs under it (loops, workers, retried attempts).
    const deadline = startedMs + Duration.toMillis(budget)
    const runInfo = (fence: Option.Option<Fence>) => ({
      runId,
      batch: batch.name,
      dryRun,
      budget: Option.some(budget),
      deadline,
      fence,
      asOf: options.asOf,
      wouldChange: dryRun ? wouldChange : undefined
    })
    const listed = () => dryRun ? { targets: [...targets], targetsTotal } : {}

    const runStarted = (fence: Option.Option<Fence>) =>
      new RunStarted({
        batch: batch.name,
        run_id: runId,
        scheduled_at: options.scheduledAt ? DateTime.formatIso(options.scheduledAt) : null,
        node: config.node,
        trigger: options.trigger,
        dryRun,
        budget_ms: Duration.toMillis(budget),
        ...(Option.isSome(fence) ? { lease_epoch: fence.value.epoch } : {})
      })
    let closed: ReadonlyArray<LastRun> = []
    /** Writes RunStarted; false (logged) when it cannot be written: then the run must not start. */
    const recordStart = (fence: Option.Option<Fence>) =>
      events.append(runStarted(fence)).pipe(
        Effect.as(true),
        Effect.catchCause((cause) =>
          Effect.as(Effect.logError("Run not started: could not record RunStarted", describe(cause)), false)
        )
      )
    const notStarted = {
      batch: batch.name,
      runId,
      outcome: "failed",
      summary: null,
      reason: NOT_STARTED_DATABASE_UNAVAILABLE,
      durationMs: 0,
      dryRun
    } satisfies RunResult

    /**
     * Appends RunFinished: into the ledger, saying how many of the run's repair events are still on
     * their way there (RunLedger); where main cannot take it, behind those events in ci's outbox.
     */
    const recordFinish = Effect.fnUntraced(function*(fields: ConstructorParameters<typeof RunFinished>[0]) {
      // A run that wrote nothing has nothing owed, whatever ci's state (nothing to ask there).
      const eventsOwed = dryRun ? 0 : yield* ledger.eventsOwed(runId).pipe(Effect.orElseSucceed(() => 0))
      const finished = new RunFinished({ ...fields, ...(eventsOwed > 0 ? { eventsOwed } : {}) })
      const runFinished = yield* ledger.appendFinished(finished, runId, events.append(finished)).pipe(
        Effect.as(undefined),
        Effect.catchCause((cause) =>
          Effect.gen(function*() {
            // Relayed behind every event of the run, it owes none by the time it is in the ledger.
            if (yield* ledger.deferFinished(new RunFinished(fields), runId)) {
              yield* Effect.logWarning(
                "RunFinished waits in ci's outbox: main's ledger could not take it",
                describe(cause)
              )
              return "outbox" as const
            }
            yield* Effect.logError("Could not record RunFinished", describe(cause))
            return "nowhere" as const
          })
        )
      )
      return {
        ...(eventsOwed > 0 ? { eventsOwed } : {}),
        ...(runFinished === undefined ? {} : { runFinished })
      }
    })

    const finish = Effect.fnUntraced(
      function*(outcome: Outcome, summary: unknown, details: { reason?: string; error?: string } = {}) {
        const durationMs = DateTime.toEpochMillis(yield* DateTime.now) - startedMs
        const repaired = repairedItems(summary, batch.repairedCounts)
        const recorded = yield* recordFinish({
          batch: batch.name,
          outcome,
          summary,
          duration_ms: durationMs,
          dryRun,
          ...(repaired === undefined ? {} : { repaired }),
          ...details,
          ...listed()
        })
        yield* increment(runsTotal, 1, { batch: batch.name, outcome })
        yield* observe(runDurationSeconds, durationMs / 1000, { batch: batch.name, outcome })
        if (outcome === "succeeded" && !dryRun) {
          yield* setGauge(lastSuccessTimestamp, DateTime.toEpochMillis(yield* DateTime.now) / 1000, {
            batch: batch.name
          })
        }
        const log = outcome === "failed" || outcome === "timed_out" ? Effect.logError : Effect.logInfo
        yield* log(dryRun ? `Dry run ${outcome}` : `Run ${outcome}`).pipe(
          Effect.annotateLogs({ outcome, summary, duration_ms: durationMs, ...details, ...listed(), ...recorded })
        )
        return {
          batch: batch.name,
          runId,
          outcome,
          summary,
          reason: details.reason,
          error: details.error,
          durationMs,
          dryRun,
          ...listed(),
          ...recorded,
          closed
        } satisfies RunResult
      }
    )

    const guarded = Effect.scoped(Effect.gen(function*() {
      // One replica per scheduled tick: the claim is never released, it simply expires.
      if (options.tickClaimTtl !== undefined && options.scheduledAt !== undefined) {
        // A claim, not a fenced lease: no epoch key is created for a tick.
        const claim = yield* lease.claim(tickLeaseName(batch.name, options.scheduledAt), options.tickClaimTtl).pipe(
          Effect.map(Option.some),
          Effect.catchCause((cause) =>
            Effect.as(Effect.logWarning("Tick lease unavailable", describe(cause)), Option.none<boolean>())
          )
        )
        if (Option.isNone(claim)) {
          return {
            batch: batch.name,
            runId,
            outcome: "skipped",
            summary: null,
            reason: "lease unavailable",
            durationMs: 0,
            dryRun
          } satisfies RunResult
        }
        if (!claim.value) {
          yield* Effect.logDebug("Tick already claimed by another process")
          return {
            batch: batch.name,
            runId,
            outcome: "skipped",
            summary: null,
            reason: "tick claimed elsewhere",
            durationMs: 0,
            dryRun
          } satisfies RunResult
        }
      }

      let fence = Option.none<Fence>()
      if (Option.isSome(batch.lease) && !dryRun) {
        const handle = yield* lease.tryAcquire(batch.lease.value.name, batch.lease.value.ttl)
        if (Option.isNone(handle)) {
          if (!(yield* recordStart(Option.none()))) return notStarted
          yield* increment(leaseSkipsTotal, 1, { batch: batch.name })
          return yield* finish("skipped", null, { reason: "lease held" })
        }
        fence = Option.some(yield* holdLease(handle.value))
      }

      // Runs of this batch killed before their RunFinished are closed by whoever runs it next.
      closed = yield* closeAbandonedRuns(batch, {
        leaseEpoch: Option.map(fence, (f) => f.epoch),
        closedBy: `run ${runId} on ${config.node}`
      })
      if (!(yield* recordStart(fence))) return { ...notStarted, closed }

      // Each attempt's reports count; a retried run's summary adds its failed attempts' work.
      const progress = new RunProgress()
      // The dashboard's live view of this run (units and repairs so far), for as long as it runs.
      const live = trackRun(batch.name, runId, new Date(startedMs), progress)
      yield* Effect.addFinalizer(() => Effect.sync(live.done))
      const program = Effect.suspend(() => {
        progress.newAttempt()
        return batch.run
      }).pipe(
        transientDefectsAsFailures,
        Effect.retry(transientRetry),
        Effect.map((summary) => progress.summarize(summary)),
        Effect.provideService(CurrentRun, { ...runInfo(fence), progress: live }),
        Effect.timeoutOption(Duration.sum(budget, HARD_TIMEOUT_GRACE))
      )
      // A run that ends without the program's summary (failed, timed out, interrupted) still made
      // the repairs its attempts reported: its summary is those, added up (null if none).
      const reported = () => progress.reported()
      // Interrupted from outside (shutdown past its grace): still record how the run ended.
      const exit = yield* Effect.exit(program).pipe(
        Effect.onInterrupt(() => finish("failed", reported(), { reason: "interrupted" }))
      )
      if (Exit.isSuccess(exit) && shadow && Option.isSome(exit.value)) {
        const now = DateTime.toDateUtc(yield* DateTime.now)
        const tally = yield* Effect.exit(shadowStep(batch.name, runId, proposals, now))
        // A program's summary is an object; the shadow tally is added beside its fields.
        const summary = Predicate.isObjectKeyword(exit.value.value) ? exit.value.value : {}
        return Exit.isSuccess(tally)
          ? yield* finish("succeeded", { ...summary, shadow: tally.value })
          : yield* finish("failed", exit.value.value, { reason: "shadow ledger", error: describe(tally.cause) })
      }
      if (Exit.isSuccess(exit)) {
        return Option.isSome(exit.value)
          ? yield* finish("succeeded", exit.value.value)
          : yield* finish("timed_out", reported(), { reason: `exceeded budget ${Duration.format(budget)} + grace` })
      }
      const failure = Cause.findErrorOption(exit.cause)
      if (Option.isSome(failure) && failure.value instanceof LeaseLost) {
        yield* events.append(
          new LeaseLostEvent({ batch: batch.name, lease: failure.value.lease, epoch: failure.value.epoch })
        ).pipe(Effect.ignore)
        return yield* finish("failed", reported(), { reason: "lease lost", error: describe(exit.cause) })
      }
      if (Cause.hasInterruptsOnly(exit.cause)) {
        return yield* finish("failed", reported(), { reason: "interrupted" })
      }
      return yield* finish("failed", reported(), { error: describe(exit.cause) })
    }))

    return yield* guarded.pipe(
      Effect.provideService(CurrentRun, runInfo(Option.none())),
      Effect.catchCause((cause) =>
        Effect.gen(function*() {
          yield* Effect.logError("Run guard failed", describe(cause))
          const durationMs = DateTime.toEpochMillis(yield* DateTime.now) - startedMs
          yield* increment(runsTotal, 1, { batch: batch.name, outcome: "failed" })
          return {
            batch: batch.name,
            runId,
            outcome: "failed",
            summary: null,
            error: describe(cause),
            durationMs,
            dryRun
          } satisfies RunResult
        })
      ),
      Effect.annotateLogs(
        dryRun ? { batch: batch.name, run_id: runId, dry_run: true } : { batch: batch.name, run_id: runId }
      ),
      Effect.withSpan(`batch.${batch.name}`, { attributes: { batch: batch.name, run_id: runId, dry_run: dryRun } })
    )
  })
