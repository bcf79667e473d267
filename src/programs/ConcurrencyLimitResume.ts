/**
 * concurrency-limit-resume — port of GitLab's ConcurrencyLimit::ResumeWorker (seed:
 * concurrency-limit-resume.ja.md, SPEC §5). GitLab's Sidekiq middleware defers a job whose worker
 * is at its concurrency limit to a per-worker Redis list; nothing runs it again unless this batch
 * moves it back to the worker's Sidekiq queue once the worker has free capacity. Without this,
 * deferred jobs wait forever.
 *
 * Per worker, one pass: limit (Redis override, else configuration; unknown → skipped), stale
 * executing trackers removed (a crashed Sidekiq thread must not hold a slot forever), free capacity
 * = limit − (running + resumed-not-started), and that many jobs moved from the head of the list in
 * one atomic step. While jobs remain the pass repeats: every second for a positive limit (GitLab
 * reschedules itself 1 s later; capacity frees as jobs finish, not with time), back to back in
 * moves of up to MAX_RESUME_UNLIMITED for limit 0 (unlimited: nothing to wait for), until the list is empty, the circuit breaker opens (limit < 0) or the run's budget (55 s,
 * inside the one-minute cron period) ends — the next tick carries on.
 *
 * GitLab schedules one ResumeWorker job per worker; here the per-worker passes run concurrently in
 * one run, each under its own short exclusive lease, so at most one pass per worker runs
 * cluster-wide. `resumeWorker` is exported for a runtime that schedules workers itself.
 */
import { Cause, Duration, Effect, Exit, Option, Predicate } from "effect"
import type { SqlError } from "effect/sql/SqlError"
import { CurrentRun, reportProgress, wouldChange } from "../domain/Batch.ts"
import type { Batch } from "../domain/Batch.ts"
import {
  RESCHEDULE_DELAY,
  resumableCount,
  RUN_BUDGET,
  underscore,
  workerKeys
} from "../domain/ConcurrencyLimit.ts"
import type { WrongTypeKey } from "../domain/Errors.ts"
import { ConcurrencyLimitJobsDead, ConcurrencyLimitJobsResumed } from "../domain/Events.ts"
import { HealthGate } from "../services/HealthGate.ts"
import { ConcurrencyLimits, type RecordMove } from "../services/ConcurrencyLimits.ts"
import { passes, type Held, sumHeld } from "../runtime/RepairLoop.ts"
import { EventLog } from "../services/EventLog.ts"
import { Lease } from "../services/Lease.ts"
import {
  concurrencyLimitCurrentConcurrentJobs,
  concurrencyLimitMaxConcurrentJobs,
  concurrencyLimitQueueJobs,
  concurrencyLimitResumedJobsTotal,
  increment,
  setGauge
} from "../services/Metrics.ts"

export interface WorkerResumeSummary {
  readonly worker: string
  /** The limit at the first pass. */
  readonly limit: number
  /** Deferred jobs at the first pass. */
  readonly queueSize: number
  /** Running plus resumed-not-started at the first pass (after stale trackers were removed). */
  readonly current: number
  /** Jobs resumed over all passes of this run. */
  readonly resumed: number
  /** The limit the first pass used: `limit`, unless the health gate throttled it (SPEC §9). */
  readonly effectiveLimit: number
}

/** A worker whose pass hit a key of the wrong type: skipped, reported, never retried. */
export interface WorkerKeyFailure {
  readonly worker: string
  readonly key: string
  readonly error: string
}

export interface ConcurrencyLimitResumeSummary extends Held {
  readonly workers: ReadonlyArray<WorkerResumeSummary>
  readonly resumedJobs: number
  /** Workers skipped because one of their keys holds the wrong type (the others ran normally). */
  readonly failedWorkers: ReadonlyArray<WorkerKeyFailure>
}

