/** JobStatus over the in-memory Redis: same keys and TTLs as JobStatusRedis, expiry follows the Clock. */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { JOB_STATUS_VALUE, jobStatusKey } from "../../domain/SidekiqStatus.ts"
import { JobStatus } from "../../services/JobStatus.ts"
import { ttlSeconds } from "../redis/LeaseRedis.ts"
import { MemoryRedis } from "./MemoryRedis.ts"

export const JobStatusMemory = Layer.effect(
  JobStatus,
  Effect.gen(function*() {
    const store = yield* MemoryRedis
    return JobStatus.of({
      completedJids: (jids) => Effect.sync(() => jids.filter((jid) => store.get(jobStatusKey(jid)) === null)),
      track: (jid, ttl) =>
        Effect.sync(() => {
          store.set(jobStatusKey(jid), JOB_STATUS_VALUE, { exSeconds: ttlSeconds(ttl) })
        }),
      untrack: (jid) =>
        Effect.sync(() => {
          store.del(jobStatusKey(jid))
        })
    })
  })
)
