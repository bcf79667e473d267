/**
 * reschedule-stuck-issue-rebalances — port of GitLab's Issues::RescheduleStuckIssueRebalancesWorker.
 * Issue `relative_position` rebalances are
 * tracked in the Redis set `gitlab:issues-position-rebalances:running_rebalances`; a rebalance whose
 * Issues::RebalancingWorker job was lost (deploy, crash, Redis failover) stays in the set and never
 * finishes. Every 15 minutes this re-enqueues one Issues::RebalancingWorker per container still in
 * the set and still in the database: `[null, null, <namespace_id>]` for namespaces (type 1),
 * `[null, <project_id>, null]` for projects (type 2), one bulk push each.
 *
 * Each push writes its events first (`RebalanceReschedule`, layers/RebalanceRescheduleLive.ts).
 *
 * Re-enqueueing a rebalance that is in fact running is harmless: the worker is idempotent and the
 * jobs use `until_executed` de-duplication, so a job still pending for the same container is not
 * pushed twice (counted as `duplicates`). The batch also holds an exclusive lease so runs never
 * overlap, and checks its fence before each push: a holder that lost the lease pushes
 * nothing more.
 *
 * Members that are not `"1/<id>"` / `"2/<id>"` are skipped and counted (`invalidMembers`), never
 * fatal. GitLab silently turns them into id 0 (`to_i`); we count them so the rot is visible.
 *
 * Summary: `namespaceIds` / `projectIds` are the ids read from Redis (ascending, before the
 * database check — at most MAX_NUMBER_OF_CONCURRENT_REBALANCES each in a healthy system);
 * `enqueuedNamespaces` / `enqueuedProjects` count the jobs actually pushed and `duplicates` the jobs
 * dropped by de-duplication. A dry run pushes nothing and reports as enqueued what it would push
 * (with `duplicates: 0`, since it does not look at de-duplication keys).
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { type Batch, CurrentRun } from "../domain/Batch.ts"
import * as R from "../domain/Rebalancing.ts"
import { each, type Held, NOT_HELD } from "../repair/RepairLoop.ts"
import * as M from "../services/Metrics.ts"
import { PlatformRecords } from "../services/PlatformRecords.ts"
import { RebalanceReschedule } from "../services/RebalanceReschedule.ts"
import { RebalancingState } from "../services/RebalancingState.ts"
import { rescheduleStuckIssueRebalancesBacklog } from "./RescheduleStuckIssueRebalancesBacklog.ts"

export interface RescheduleStuckIssueRebalancesSummary extends Held {
  readonly namespaceIds: ReadonlyArray<number>
  readonly projectIds: ReadonlyArray<number>
  readonly enqueuedNamespaces: number
  readonly enqueuedProjects: number
  readonly duplicates: number
  readonly invalidMembers: number
}

type Summary = RescheduleStuckIssueRebalancesSummary

const NAME = "reschedule-stuck-issue-rebalances"
// A read of a small set, two primary-key look-ups and two pushes: minutes would mean trouble.
const BUDGET = Duration.minutes(5)

const run = Effect.fn("RescheduleStuckIssueRebalances.run")(function*() {
  const records = yield* PlatformRecords
  const { dryRun } = yield* CurrentRun

  const state = yield* RebalancingState
  const { namespaceIds, projectIds, invalidMembers, invalidSample } = R.parseRunningRebalances(
    yield* state.runningMembers
  )
  if (invalidMembers > 0) {
    yield* Effect.logWarning("Ignoring invalid running-rebalance members").pipe(
      Effect.annotateLogs({ invalid_members: invalidMembers, sample: invalidSample })
    )
    if (!dryRun) yield* M.increment(M.issueRebalancesInvalidMembersTotal, invalidMembers)
  }
  const read = { namespaceIds, projectIds, invalidMembers }
  if (namespaceIds.length === 0 && projectIds.length === 0) {
    yield* Effect.logDebug("No issue rebalances running")
    return { ...read, ...R.enqueuedCounts(undefined, 0), duplicates: 0, ...NOT_HELD } satisfies Summary
  }

  const existing = {
    namespaces: yield* records.existingNamespaceIds(namespaceIds),
    projects: yield* records.existingProjectIds(projectIds)
  }
  const gone = R.goneContainers({ namespaceIds, projectIds }, existing)
  if (gone.namespace_ids.length > 0 || gone.project_ids.length > 0) {
    yield* Effect.logInfo("Not rescheduling rebalances of deleted containers").pipe(Effect.annotateLogs(gone))
  }

  // Two units, namespaces then projects, each one bulk push (its events first) behind the fence.
  let duplicates = 0
  const { totals: { enqueuedNamespaces, enqueuedProjects }, heldMs, heldBy } = yield* each({
    batch: NAME,
    budget: BUDGET,
    initial: R.enqueuedCounts(undefined, 0),
    inputs: R.rebalanceUnits(existing),
    unit: {
      // Re-read right before the push: a rebalance that finished during a gate hold is not pushed.
      plan: ({ ids, type }) => Effect.map(state.runningMembers, (members) => R.stillRunning(type, ids, members)),
      target: ({ type, id }) => `rebalance:${type}/${id}`,
      propose: R.rebalanceProposal,
      dry: (targets) => R.enqueuedCounts(targets[0]?.type, targets.length),
      write: (targets, commit) =>
        Effect.gen(function*() {
          const { type } = targets[0]!
          const jobs = yield* (yield* RebalanceReschedule).reschedule(type, targets.map(({ id }) => id))
          duplicates += jobs.duplicates
          yield* M.incrementEach([[M.issueRebalancesRescheduledTotal, jobs.enqueued], [
            M.issueRebalancesDuplicatesTotal,
            jobs.duplicates
          ]], { type: R.rebalanceTypeName(type) })
          yield* commit(R.enqueuedCounts(type, jobs.enqueued))
        })
    }
  })
  const fields = { namespace_ids: existing.namespaces, project_ids: existing.projects, invalid_members: invalidMembers }
  const counts = { enqueued_namespaces: enqueuedNamespaces, enqueued_projects: enqueuedProjects, duplicates }
  const message = dryRun ? "Would reschedule stuck issue rebalances (dry run)" : "Rescheduled stuck issue rebalances"
  yield* Effect.logInfo(message).pipe(Effect.annotateLogs({ ...fields, ...counts }))
  return { ...read, enqueuedNamespaces, enqueuedProjects, duplicates, heldMs, heldBy } satisfies Summary
})

export const RescheduleStuckIssueRebalances = {
  name: NAME,
  worker: "Issues::RescheduleStuckIssueRebalancesWorker",
  description: "Re-enqueues Issues::RebalancingWorker for issue rebalances still marked running in Redis",
  cron: "*/15 * * * *",
  budget: BUDGET,
  // No overlapping runs, including scheduled ones.
  lease: Option.some({ name: "sweeper/reschedule_stuck_issue_rebalances", ttl: Duration.minutes(6) }),
  // Pushes Issues::RebalancingWorker (Queues) with its duplicate-job keys (QueuesMetadata).
  writes: { tables: ["sweeper_events"], redisStores: ["queues", "queuesMetadata"], queues: [R.REBALANCING_QUEUE] },
  repairedCounts: ["enqueuedNamespaces", "enqueuedProjects"],
  run: run(),
  backlog: rescheduleStuckIssueRebalancesBacklog
} satisfies Batch<RescheduleStuckIssueRebalancesSummary, unknown, unknown>
