/**
 * Sidekiq enqueue (SPEC §0.3): jobs in Sidekiq's wire format (`domain/Sidekiq.ts`) pushed where a
 * real Sidekiq consumer picks them up — `LPUSH queue:<queue>` plus `SADD queues <queue>` — in slices
 * of at most 1000 per pipeline. With `until_executed` de-duplication a job first claims
 * `resque:gitlab:duplicate:<queue>:<sha256 of "<class>:<JSON args>">` (NX, EX 600, value = jid);
 * when somebody else holds the claim the job is dropped and logged as a duplicate. The claim is set
 * after the push (on Redis they live in different stores, SPEC §8.2), so an interrupted enqueue can
 * only leave a job without its claim — a possible duplicate — never a claim without its job.
 *
 * The backends differ only in how one slice reaches Redis (`PushSlice`); building jobs, slicing and
 * logging duplicates is `makeJobQueue`, shared, so both backends produce the same bytes.
 */
import { Clock, Context, Effect } from "effect"
import type { RedisError } from "../domain/Errors.ts"
import { BULK_PUSH_SLICE, duplicateKey, makeJob } from "../domain/Sidekiq.ts"

export type JobArgs = ReadonlyArray<unknown>

export interface BulkEnqueue {
  /** The worker class, e.g. `Issues::RebalancingWorker`. */
  readonly workerClass: string
  readonly queue: string
  /** One job per element, pushed in this order. */
  readonly args: ReadonlyArray<JobArgs>
  /** `until_executed`: at most one pending job per (class, args); default none. */
  readonly deduplicate?: "until_executed" | "none"
}

export type EnqueueOutcome =
  | { readonly _tag: "Enqueued"; readonly args: JobArgs; readonly jid: string }
  /** Dropped: the de-duplication key was held, by `existingJid` (null if its value was unreadable). */
  | { readonly _tag: "Duplicate"; readonly args: JobArgs; readonly existingJid: string | null }

export class JobQueue extends Context.Service<JobQueue, {
  /** One outcome per element of `args`, in order. Empty `args` → no Redis call. */
  bulkEnqueue(request: BulkEnqueue): Effect.Effect<ReadonlyArray<EnqueueOutcome>, RedisError>
}>()("sweeper/services/JobQueue") {}

/** A job ready for Redis: its payload and, with de-duplication, the key it must claim first. */
export interface PreparedJob {
  readonly jid: string
  readonly payload: string
  readonly duplicateKey: string | undefined
}

/** What happened to one prepared job: pushed, or dropped because `duplicateKey` was held. */
export type PushReply = { readonly pushed: true } | { readonly pushed: false; readonly existingJid: string | null }

/**
 * Pushes one slice (≤ BULK_PUSH_SLICE jobs) to `queue` (check claim, SADD + LPUSH, then claim),
 * replying per job in order. Fails if any job could not be pushed; a job not pushed is not claimed.
 */
export type PushSlice = (queue: string, jobs: ReadonlyArray<PreparedJob>) => Effect.Effect<ReadonlyArray<PushReply>, RedisError>

export const makeJobQueue = (pushSlice: PushSlice): JobQueue["Service"] => {
  const bulkEnqueue = Effect.fn("JobQueue.bulkEnqueue")(function*(request: BulkEnqueue) {
    const { workerClass, queue } = request
    const deduplicate = request.deduplicate === "until_executed"
    const nowMillis = yield* Clock.currentTimeMillis
    const outcomes: Array<EnqueueOutcome> = []
    for (let start = 0; start < request.args.length; start += BULK_PUSH_SLICE) {
      const slice = request.args.slice(start, start + BULK_PUSH_SLICE)
      const prepared = slice.map((args): PreparedJob => {
        const job = makeJob({ workerClass, args, queue, nowMillis })
        return {
          jid: job.jid,
          payload: JSON.stringify(job),
          duplicateKey: deduplicate ? duplicateKey(queue, workerClass, args) : undefined
        }
      })
      const replies = yield* pushSlice(queue, prepared)
      for (let i = 0; i < slice.length; i++) {
        const args = slice[i]!
        const reply = replies[i]!
        if (reply.pushed) {
          outcomes.push({ _tag: "Enqueued", args, jid: prepared[i]!.jid })
          continue
        }
        outcomes.push({ _tag: "Duplicate", args, existingJid: reply.existingJid })
        yield* Effect.logInfo("Dropped duplicate job").pipe(Effect.annotateLogs({
          class: workerClass,
          queue,
          args: JSON.stringify(args),
          existing_jid: reply.existingJid,
          duplicate_key: prepared[i]!.duplicateKey,
          deduplication: "until_executed"
        }))
      }
    }
    return outcomes
  })
  return JobQueue.of({ bulkEnqueue })
}
