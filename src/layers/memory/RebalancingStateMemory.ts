/** RebalancingState over the in-memory Redis, same key and member format as RebalancingStateRedis. */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { RedisError } from "../../domain/Errors.ts"
import {
  rebalanceMember,
  type RebalanceType,
  RECENTLY_FINISHED_TTL,
  recentlyFinishedKey,
  REDIS_EXPIRY_TIME,
  RUNNING_REBALANCES_KEY
} from "../../domain/Rebalancing.ts"
import { RebalancingState } from "../../services/RebalancingState.ts"
import { MemoryRedis } from "./MemoryRedis.ts"

export const RebalancingStateMemory = Layer.effect(
  RebalancingState,
  Effect.gen(function*() {
    const store = yield* MemoryRedis
    const attempt = <A>(operation: string, f: () => A) =>
      Effect.try({ try: f, catch: (cause) => new RedisError({ operation, cause }) })
    return RebalancingState.of({
      runningMembers: attempt("rebalancing.smembers", () => store.smembersBuffer(RUNNING_REBALANCES_KEY)),
      track: (type: RebalanceType, id: number) =>
        attempt("rebalancing.track", () => {
          store.sadd(RUNNING_REBALANCES_KEY, rebalanceMember(type, id))
          store.expire(RUNNING_REBALANCES_KEY, Duration.toSeconds(REDIS_EXPIRY_TIME))
        }),
      recentlyFinished: (type: RebalanceType, id: number) =>
        attempt("rebalancing.recentlyFinished", () => store.exists(recentlyFinishedKey(type, id))),
      finish: (type: RebalanceType, id: number) =>
        attempt("rebalancing.finish", () => {
          store.srem(RUNNING_REBALANCES_KEY, rebalanceMember(type, id))
          store.set(recentlyFinishedKey(type, id), "true", { exSeconds: Duration.toSeconds(RECENTLY_FINISHED_TTL) })
        })
    })
  })
)
