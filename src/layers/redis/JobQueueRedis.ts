/**
 * JobQueue on real Redis, over two of GitLab's stores: the jobs go to Queues
 * (`queue:<name>`, `queues`), the `until_executed` claims to QueuesMetadata
 * (`resque:gitlab:duplicate:*`). No step can be atomic across stores (nor across hash slots on a
 * cluster), so a slice is three steps, in an order whose only failure mode is a duplicate job:
 *
 *   1. check  — per claim key, one single-key script on QueuesMetadata: held (by which jid) or free;
 *   2. push   — on Queues: `SADD queues <q>` (harmless alone), then one `LPUSH queue:<q>` of every
 *               job to push, in order (one command: all of the slice's jobs or none);
 *   3. claim  — per pushed job, `SET <claim> <jid> NX EX 600` on QueuesMetadata.
 *
 * A crash (or a failed command) between 2 and 3 leaves jobs pushed without their claims: a later
 * enqueue of the same args within 600 s may push a duplicate, which Sidekiq's own until_executed
 * check tolerates. The other order (claim first) would, on a crash, hold claims for jobs that were
 * never pushed: a lost enqueue for 600 s. A failed push (WRONGTYPE) sets no claim.
 *
 * Commands of one step are sent together (ioredis writes them without waiting for replies), so a
 * slice costs three round trips whatever its size, on one server or a cluster.
 */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Schema from "effect/Schema"
import type { Result } from "ioredis"
import { RedisError } from "../../domain/Errors.ts"
import { hashTagOf } from "../../domain/RedisKey.ts"
import { DUPLICATE_KEY_TTL_SECONDS, queueKey, QUEUES_SET } from "../../domain/Sidekiq.ts"
import { JobQueue } from "../../services/JobQueue.ts"
import { type ClaimHolder, makeJobQueue, type PreparedJob } from "../protocols/JobQueueShared.ts"
import { PUSH } from "./ConcurrencyLimitsRedis.ts"
import { QueuesMetadataRedis, QueuesRedis } from "./Redis.ts"

declare module "ioredis" {
  interface RedisCommander<Context> {
    /** KEYS: one duplicate key. Reply {0} free, {1, jid or false} held. */
    sweeperCheckClaim(numKeys: number, ...keysAndArgs: Array<string | number>): Result<unknown, Context>
    /** KEYS: queue:<queue>, the batch's marker (same slot). ARGV: TTL seconds, payloads. 1 pushed, 0 refused. */
    sweeperPushOnce(numKeys: number, ...keysAndArgs: Array<string | number>): Result<number, Context>
  }
}

// A claim that is not a string is still a claim, just an unreadable one (false).
const CHECK_CLAIM = `
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
if redis.call('TYPE', KEYS[1]).ok == 'string' then return {1, redis.call('GET', KEYS[1])} end
return {1, false}`

const ClaimReply = Schema.Union([
  Schema.Tuple([Schema.Literal(0)]),
  Schema.Tuple([Schema.Literal(1), Schema.NullOr(Schema.String)])
])
const decodeClaim = Schema.decodeUnknownEffect(ClaimReply)

export const JobQueueRedis = Layer.effect(
  JobQueue,
  Effect.gen(function*() {
    const queues = yield* QueuesRedis
    const metadata = yield* QueuesMetadataRedis
    // ioredis sends EVALSHA and falls back to EVAL per connection (per node on a cluster).
    metadata.client.defineCommand("sweeperCheckClaim", { lua: CHECK_CLAIM })
    // The resumed jobs' script: SET the marker NX and, only if it was not there, LPUSH the jobs.
    queues.client.defineCommand("sweeperPushOnce", { lua: PUSH })

    const fail = (cause: unknown) => new RedisError({ operation: "jobQueue.push", cause })

    // 1. check: per claim key, held (by which jid) or free.
    const checkClaims = Effect.fnUntraced(function*(keys: ReadonlyArray<string>) {
      const checked = yield* metadata.use(
        "jobQueue.checkClaims",
        (client) => Promise.all(keys.map((key) => client.sweeperCheckClaim(1, key)))
      )
      const holders: Array<ClaimHolder> = []
      for (const raw of checked) {
        const reply = yield* decodeClaim(raw).pipe(Effect.mapError(fail))
        holders.push(reply[0] === 1 ? { held: true, jid: reply[1] } : { held: false })
      }
      return holders
    })

    const push = Effect.fnUntraced(function*(queue: string, jobs: ReadonlyArray<PreparedJob>) {
      // 2. push: the queue name first (harmless alone), then every job in one LPUSH.
      yield* queues.use("jobQueue.push", async (client) => {
        await client.sadd(QUEUES_SET, queue)
        await client.lpush(queueKey(queue), ...jobs.map((job) => job.payload))
      })

      // 3. claim: only now, so a crash before this point can duplicate a job but never lose one.
      yield* metadata.use(
        "jobQueue.claim",
        (client) =>
          Promise.all(jobs.flatMap((job) =>
            job.duplicateKey === undefined
              ? []
              : [client.set(job.duplicateKey, job.jid, "EX", DUPLICATE_KEY_TTL_SECONDS, "NX")]
          ))
      )
    })

    const pushOnce = Effect.fnUntraced(
      function*(queue: string, marker: string, ttlSeconds: number, payloads: ReadonlyArray<string>) {
        // One script over two keys: on a cluster they must share a slot, which the marker's hash tag gives.
        if (hashTagOf(marker) !== hashTagOf(queueKey(queue))) {
          return yield* fail(new Error(`marker ${marker} is not in the slot of ${queueKey(queue)}`))
        }
        yield* queues.use("jobQueue.pushOnce", async (client) => {
          await client.sadd(QUEUES_SET, queue)
        })
        const pushed = yield* queues.use(
          "jobQueue.pushOnce",
          (client) => client.sweeperPushOnce(2, queueKey(queue), marker, ttlSeconds, ...payloads)
        )
        return pushed === 1
      }
    )

    const peek = (queue: string, count: number) =>
      queues.use("jobQueue.peek", (client) => client.lrangeBuffer(queueKey(queue), 0, count - 1))
    return makeJobQueue({ checkClaims, push, pushOnce, peek })
  })
)