export type WorkerOutcome =
  | { readonly _tag: "Processed"; readonly summary: WorkerResumeSummary; readonly held: Held }
  /** No configured limit and no Redis override: nothing is known about the worker, nothing moved. */
  | { readonly _tag: "UnknownWorker"; readonly worker: string }
  /** Another process is running this worker's pass. */
  | { readonly _tag: "LeaseHeld"; readonly worker: string }
  /** The health gate held the worker past the run's budget before its first pass. */
  | { readonly _tag: "Held"; readonly worker: string; readonly held: Held }

const NAME = "concurrency-limit-resume"

/** One pass per worker cluster-wide. Renewed before every pass (1 s apart, or back to back for limit 0), so a short TTL suffices. */
export const workerLeaseName = (worker: string) => `sweeper/concurrency_limit_resume/${underscore(worker)}`
export const WORKER_LEASE_TTL = Duration.seconds(15)
/** Per-worker passes run concurrently, but no more than this many at once (hundreds of throttled workers must not mean hundreds of Redis loops). */
export const MAX_CONCURRENT_WORKER_PASSES = 16

interface PassResult {
  readonly limit: number
  readonly effectiveLimit: number
  readonly queueSize: number
  readonly current: number
  readonly resumed: number
  /** Deferred jobs left after the pass. */
  readonly remaining: number
}

/** One pass over one worker (SPEC §5 "Per-worker pass"); None for an unknown worker. */
const pass = Effect.fnUntraced(function*(worker: string, first: boolean) {
  const limits = yield* ConcurrencyLimits
  const events = yield* EventLog
  const { dryRun } = yield* CurrentRun
  const setting = yield* limits.limitOf(worker)
  // Each move's events are appended by the service between the push and the end of the move's
  // journal (README, Failure handling): a crash before them leaves the journal, whose recovery
  // appends them; a crash after them, before the end, appends them twice — never not at all.
  // Resumed records the limit of the pass that writes it (null: a recovered move of a worker with
  // no limit now); Dead the unparsable elements the move put on the dead list.
  const limitNow = Option.match(setting, { onNone: () => null, onSome: (found) => found.limit })
  const record: RecordMove<SqlError, never> = (move) =>
    events.appendAll([
      ...(move.jids.length > 0
        ? [new ConcurrencyLimitJobsResumed({ worker, queue: move.queue, count: move.jids.length, limit: limitNow, jids: move.jids })]
        : []),
      ...(move.dead > 0 ? [new ConcurrencyLimitJobsDead({ worker, count: move.dead })] : [])
    ])

  // A move a dead process left half done is finished first, whatever the limit says now (even for a
  // worker no longer configured): its jobs were admitted under the limit of its own pass, they are
  // already off the deferred list, and its slots are counted again before the push.
  const recovered = dryRun ? Option.none() : yield* limits.recoverMove(worker, record)
  const recoveredJobs = Option.match(recovered, { onNone: () => 0, onSome: (move) => move.jids.length })
  if (recoveredJobs > 0) yield* increment(concurrencyLimitResumedJobsTotal, recoveredJobs, { worker })

  if (Option.isNone(setting)) return Option.none<PassResult>()
  const { limit, queue } = setting.value

  const queueSize = yield* limits.queueSize(worker)
  // A breaker-open or empty worker is only reported; cleaning trackers would write for nothing.
  if (queueSize > 0 && limit >= 0 && !dryRun) yield* limits.cleanupStaleTrackers(worker)
  const current = yield* limits.currentConcurrency(worker)
  const attributes = { worker }
  yield* setGauge(concurrencyLimitQueueJobs, queueSize, attributes)
  yield* setGauge(concurrencyLimitMaxConcurrentJobs, limit, attributes)
  yield* setGauge(concurrencyLimitCurrentConcurrentJobs, current, attributes)
  const stats = { limit, queueSize, current, effectiveLimit: limit }
  if (queueSize === 0 || limit < 0) return Option.some<PassResult>({ ...stats, resumed: recoveredJobs, remaining: queueSize })

  // The health gate may throttle a positive limit for this pass (SPEC §9 throttleLimits).
  const effectiveLimit = limit > 0 ? yield* (yield* HealthGate).effectiveLimit({ batch: NAME, worker, limit }) : limit
  const toResume = resumableCount(effectiveLimit, current)
  const log = first || toResume > 0 ? Effect.logInfo : Effect.logDebug
  yield* log("Concurrency limit worker stats").pipe(Effect.annotateLogs({ worker, limit, queue_size: queueSize, current }))
  if (toResume <= 0) return Option.some<PassResult>({ ...stats, effectiveLimit, resumed: recoveredJobs, remaining: queueSize })

  const { jids, dead } = yield* limits.resume({ worker, queue, max: toResume, dryRun }, record)
  if (dryRun && jids.length > 0) yield* wouldChange(`concurrency_limit:${worker}`)
  if (!dryRun && jids.length > 0) {
    yield* increment(concurrencyLimitResumedJobsTotal, jids.length, attributes)
    yield* reportProgress({ resumedJobs: jids.length })
    yield* Effect.logInfo("Resumed deferred jobs").pipe(Effect.annotateLogs({ worker, queue, resumed_jobs: jids.length }))
  }
  if (!dryRun && dead.length > 0) {
    yield* Effect.logWarning("Moved unparsable deferred jobs to the dead list").pipe(Effect.annotateLogs({
      worker,
      count: dead.length,
      dead_list: workerKeys(worker).dead,
      // A preview only (bytes that are not UTF-8 show as U+FFFD); the dead list keeps them exact.
      sample: Buffer.from(dead[0]!.subarray(0, 200)).toString("utf8")
    }))
  }
  const remaining = dryRun ? queueSize - jids.length - dead.length : yield* limits.queueSize(worker)
  return Option.some<PassResult>({ ...stats, effectiveLimit, resumed: recoveredJobs + jids.length, remaining })
})

