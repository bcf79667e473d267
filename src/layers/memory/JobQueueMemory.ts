/**
 * JobQueue over the in-memory Redis, same keys, bytes and write order as JobQueueRedis: claims
 * checked, then `SADD queues` and the jobs LPUSHed in one synchronous step (all or none, like the
 * one LPUSH), then the claims set.
 */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { RedisError } from "../../domain/Errors.ts"
import { DUPLICATE_KEY_TTL_SECONDS, queueKey, QUEUES_SET } from "../../domain/Sidekiq.ts"
import { JobQueue } from "../../services/JobQueue.ts"
import { type ClaimHolder, type JobQueueStore, makeJobQueue, type PreparedJob } from "../protocols/JobQueueShared.ts"
import { MemoryRedis, type MemoryRedisStore } from "./MemoryRedis.ts"

const holderOf = (store: MemoryRedisStore, key: string): ClaimHolder => {
  if (!store.exists(key)) return { held: false }
  // A claim that is not a string is still a claim, just an unreadable one.
  try {
    return { held: true, jid: store.get(key) }
  } catch {
    return { held: true, jid: null }
  }
}

const step = <A>(operation: string, f: () => A) =>
  Effect.try({ try: f, catch: (cause) => new RedisError({ operation, cause }) })

/** The two steps over an in-memory Redis (exported so fault tests can wrap them). */
export const jobQueueMemoryStore = (store: MemoryRedisStore): JobQueueStore => ({
  checkClaims: (keys) => Effect.sync(() => keys.map((key) => holderOf(store, key))),
  push: (queue: string, jobs: ReadonlyArray<PreparedJob>) =>
    Effect.gen(function*() {
      yield* step("jobQueue.push", () => {
        store.sadd(QUEUES_SET, queue)
        store.lpush(queueKey(queue), ...jobs.map((job) => job.payload))
      })
      yield* step("jobQueue.claim", () => {
        for (const job of jobs) {
          if (job.duplicateKey !== undefined) {
            store.set(job.duplicateKey, job.jid, { nx: true, exSeconds: DUPLICATE_KEY_TTL_SECONDS })
          }
        }
      })
    }),
  pushOnce: (queue, marker, ttlSeconds, payloads) =>
    step("jobQueue.pushOnce", () => {
      store.sadd(QUEUES_SET, queue)
      if (!store.set(marker, "1", { nx: true, exSeconds: ttlSeconds })) return false
      store.lpush(queueKey(queue), ...payloads)
      return true
    }),
  peek: (queue, count) => step("jobQueue.peek", () => store.lrangeBuffer(queueKey(queue), 0, count - 1))
})

export const JobQueueMemory = Layer.effect(
  JobQueue,
  Effect.map(MemoryRedis, (store) => makeJobQueue(jobQueueMemoryStore(store)))
)
