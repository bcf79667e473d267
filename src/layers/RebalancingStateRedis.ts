/** RebalancingState on real Redis (GitLab's shared-state instance). */
import { Duration, Effect, Layer } from "effect"
import { RedisError } from "../domain/Errors.ts"
import { REDIS_EXPIRY_TIME, rebalanceMember, type RebalanceType, RUNNING_REBALANCES_KEY } from "../domain/Rebalancing.ts"
import { RebalancingState } from "../services/RebalancingState.ts"
import { SharedStateRedis } from "./Redis.ts"

export const RebalancingStateRedis = Layer.effect(
  RebalancingState,
  Effect.gen(function*() {
    const redis = yield* SharedStateRedis
    const runningMembers = redis.use("rebalancing.smembers", (client) => client.smembersBuffer(RUNNING_REBALANCES_KEY)).pipe(
      Effect.withSpan("RebalancingState.runningMembers")
    )
    const track = Effect.fn("RebalancingState.track")(function*(type: RebalanceType, id: number) {
      const results = yield* redis.use("rebalancing.track", (client) =>
        client.multi()
          .sadd(RUNNING_REBALANCES_KEY, rebalanceMember(type, id))
          .expire(RUNNING_REBALANCES_KEY, Duration.toSeconds(REDIS_EXPIRY_TIME))
          .exec())
      const failed = (results ?? []).find(([error]) => error !== null)
      if (failed !== undefined) return yield* new RedisError({ operation: "rebalancing.track", cause: failed[0] })
    })
    return RebalancingState.of({ runningMembers, track })
  })
)