/**
 * Every pass for one worker in this run: the first now, then — while jobs remain and the breaker is
 * closed, until the run's budget ends — one per RESCHEDULE_DELAY for a positive limit, back to back
 * for limit 0. A dry run makes one pass and moves
 * nothing (repeating it would only repeat the same answer).
 */
export const resumeWorker = Effect.fn("ConcurrencyLimitResume.resumeWorker")(function*(worker: string) {
  const lease = yield* Lease
  const { dryRun } = yield* CurrentRun

  return yield* Effect.scoped(Effect.gen(function*() {
    const handle = dryRun ? Option.none() : yield* Effect.acquireRelease(
      lease.tryAcquire(workerLeaseName(worker), WORKER_LEASE_TTL),
      (held) => Option.isSome(held) ? Effect.ignore(lease.release(held.value)) : Effect.void
    )
    if (!dryRun && Option.isNone(handle)) {
      yield* Effect.logInfo("Skipped: concurrency limit resume lease held").pipe(
        Effect.annotateLogs({ worker, lease: workerLeaseName(worker) })
      )
      return { _tag: "LeaseHeld", worker } satisfies WorkerOutcome
    }

    // The passes and their cadence are the repair loop's: every RESCHEDULE_DELAY for a positive
    // limit (capacity frees as jobs finish, not with time), back to back for limit 0 while the last
    // pass made progress; a pass that moved nothing (the head changed under it) waits like a limited
    // one, so a contended list never turns into a busy loop. The lease is renewed before every pass
    // (a back-to-back pass of 5000 takes about 0.5 s, far inside the TTL).
    const { results, stop, heldMs, heldBy } = yield* passes({
      batch: NAME,
      budget: RUN_BUDGET,
      delay: RESCHEDULE_DELAY,
      pass: (first) => pass(worker, first),
      next: (last) =>
        dryRun || last.remaining === 0 || last.limit < 0
          ? "stop"
          : last.limit === 0 && (last.resumed > 0 || last.remaining < last.queueSize) ? "now" : "wait",
      between: Effect.gen(function*() {
        if (Option.isNone(handle) || (yield* lease.renew(handle.value))) return true
        yield* Effect.logWarning("Concurrency limit resume lease lost; stopping this worker").pipe(
          Effect.annotateLogs({ worker, lease: workerLeaseName(worker) })
        )
        return false
      })
    })
    const first = results[0]
    if (first === undefined && stop === "held") return { _tag: "Held", worker, held: { heldMs, heldBy } } satisfies WorkerOutcome
    if (first === undefined) {
      yield* Effect.logWarning("Skipped unknown worker: no concurrency limit configured or set in Redis").pipe(
        Effect.annotateLogs({ worker, queue_size: yield* (yield* ConcurrencyLimits).queueSize(worker) })
      )
      return { _tag: "UnknownWorker", worker } satisfies WorkerOutcome
    }
    const resumed = results.reduce((sum, result) => sum + result.resumed, 0)
    const { limit, queueSize, current, effectiveLimit } = first
    return { _tag: "Processed", summary: { worker, limit, queueSize, current, resumed, effectiveLimit }, held: { heldMs, heldBy } } satisfies WorkerOutcome
  }))
})

