/**
 * reschedule-stuck-issue-rebalances' backlog: the running-rebalances set parsed as the run parses
 * it, then only the containers the database still has (`rebalanceUnits`, the run's units): a member
 * naming a deleted namespace or project is one the run never reschedules. The set holds no times,
 * so no age. At most BACKLOG_CAP ids of each type are looked up.
 */
import * as Effect from "effect/Effect"
import { BACKLOG_CAP, backlogPart, type BacklogReading } from "../domain/Backlog.ts"
import { parseRunningRebalances, rebalanceTypeName, rebalanceUnits } from "../domain/Rebalancing.ts"
import { PlatformRecords } from "../services/PlatformRecords.ts"
import { RebalancingState } from "../services/RebalancingState.ts"

export const rescheduleStuckIssueRebalancesBacklog = Effect.gen(function*() {
  const records = yield* PlatformRecords
  const { namespaceIds, projectIds } = parseRunningRebalances(yield* (yield* RebalancingState).runningMembers)
  const existing = {
    namespaces: yield* records.existingNamespaceIds(namespaceIds.slice(0, BACKLOG_CAP)),
    projects: yield* records.existingProjectIds(projectIds.slice(0, BACKLOG_CAP))
  }
  const capped = namespaceIds.length > BACKLOG_CAP || projectIds.length > BACKLOG_CAP
  return {
    parts: rebalanceUnits(existing).map(({ type, ids }) =>
      backlogPart(`${rebalanceTypeName(type)} rebalances`, ids.length, capped, null)
    )
  }
}) satisfies Effect.Effect<BacklogReading, unknown, PlatformRecords | RebalancingState>
