/**
 * GitLab's runner-acknowledgement wait in Redis (`Gitlab::Ci::Build::RunnerAckQueue`, shared-state
 * instance): while a runner that supports two-phase commit prepares a build it was handed, the key
 * `runner:build_ack_queue:<build id>` holds that runner manager's id, refreshed by each ping and
 * expiring two minutes after the last. Sweeper only reads it; `setWaiting` does what GitLab does when
 * it hands a build over, for tests and the simulator.
 */
import * as Context from "effect/Context"
import type * as Effect from "effect/Effect"
import type { RedisError } from "../domain/Errors.ts"

export class RunnerAckQueue extends Context.Service<RunnerAckQueue, {
  /** Which of these builds still await a runner's acknowledgement (their key is present). */
  waitingForAck(buildIds: ReadonlyArray<number>): Effect.Effect<ReadonlySet<number>, RedisError>
  /** Marks a build as awaiting `runnerManagerId`'s acknowledgement, with GitLab's expiry. */
  setWaiting(buildId: number, runnerManagerId: number): Effect.Effect<void, RedisError>
}>()("sweeper/services/RunnerAckQueue") {}