const run = Effect.fn("ConcurrencyLimitResume.run")(function*() {
  const limits = yield* ConcurrencyLimits
  const workers = yield* limits.workersWithDeferredJobs
  // Concurrently, and one worker's failure neither stops nor hides the others: all passes finish.
  // A key of the wrong type is permanent and concerns one worker: that worker is reported in the
  // summary and the run goes on. Any other failure fails the run afterwards (so the guard records
  // and retries it).
  const exits = yield* Effect.forEach(workers, (worker) => Effect.exit(resumeWorker(worker)), { concurrency: MAX_CONCURRENT_WORKER_PASSES })
  const summaries: Array<WorkerResumeSummary> = []
  const held: Array<Held> = []
  const failedWorkers: Array<WorkerKeyFailure> = []
  let failed: Cause.Cause<unknown> | undefined
  for (const [i, exit] of exits.entries()) {
    const worker = workers[i]!
    if (Exit.isFailure(exit)) {
      const error = Cause.findErrorOption(exit.cause)
      if (Option.isSome(error) && Predicate.isTagged(error.value, "WrongTypeKey")) {
        const { key, message } = error.value as WrongTypeKey
        failedWorkers.push({ worker, key, error: message })
        yield* Effect.logError(`Concurrency limit resume skipped worker ${worker}: key ${key} holds the wrong type (${message})`).pipe(
          Effect.annotateLogs({ worker, key })
        )
        continue
      }
      yield* Effect.logError("Concurrency limit resume failed for a worker", exit.cause).pipe(Effect.annotateLogs({ worker }))
      failed ??= exit.cause
      continue
    }
    if (exit.value._tag === "Processed") summaries.push(exit.value.summary)
    if (exit.value._tag === "Processed" || exit.value._tag === "Held") held.push(exit.value.held)
  }
  if (failed !== undefined) return yield* Effect.failCause(failed)
  const resumedJobs = summaries.reduce((sum, worker) => sum + worker.resumed, 0)
  yield* Effect.logInfo("Concurrency limit resume finished").pipe(Effect.annotateLogs({
    workers: summaries.length,
    skipped: workers.length - summaries.length - failedWorkers.length,
    failed_workers: failedWorkers.length,
    resumed_jobs: resumedJobs
  }))
  return { workers: summaries, resumedJobs, failedWorkers, ...sumHeld(held) } satisfies ConcurrencyLimitResumeSummary
})

export const ConcurrencyLimitResume = {
  name: NAME,
  worker: "ConcurrencyLimit::ResumeWorker",
  description: "Moves jobs deferred by the Sidekiq concurrency limit back to their queue as capacity frees",
  cron: "* * * * *",
  budget: RUN_BUDGET,
  lease: Option.none(),
  // The deferred lists (SharedState), trackers and reserved slots (QueuesMetadata), each worker's queue.
  writes: { tables: ["sweeper_events"], redisStores: ["sharedState", "queuesMetadata", "queues"], concurrencyLimitQueues: true },
  run: run()
} satisfies Batch<ConcurrencyLimitResumeSummary, unknown, unknown>
