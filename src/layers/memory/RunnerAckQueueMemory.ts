/** RunnerAckQueue over the in-memory Redis, same key and expiry as RunnerAckQueueRedis. */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { RedisError } from "../../domain/Errors.ts"
import { RUNNER_ACK_QUEUE_EXPIRY, runnerAckQueueKey } from "../../domain/StuckBuilds.ts"
import { RunnerAckQueue } from "../../services/RunnerAckQueue.ts"
import { MemoryRedis } from "./MemoryRedis.ts"

export const RunnerAckQueueMemory = Layer.effect(
  RunnerAckQueue,
  Effect.gen(function*() {
    const store = yield* MemoryRedis
    const attempt = <A>(operation: string, f: () => A) =>
      Effect.try({ try: f, catch: (cause) => new RedisError({ operation, cause }) })
    return RunnerAckQueue.of({
      waitingForAck: (buildIds) =>
        attempt("runner_ack_queue.get", () => new Set(buildIds.filter((id) => store.exists(runnerAckQueueKey(id))))),
      setWaiting: (buildId, runnerManagerId) =>
        attempt("runner_ack_queue.set", () => {
          store.set(runnerAckQueueKey(buildId), String(runnerManagerId), {
            exSeconds: Duration.toSeconds(RUNNER_ACK_QUEUE_EXPIRY),
            nx: true
          })
        })
    })
  })
)
