/**
 * JobQueue, shared by both backends (JobQueueRedis, memory/JobQueueMemory). They differ only in the
 * two Redis steps of a slice (`JobQueueStore`: check the claims; push then claim); building jobs,
 * slicing, deciding which job is a duplicate, the `beforePush` hook and logging duplicates is
 * `makeJobQueue`, here, so both backends produce the same bytes.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Random from "effect/Random"
import { createHash } from "node:crypto"
import type { RedisError } from "../../domain/Errors.ts"
import { BULK_PUSH_SLICE, duplicateDigestInput, duplicateKeyOf, jidFrom, sidekiqJob } from "../../domain/Sidekiq.ts"
import {
  type BeforePush,
  type BulkEnqueue,
  type EnqueueOutcome,
  JobQueue,
  type PushOnce
} from "../../services/JobQueue.ts"

/**
 * GitLab's `until_executed` claim key of a job: `resque:gitlab:duplicate:<queue>:<sha256 of "<class>:<JSON args>">`.
 */
export const duplicateKey = (queue: string, workerClass: string, args: ReadonlyArray<unknown>) =>
  duplicateKeyOf(queue, createHash("sha256").update(duplicateDigestInput(workerClass, args)).digest("hex"))

/** A job ready for Redis: its payload and, with de-duplication, the key it must claim first. */
export interface PreparedJob {
  readonly jid: string
  readonly payload: string
  readonly duplicateKey: string | undefined
}

/** Who holds a claim key: nobody, or the pending job `jid` (null if its value is unreadable). */
export type ClaimHolder = { readonly held: false } | { readonly held: true; readonly jid: string | null }

/**
 * The two Redis steps of a slice; the decision between them (which job is a duplicate) is
 * `makeJobQueue`'s, shared, so both backends decide alike.
 */
export interface JobQueueStore {
  /** Step 1: who holds each claim key, in order (read only). */
  checkClaims(keys: ReadonlyArray<string>): Effect.Effect<ReadonlyArray<ClaimHolder>, RedisError>
  /**
   * Steps 2 and 3: `SADD queues <queue>` and one LPUSH of all `jobs` (all or none), then — only
   * after — each job's claim (`SET NX EX 600`). Fails if the jobs could not be pushed; a job not
   * pushed is not claimed.
   */
  push(queue: string, jobs: ReadonlyArray<PreparedJob>): Effect.Effect<void, RedisError>
  /**
   * `SADD queues <queue>`, then `SET marker 1 NX EX ttl` and, only if it was set, one LPUSH of the
   * payloads, those two atomically. True when pushed, false when the marker was there.
   */
  pushOnce(
    queue: string,
    marker: string,
    ttlSeconds: number,
    payloads: ReadonlyArray<string>
  ): Effect.Effect<boolean, RedisError>
  /** LRANGE queue:<queue> 0 count-1, as bytes (read only). */
  peek(queue: string, count: number): Effect.Effect<ReadonlyArray<Uint8Array>, RedisError>
}

export const makeJobQueue = (store: JobQueueStore): JobQueue["Service"] => {
  const bulkEnqueue = <E, R>(request: BulkEnqueue, beforePush?: BeforePush<E, R>) =>
    Effect.gen(function*() {
      const { workerClass, queue, extra } = request
      const deduplicate = request.deduplicate === "until_executed"
      const nowMillis = yield* Clock.currentTimeMillis
      const random = yield* Random.Random
      const outcomes: Array<EnqueueOutcome> = []
      for (let start = 0; start < request.args.length; start += BULK_PUSH_SLICE) {
        const slice = request.args.slice(start, start + BULK_PUSH_SLICE)
        const prepared = slice.map((args): PreparedJob => {
          const job = sidekiqJob({ workerClass, args, queue, jid: jidFrom(random), nowMillis, ...(extra && { extra }) })
          return {
            jid: job.jid,
            payload: JSON.stringify(job),
            duplicateKey: deduplicate ? duplicateKey(queue, workerClass, args) : undefined
          }
        })

        // 1. check: which claim keys are held, and by whom.
        const claimKeys = [
          ...new Set(prepared.flatMap((job) => (job.duplicateKey === undefined ? [] : [job.duplicateKey])))
        ]
        const holders = claimKeys.length === 0 ? [] : yield* store.checkClaims(claimKeys)
        const held = new Map<string, string | null>()
        claimKeys.forEach((key, i) => {
          const holder = holders[i]
          if (holder?.held === true) held.set(key, holder.jid)
        })

        // Decide per job, in order: a later job of the slice with the same claim is a duplicate of
        // the earlier one (as if each job were pushed and claimed one after another). The push does
        // not decide again, so these outcomes are what happens if the push succeeds.
        const decided: Array<EnqueueOutcome> = []
        const toPush: Array<PreparedJob> = []
        for (let i = 0; i < slice.length; i++) {
          const args = slice[i]!
          const job = prepared[i]!
          const key = job.duplicateKey
          if (key !== undefined && held.has(key)) {
            decided.push({ _tag: "Duplicate", args, existingJid: held.get(key) ?? null })
            continue
          }
          if (key !== undefined) held.set(key, job.jid)
          toPush.push(job)
          decided.push({ _tag: "Enqueued", args, jid: job.jid })
        }

        if (beforePush !== undefined) yield* beforePush(decided)
        // 2. + 3. push, then claim.
        if (toPush.length > 0) yield* store.push(queue, toPush)

        for (let i = 0; i < decided.length; i++) {
          const outcome = decided[i]!
          outcomes.push(outcome)
          if (outcome._tag === "Enqueued") continue
          yield* Effect.logInfo("Dropped duplicate job").pipe(Effect.annotateLogs({
            class: workerClass,
            queue,
            args: JSON.stringify(outcome.args),
            existing_jid: outcome.existingJid,
            duplicate_key: prepared[i]!.duplicateKey,
            deduplication: "until_executed"
          }))
        }
      }
      return outcomes as ReadonlyArray<EnqueueOutcome>
    }).pipe(Effect.withSpan("JobQueue.bulkEnqueue"))
  const pushOnce = (request: PushOnce) =>
    Effect.gen(function*() {
      const nowMillis = yield* Clock.currentTimeMillis
      const random = yield* Random.Random
      const payloads = request.jobs.map((job) => {
        const built = sidekiqJob({
          workerClass: job.workerClass,
          args: job.args,
          queue: request.queue,
          jid: jidFrom(random),
          nowMillis,
          ...(job.retry === undefined ? {} : { extra: { retry: job.retry } })
        })
        // created_at: when the job was decided (the drop's commit), as Sidekiq's client stamps it.
        return JSON.stringify({ ...built, created_at: job.createdAtMillis / 1000 })
      })
      if (payloads.length === 0) return "pushed" as const
      const pushed = yield* store.pushOnce(request.queue, request.marker, request.ttlSeconds, payloads)
      return pushed ? "pushed" as const : "already" as const
    }).pipe(Effect.withSpan("JobQueue.pushOnce"))
  const claimHolder = (queue: string, workerClass: string, args: ReadonlyArray<unknown>) =>
    Effect.map(
      store.checkClaims([duplicateKey(queue, workerClass, args)]),
      ([holder]) => holder?.held === true ? holder.jid ?? "" : null
    )
  const peek = (queue: string, count: number) => count <= 0 ? Effect.succeed([]) : store.peek(queue, count)
  return JobQueue.of({ bulkEnqueue, pushOnce, claimHolder, peek })
}
