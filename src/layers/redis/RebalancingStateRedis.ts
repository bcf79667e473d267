/** RebalancingState on real Redis (GitLab's shared-state instance). */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import {
  rebalanceMember,
  type RebalanceType,
  RECENTLY_FINISHED_TTL,
  recentlyFinishedKey,
  REDIS_EXPIRY_TIME,
  RUNNING_REBALANCES_KEY
} from "../../domain/Rebalancing.ts"
import { RebalancingState } from "../../services/RebalancingState.ts"
import { SharedStateRedis } from "./Redis.ts"

export const RebalancingStateRedis = Layer.effect(
  RebalancingState,
  Effect.gen(function*() {
    const redis = yield* SharedStateRedis
    const runningMembers = redis.use("rebalancing.smembers", (client) => client.smembersBuffer(RUNNING_REBALANCES_KEY))
      .pipe(
        Effect.withSpan("RebalancingState.runningMembers")
      )
    const track = Effect.fn("RebalancingState.track")(function*(type: RebalanceType, id: number) {
      yield* redis.use("rebalancing.track", async (client) => {
        const results = await client.multi()
          .sadd(RUNNING_REBALANCES_KEY, rebalanceMember(type, id))
          .expire(RUNNING_REBALANCES_KEY, Duration.toSeconds(REDIS_EXPIRY_TIME))
          .exec()
        // A command's error inside MULTI comes back as a value; rethrown, `use` names and classifies it.
        const failed = (results ?? []).find(([error]) => error !== null)
        if (failed !== undefined) throw failed[0]
      })
    })
    const recentlyFinished = (type: RebalanceType, id: number) =>
      redis.use("rebalancing.recentlyFinished", (client) => client.exists(recentlyFinishedKey(type, id)))
        .pipe(Effect.map((n) => n > 0))
    const finish = (type: RebalanceType, id: number) =>
      redis.use("rebalancing.finish", async (client) => {
        await client.srem(RUNNING_REBALANCES_KEY, rebalanceMember(type, id))
        await client.set(recentlyFinishedKey(type, id), "true", "EX", Duration.toSeconds(RECENTLY_FINISHED_TTL))
      })
    return RebalancingState.of({ runningMembers, track, recentlyFinished, finish })
  })
)
