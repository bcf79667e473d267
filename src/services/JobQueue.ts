/**
 * Sidekiq enqueue: jobs in Sidekiq's wire format (`domain/Sidekiq.ts`) pushed where a
 * real Sidekiq consumer picks them up — `LPUSH queue:<queue>` plus `SADD queues <queue>` — in slices
 * of at most 1000 per pipeline. With `until_executed` de-duplication a job first claims
 * `resque:gitlab:duplicate:<queue>:<sha256 of "<class>:<JSON args>">` (NX, EX 600, value = jid);
 * when somebody else holds the claim the job is dropped and logged as a duplicate. The claim is set
 * after the push (on Redis they live in different stores), so an interrupted enqueue can
 * only leave a job without its claim — a possible duplicate — never a claim without its job.
 *
 * The contract only: both backends are `makeJobQueue` (layers/JobQueueShared.ts) over their own two
 * Redis steps, so they produce the same bytes.
 */
import * as Context from "effect/Context"
import type * as Effect from "effect/Effect"
import type { RedisError } from "../domain/Errors.ts"

export type JobArgs = ReadonlyArray<unknown>

export interface BulkEnqueue {
  /** The worker class, e.g. `Issues::RebalancingWorker`. */
  readonly workerClass: string
  readonly queue: string
  /** One job per element, pushed in this order. */
  readonly args: ReadonlyArray<JobArgs>
  /** `until_executed`: at most one pending job per (class, args); default none. */
  readonly deduplicate?: "until_executed" | "none"
  /** Further top-level job keys (GitLab's context, e.g. `meta.caller_id`), for the simulator's GitLab. */
  readonly extra?: Readonly<Record<string, unknown>>
}

export type EnqueueOutcome =
  | { readonly _tag: "Enqueued"; readonly args: JobArgs; readonly jid: string }
  /** Dropped: the de-duplication key was held, by `existingJid` (null if its value was unreadable). */
  | { readonly _tag: "Duplicate"; readonly args: JobArgs; readonly existingJid: string | null }

/**
 * Called once per slice after the slice's outcomes are decided and before anything of it is pushed:
 * the place to record what is about to happen (an event), so that a crash can leave a record of a
 * push that never happened (the next run pushes and records again: a duplicate record), never a
 * push without its record.
 */
export type BeforePush<E, R> = (outcomes: ReadonlyArray<EnqueueOutcome>) => Effect.Effect<void, E, R>

/** One job of a `pushOnce` batch: its class and args, and when it was decided (its `created_at`). */
export interface OnceJob {
  readonly workerClass: string
  readonly args: JobArgs
  readonly createdAtMillis: number
  /** The worker's `sidekiq_options retry:`; Sidekiq's default (true) when absent. */
  readonly retry?: number
}

export interface PushOnce {
  readonly queue: string
  /**
   * The batch's marker key, in the slot of `queue:<queue>`: set (NX, with `ttlSeconds`) in the same
   * atomic step as the push, so a batch whose marker is already there is refused whole.
   */
  readonly marker: string
  readonly ttlSeconds: number
  readonly jobs: ReadonlyArray<OnceJob>
}

export class JobQueue extends Context.Service<JobQueue, {
  /**
   * One outcome per element of `args`, in order. Empty `args` → no Redis call. Jids are chosen
   * before anything is written; `beforePush` (if given) sees each slice's outcomes — which jobs will
   * be pushed under which jid, which are duplicates of which pending job — before the slice is pushed.
   */
  bulkEnqueue<E = never, R = never>(
    request: BulkEnqueue,
    beforePush?: BeforePush<E, R>
  ): Effect.Effect<ReadonlyArray<EnqueueOutcome>, RedisError | E, R>
  /**
   * A batch pushed at most once, for an outbox relay that may run twice over the same batch (killed
   * between the push and forgetting the batch): `SET marker NX EX ttl` and, only when it was not
   * there, one LPUSH of every job, as one atomic step. "pushed", or "already" when a push of this
   * batch came first (nothing pushed now). No `until_executed` claims: the relay's jobs are GitLab's
   * own after-transition jobs, which GitLab's server-side de-duplication handles as it does its own.
   */
  pushOnce(request: PushOnce): Effect.Effect<"pushed" | "already", RedisError>
  /**
   * Who holds the `until_executed` claim of the job (class, args) in `queue`: its jid, `""` when
   * the claim's value is unreadable, null when nobody does. One key read: shadow mode's way to see
   * whether GitLab pushed the job Sweeper proposed.
   */
  claimHolder(
    queue: string,
    workerClass: string,
    args: ReadonlyArray<unknown>
  ): Effect.Effect<string | null, RedisError>
  /** The first `count` jobs of `queue:<queue>` (the next Sidekiq takes last), as bytes; shadow mode's bounded read. */
  peek(queue: string, count: number): Effect.Effect<ReadonlyArray<Uint8Array>, RedisError>
}>()("sweeper/services/JobQueue") {}
