/**
 * The write step of reschedule-stuck-issue-rebalances as one operation: one bulk push of
 * Issues::RebalancingWorker for the containers of one type, each container's RebalanceRescheduled
 * event written *before* its push. Why before: the jids are chosen and the de-duplication claims
 * checked first, so each event already says what the push will do (a new job and its jid, or a
 * duplicate of the pending job); a crash between the events and the push leaves events for a push
 * that did not happen, and the container, still in the running set, is pushed and recorded again by
 * the next run — an extra event, never a push without one (docs/operations.md, Failure handling).
 */
import * as Context from "effect/Context"
import type * as Effect from "effect/Effect"
import type { SqlError } from "effect/sql/SqlError"
import type { RedisError } from "../domain/Errors.ts"
import type { RebalanceType } from "../domain/Rebalancing.ts"

export class RebalanceReschedule extends Context.Service<RebalanceReschedule, {
  /**
   * Pushes one job per id (in order), de-duplicated until executed; how many were pushed and how many were
   * duplicates.
   */
  reschedule(
    type: RebalanceType,
    ids: ReadonlyArray<number>
  ): Effect.Effect<{ readonly enqueued: number; readonly duplicates: number }, RedisError | SqlError>
}>()("sweeper/services/RebalanceReschedule") {}
