/**
 * GitLab's issue-rebalancing shared state in Redis (`Gitlab::Issues::Rebalancing::State`): the set
 * `gitlab:issues-position-rebalances:running_rebalances` of `"<type>/<id>"` members. Sweeper reads
 * it; `track` does what the rebalancer does on start (SADD, then refresh the 10-day expiry), for
 * tests and the simulator.
 */
import * as Context from "effect/Context"
import type * as Effect from "effect/Effect"
import type { RedisError } from "../domain/Errors.ts"
import type { RebalanceType } from "../domain/Rebalancing.ts"

export class RebalancingState extends Context.Service<RebalancingState, {
  /**
   * SMEMBERS as the exact bytes Redis holds, untrusted (decode with `parseRunningRebalances`, which
   * counts anything that is not UTF-8); order is arbitrary.
   */
  readonly runningMembers: Effect.Effect<ReadonlyArray<Uint8Array>, RedisError>
  /** Marks a container as being rebalanced, as GitLab's rebalancer does when it starts. */
  track(type: RebalanceType, id: number): Effect.Effect<void, RedisError>
  /**
   * Whether GitLab's `recently_finished` mark of the container is there (set for an hour when its
   * rebalance finishes): shadow mode's sign that a proposed rebalance ran.
   */
  recentlyFinished(type: RebalanceType, id: number): Effect.Effect<boolean, RedisError>
  /**
   * What the rebalancer does when a rebalance finishes (`cleanup_cache`): the member out of the set,
   * then the mark, for the simulator's and tests' GitLab.
   */
  finish(type: RebalanceType, id: number): Effect.Effect<void, RedisError>
}>()("sweeper/services/RebalancingState") {}
