/**
 * JobQueue over the in-memory Redis, same keys, bytes and write order as JobQueueRedis. Each job is
 * one synchronous step (atomic, as the Lua script); like a pipeline, a job that fails (WRONGTYPE)
 * does not stop the rest of its slice, and the slice then fails with the first error.
 */
import { Effect, Layer, Result } from "effect"
import { RedisError } from "../../domain/Errors.ts"
import { DUPLICATE_KEY_TTL_SECONDS, QUEUES_SET, queueKey } from "../../domain/Sidekiq.ts"
import { JobQueue, makeJobQueue, type PreparedJob, type PushReply } from "../../services/JobQueue.ts"
import { MemoryRedis, type MemoryRedisStore } from "./MemoryRedis.ts"

const pushJob = (store: MemoryRedisStore, queue: string, job: PreparedJob): Effect.Effect<PushReply, RedisError> => {
  const step = <A>(f: () => A) => Effect.try({ try: f, catch: (cause) => new RedisError({ operation: "jobQueue.push", cause }) })
  const claim = job.duplicateKey
  if (claim !== undefined && store.exists(claim)) {
    // A claim that is not a string is still a claim, just an unreadable one.
    return step(() => store.get(claim)).pipe(
      Effect.orElseSucceed(() => null),
      Effect.map((existingJid): PushReply => ({ pushed: false, existingJid }))
    )
  }
  return step((): PushReply => {
    store.sadd(QUEUES_SET, queue)
    store.lpush(queueKey(queue), job.payload)
    if (claim !== undefined) store.set(claim, job.jid, { nx: true, exSeconds: DUPLICATE_KEY_TTL_SECONDS })
    return { pushed: true }
  })
}

export const JobQueueMemory = Layer.effect(
  JobQueue,
  Effect.gen(function*() {
    const store = yield* MemoryRedis
    return makeJobQueue(Effect.fnUntraced(function*(queue: string, jobs: ReadonlyArray<PreparedJob>) {
      const results = yield* Effect.forEach(jobs, (job) => Effect.result(pushJob(store, queue, job)))
      const replies: Array<PushReply> = []
      for (const result of results) {
        if (Result.isFailure(result)) return yield* result.failure
        replies.push(result.success)
      }
      return replies
    }))
  })
)
