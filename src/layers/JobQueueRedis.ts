/**
 * JobQueue on real Redis. Each job is one Lua script call — de-duplication check, SADD, LPUSH, claim
 * — so a claim never exists without its job nor a job without its claim; each slice is one pipeline
 * of those calls (one round trip). The script orders its writes so that a failing step leaves
 * nothing behind: SADD of the queue name is harmless alone, LPUSH is the step that can fail
 * (WRONGTYPE), and the claim (a plain SET, which cannot fail) comes last.
 */
import { Effect, Layer, Schema } from "effect"
import type { Result } from "ioredis"
import { RedisError } from "../domain/Errors.ts"
import { DUPLICATE_KEY_TTL_SECONDS, QUEUES_SET, queueKey } from "../domain/Sidekiq.ts"
import { JobQueue, makeJobQueue, type PreparedJob, type PushReply } from "../services/JobQueue.ts"
import { Redis } from "./Redis.ts"

declare module "ioredis" {
  interface RedisCommander<Context> {
    /** KEYS: queue list, queues set[, duplicate key]; ARGV: queue name, payload, jid, ttl. */
    sweeperPushJob(numKeys: number, ...keysAndArgs: Array<string | number>): Result<unknown, Context>
  }
}

// Reply {1, jid} when pushed, {0, existing jid or false} when the duplicate key was held.
const PUSH_JOB = `
if #KEYS == 3 and redis.call('EXISTS', KEYS[3]) == 1 then
  local existing = false
  if redis.call('TYPE', KEYS[3]).ok == 'string' then existing = redis.call('GET', KEYS[3]) end
  return {0, existing}
end
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('LPUSH', KEYS[1], ARGV[2])
if #KEYS == 3 then redis.call('SET', KEYS[3], ARGV[3], 'NX', 'EX', ARGV[4]) end
return {1, ARGV[3]}`

const ScriptReply = Schema.Tuple([Schema.Literals([0, 1]), Schema.NullOr(Schema.String)])
const decodeReply = Schema.decodeUnknownEffect(ScriptReply)

export const JobQueueRedis = Layer.effect(
  JobQueue,
  Effect.gen(function*() {
    const redis = yield* Redis
    // ioredis sends EVALSHA and falls back to EVAL per connection (also inside pipelines).
    redis.client.defineCommand("sweeperPushJob", { lua: PUSH_JOB })

    const pushSlice = Effect.fnUntraced(function*(queue: string, jobs: ReadonlyArray<PreparedJob>) {
      const results = yield* redis.use("jobQueue.push", (client) => {
        const pipeline = client.pipeline()
        for (const job of jobs) {
          const keys = job.duplicateKey === undefined
            ? [queueKey(queue), QUEUES_SET]
            : [queueKey(queue), QUEUES_SET, job.duplicateKey]
          pipeline.sweeperPushJob(keys.length, ...keys, queue, job.payload, job.jid, DUPLICATE_KEY_TTL_SECONDS)
        }
        return pipeline.exec()
      })
      const replies: Array<PushReply> = []
      for (const [error, value] of results ?? []) {
        if (error !== null) return yield* new RedisError({ operation: "jobQueue.push", cause: error })
        const [pushed, jid] = yield* decodeReply(value).pipe(
          Effect.mapError((cause) => new RedisError({ operation: "jobQueue.push", cause }))
        )
        replies.push(pushed === 1 ? { pushed: true } : { pushed: false, existingJid: jid })
      }
      if (replies.length !== jobs.length) {
        return yield* new RedisError({ operation: "jobQueue.push", cause: new Error("pipeline was discarded") })
      }
      return replies
    })

    return makeJobQueue(pushSlice)
  })
)
