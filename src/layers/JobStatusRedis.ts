/**
 * JobStatus on real Redis (QueuesMetadata): MGET in slices, so a large backlog costs a few round
 * trips, not one per jid. On a cluster the status keys of a slice hash to many slots and MGET would
 * be refused (CROSSSLOT): there the slice is one GET per key, all sent at once (ioredis routes each
 * to its node without waiting for replies), which still costs one round trip per slice.
 */
import { type Duration, Effect, Layer } from "effect"
import { JOB_STATUS_LOOKUP_SLICE, JOB_STATUS_VALUE, jobStatusKey } from "../domain/SidekiqStatus.ts"
import { JobStatus } from "../services/JobStatus.ts"
import { ttlSeconds } from "./LeaseRedis.ts"
import { QueuesMetadataRedis } from "./Redis.ts"

export const JobStatusRedis = Layer.effect(
  JobStatus,
  Effect.gen(function*() {
    const redis = yield* QueuesMetadataRedis

    const completedJids = Effect.fn("JobStatus.completedJids")(function*(jids: ReadonlyArray<string>) {
      const completed: Array<string> = []
      for (let start = 0; start < jids.length; start += JOB_STATUS_LOOKUP_SLICE) {
        const slice = jids.slice(start, start + JOB_STATUS_LOOKUP_SLICE)
        const keys = slice.map(jobStatusKey)
        const values = yield* redis.use("jobStatus.mget", (client) =>
          redis.kind === "cluster" ? Promise.all(keys.map((key) => client.get(key))) : client.mget(keys))
        slice.forEach((jid, i) => {
          if (values[i] === null || values[i] === undefined) completed.push(jid)
        })
      }
      return completed
    })

    const track = Effect.fn("JobStatus.track")(function*(jid: string, ttl: Duration.Duration) {
      yield* redis.use("jobStatus.set", (client) => client.set(jobStatusKey(jid), JOB_STATUS_VALUE, "EX", ttlSeconds(ttl)))
    })

    const untrack = Effect.fn("JobStatus.untrack")(function*(jid: string) {
      yield* redis.use("jobStatus.del", (client) => client.del(jobStatusKey(jid)))
    })

    return JobStatus.of({ completedJids, track, untrack })
  })
)
