/**
 * concurrency-limit-resume — port of GitLab's ConcurrencyLimit::ResumeWorker. GitLab's Sidekiq
 * middleware defers a job whose worker is at its concurrency limit to a per-worker Redis list;
 * nothing runs it again unless this batch
 * moves it back to the worker's Sidekiq queue once the worker has free capacity. Without this,
 * deferred jobs wait forever.
 *
 * Per worker, one pass: limit (Redis override, else configuration; unknown → skipped), stale
 * executing trackers removed (a crashed Sidekiq thread must not hold a slot forever), free capacity
 * = limit − (running + resumed-not-started), and that many jobs moved from the head of the list in
 * one atomic step. While jobs remain the pass repeats: every second for a positive limit (GitLab
 * reschedules itself 1 s later; capacity frees as jobs finish, not with time), back to back in
 * moves of up to MAX_RESUME_UNLIMITED for limit 0 (unlimited: nothing to wait for), until the list
 * is empty, the circuit breaker opens (limit < 0) or the run's budget (55 s, inside the one-minute
 * cron period) ends — the next tick carries on. The budget is the run's, not each worker's: a
 * worker whose slot among the 16 comes after it waits for the next tick.
 *
 * GitLab schedules one ResumeWorker job per worker; here the per-worker passes run concurrently in
 * one run, each under its own short exclusive lease, so at most one pass per worker runs
 * cluster-wide (the repair loop's `underLease`), and one worker's failure neither stops nor hides the
 * others (`isolatedEach`). `resumeWorker` is exported for a runtime that schedules workers itself.
 */
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { type Batch, CurrentRun, reportProgress, wouldChange } from "../domain/Batch.ts"
import * as C from "../domain/ConcurrencyLimit.ts"
import { isolatedEach, leasedPasses, sumHeld, withDeadline } from "../repair/RepairLoop.ts"
import { ConcurrencyLimits } from "../services/ConcurrencyLimits.ts"
import { HealthGate } from "../services/HealthGate.ts"
import * as M from "../services/Metrics.ts"
import { concurrencyLimitResumeBacklog } from "./ConcurrencyLimitResumeBacklog.ts"

const NAME = "concurrency-limit-resume"

/** One pass over one worker; None, with a warning, for an unknown worker. */
const pass = Effect.fnUntraced(function*(worker: string, first: boolean) {
  const limits = yield* ConcurrencyLimits
  const { dryRun } = yield* CurrentRun
  const setting = yield* limits.limitOf(worker)
  // Each move's events are appended by the service's `recordMoves` between the push and the end of
  // the move's journal (docs/operations.md, Failure handling): a crash before them leaves the journal, whose
  // recovery appends them; a crash after them, before the end, appends them twice — never not at all.
  const record = limits.recordMoves(worker, setting)
  // A move a dead process left half done is finished first, whatever the limit says now (even for a
  // worker no longer configured): its jobs were admitted under the limit of its own pass, they are
  // already off the deferred list, and its slots are counted again before the push.
  const recovered = dryRun ? 0 : C.jobsMoved(yield* limits.recoverMove(worker, record))
  if (recovered > 0) yield* M.increment(M.concurrencyLimitResumedJobsTotal, recovered, { worker })
  if (Option.isNone(setting)) {
    yield* Effect.logWarning("Skipped unknown worker: no concurrency limit configured or set in Redis").pipe(
      Effect.annotateLogs({ worker, queue_size: yield* limits.queueSize(worker) })
    )
    return Option.none<C.PassResult>()
  }
  const { limit, queue } = setting.value
  const queueSize = yield* limits.queueSize(worker)
  // A breaker-open or empty worker is only reported; cleaning trackers would write for nothing.
  if (queueSize > 0 && !C.breakerOpen(limit) && !dryRun) yield* limits.cleanupStaleTrackers(worker)
  const current = yield* limits.currentConcurrency(worker)
  yield* M.setConcurrencyLimitGauges(worker, { queueSize, limit, current })
  const stats = { limit, queueSize, current, effectiveLimit: limit, resumed: recovered, remaining: queueSize }
  if (queueSize === 0 || C.breakerOpen(limit)) return Option.some<C.PassResult>(stats)
  // The health gate may throttle a positive limit for this pass (its `throttleLimits` rules).
  const effectiveLimit = limit > 0 ? yield* (yield* HealthGate).effectiveLimit({ batch: NAME, worker, limit }) : limit
  const toResume = C.resumableCount(effectiveLimit, current)
  yield* (first || toResume > 0 ? Effect.logInfo : Effect.logDebug)("Concurrency limit worker stats").pipe(
    Effect.annotateLogs({ worker, limit, queue_size: queueSize, current })
  )
  if (toResume <= 0) return Option.some<C.PassResult>({ ...stats, effectiveLimit })
  const { jids, dead, preview } = yield* limits.resume({ worker, queue, max: toResume, dryRun }, record)
  // A dry run's preview says which jobs of the head it would move: shadow mode's proposal.
  if (preview) yield* wouldChange(`concurrency_limit:${worker}`, C.resumeProposal(stats, queue, jids, dead, preview))
  if (!dryRun && jids.length > 0) {
    yield* Effect.all([
      M.increment(M.concurrencyLimitResumedJobsTotal, jids.length, { worker }),
      reportProgress({ resumedJobs: jids.length }),
      Effect.logInfo("Resumed deferred jobs").pipe(Effect.annotateLogs({ worker, queue, resumed_jobs: jids.length }))
    ])
  }
  const remaining = dryRun ? queueSize - jids.length - dead.length : yield* limits.queueSize(worker)
  return Option.some<C.PassResult>({ ...stats, effectiveLimit, resumed: recovered + jids.length, remaining })
})

