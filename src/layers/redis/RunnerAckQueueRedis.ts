/** RunnerAckQueue on real Redis (GitLab's shared-state instance). */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { RUNNER_ACK_QUEUE_EXPIRY, runnerAckQueueKey } from "../../domain/StuckBuilds.ts"
import { RunnerAckQueue } from "../../services/RunnerAckQueue.ts"
import { SharedStateRedis } from "./Redis.ts"

export const RunnerAckQueueRedis = Layer.effect(
  RunnerAckQueue,
  Effect.gen(function*() {
    const redis = yield* SharedStateRedis
    const waitingForAck = Effect.fn("RunnerAckQueue.waitingForAck")(function*(buildIds: ReadonlyArray<number>) {
      if (buildIds.length === 0) return new Set<number>()
      // One GET per key rather than MGET: on a cluster the keys live in different slots.
      const values = yield* redis.use(
        "runner_ack_queue.get",
        (client) => Promise.all(buildIds.map((id) => client.get(runnerAckQueueKey(id))))
      )
      return new Set(buildIds.filter((_, i) => values[i] !== null && values[i] !== ""))
    })
    const setWaiting = Effect.fn("RunnerAckQueue.setWaiting")(function*(buildId: number, runnerManagerId: number) {
      yield* redis.use(
        "runner_ack_queue.set",
        (client) =>
          client.set(
            runnerAckQueueKey(buildId),
            String(runnerManagerId),
            "EX",
            Duration.toSeconds(RUNNER_ACK_QUEUE_EXPIRY),
            "NX"
          )
      )
    })
    return RunnerAckQueue.of({ waitingForAck, setWaiting })
  })
)
