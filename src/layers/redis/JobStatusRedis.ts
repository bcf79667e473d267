/**
 * JobStatus on real Redis (QueuesMetadata): MGET in slices of 1000, 20 slices sent at once, so a
 * large backlog costs a few round trips, not one per jid nor one per slice. On a cluster the status keys of a slice
 * hash to many slots and MGET would
 * be refused (CROSSSLOT): there the slice is one GET per key, all sent at once (ioredis routes each
 * to its node without waiting for replies), which still costs one round trip per slice.
 */
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { JOB_STATUS_LOOKUP_SLICE, JOB_STATUS_VALUE, jobStatusKey } from "../../domain/SidekiqStatus.ts"
import { JobStatus } from "../../services/JobStatus.ts"
import { ttlSeconds } from "./LeaseRedis.ts"
import { QueuesMetadataRedis, type RedisClient } from "./Redis.ts"

/**
 * MGET slices sent together before awaiting their replies (20 k keys a round trip): the look-up of
 * a 200 k backlog costs 10 round trips instead of 200, and one reply window stays small.
 */
const SLICES_IN_FLIGHT = 20

export const JobStatusRedis = Layer.effect(
  JobStatus,
  Effect.gen(function*() {
    const redis = yield* QueuesMetadataRedis

    const lookUp = (client: RedisClient, keys: ReadonlyArray<string>): Promise<ReadonlyArray<string | null>> =>
      redis.kind === "cluster" ? Promise.all(keys.map((key) => client.get(key))) : client.mget([...keys])

    const completedJids = Effect.fn("JobStatus.completedJids")(function*(jids: ReadonlyArray<string>) {
      const completed: Array<string> = []
      const window = JOB_STATUS_LOOKUP_SLICE * SLICES_IN_FLIGHT
      for (let start = 0; start < jids.length; start += window) {
        const slices: Array<ReadonlyArray<string>> = []
        for (let at = start; at < Math.min(start + window, jids.length); at += JOB_STATUS_LOOKUP_SLICE) {
          slices.push(jids.slice(at, Math.min(at + JOB_STATUS_LOOKUP_SLICE, start + window)))
        }
        // All slices of the window are sent before any reply is awaited: one round trip for them.
        const replies = yield* redis.use(
          "jobStatus.mget",
          (client) => Promise.all(slices.map((slice) => lookUp(client, slice.map(jobStatusKey))))
        )
        slices.forEach((slice, i) =>
          slice.forEach((jid, j) => {
            const value = replies[i]![j]
            if (value === null || value === undefined) completed.push(jid)
          })
        )
      }
      return completed
    })

    const track = Effect.fn("JobStatus.track")(function*(jid: string, ttl: Duration.Duration) {
      yield* redis.use(
        "jobStatus.set",
        (client) => client.set(jobStatusKey(jid), JOB_STATUS_VALUE, "EX", ttlSeconds(ttl))
      )
    })

    const untrack = Effect.fn("JobStatus.untrack")(function*(jid: string) {
      yield* redis.use("jobStatus.del", (client) => client.del(jobStatusKey(jid)))
    })

    return JobStatus.of({ completedJids, track, untrack })
  })
)