/**
 * Every pass for one worker in this run, under the worker's lease: the first now, then — while jobs
 * remain and the breaker is closed, until the run's budget ends — as `nextPass` says. The lease is
 * renewed before every pass and kept alive between them (a gate hold may outlast its TTL).
 */
export const resumeWorker = Effect.fn("ConcurrencyLimitResume.resumeWorker")(function*(worker: string) {
  const run = yield* leasedPasses({
    lease: C.workerLeaseName(worker),
    ttl: C.WORKER_LEASE_TTL,
    label: "Concurrency limit resume",
    subject: { worker },
    batch: NAME,
    budget: C.RUN_BUDGET,
    delay: C.RESCHEDULE_DELAY,
    pass: (first) => pass(worker, first),
    next: C.nextPass
  })
  if (Option.isNone(run)) return { _tag: "LeaseHeld", worker } as const
  return C.workerOutcome(worker, run.value)
})

const run = Effect.fn("ConcurrencyLimitResume.run")(function*() {
  const workers = yield* (yield* ConcurrencyLimits).workersWithDeferredJobs
  // A key of the wrong type is permanent and concerns one worker: that worker is reported in the
  // summary and the run goes on. Any other failure fails the run afterwards (the guard retries it).
  const { results, isolated } = yield* isolatedEach(workers, resumeWorker, {
    concurrency: C.MAX_CONCURRENT_WORKER_PASSES,
    label: "Concurrency limit resume",
    noun: "worker"
  })
  const { summary, skipped, held } = C.runTotals(workers.length, results, isolated)
  yield* Effect.logInfo("Concurrency limit resume finished").pipe(Effect.annotateLogs(C.runLogFields(summary, skipped)))
  return { ...summary, ...sumHeld(held) } satisfies C.ConcurrencyLimitResumeSummary
}, withDeadline(C.RUN_BUDGET))

export const ConcurrencyLimitResume = {
  name: NAME,
  worker: "ConcurrencyLimit::ResumeWorker",
  description: "Moves jobs deferred by the Sidekiq concurrency limit back to their queue as capacity frees",
  cron: "* * * * *",
  budget: C.RUN_BUDGET,
  lease: Option.none(),
  // The deferred lists (SharedState), trackers and reserved slots (QueuesMetadata), each worker's queue.
  writes: {
    tables: ["sweeper_events"],
    redisStores: ["sharedState", "queuesMetadata", "queues"],
    concurrencyLimitQueues: true
  },
  repairedCounts: ["resumedJobs"],
  run: run(),
  backlog: concurrencyLimitResumeBacklog
} satisfies Batch<C.ConcurrencyLimitResumeSummary, unknown, unknown>
