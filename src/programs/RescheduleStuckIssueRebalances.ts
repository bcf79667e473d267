/**
 * reschedule-stuck-issue-rebalances — port of GitLab's Issues::RescheduleStuckIssueRebalancesWorker
 * (seed: reschedule-stuck-issue-rebalances.ja.md, SPEC §4). Issue `relative_position` rebalances are
 * tracked in the Redis set `gitlab:issues-position-rebalances:running_rebalances`; a rebalance whose
 * Issues::RebalancingWorker job was lost (deploy, crash, Redis failover) stays in the set and never
 * finishes. Every 15 minutes this re-enqueues one Issues::RebalancingWorker per container still in
 * the set and still in the database: `[null, null, <namespace_id>]` for namespaces (type 1),
 * `[null, <project_id>, null]` for projects (type 2), one bulk push each.
 *
 * Re-enqueueing a rebalance that is in fact running is harmless: the worker is idempotent and the
 * jobs use `until_executed` de-duplication, so a job still pending for the same container is not
 * pushed twice (counted as `duplicates`). The batch also holds an exclusive lease so runs never
 * overlap (SPEC §4), and checks its fence before each push: a holder that lost the lease pushes
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
import { Duration, Effect, Option } from "effect"
import type { Batch } from "../domain/Batch.ts"
import { CurrentRun } from "../domain/Batch.ts"
import { RebalanceRescheduled } from "../domain/Events.ts"
import {
  parseRunningRebalances,
  REBALANCING_QUEUE,
  REBALANCING_WORKER,
  RebalanceContainer,
  type RebalanceType,
  rebalanceTypeName,
  rebalancingWorkerArgs
} from "../domain/Rebalancing.ts"
import { each, type Held, NOT_HELD } from "../runtime/RepairLoop.ts"
import { EventLog } from "../services/EventLog.ts"
import { JobQueue } from "../services/JobQueue.ts"
import {
  increment,
  issueRebalancesDuplicatesTotal,
  issueRebalancesInvalidMembersTotal,
  issueRebalancesRescheduledTotal
} from "../services/Metrics.ts"
import { PlatformRecords } from "../services/PlatformRecords.ts"
import { RebalancingState } from "../services/RebalancingState.ts"

export interface RescheduleStuckIssueRebalancesSummary extends Held {
  readonly namespaceIds: ReadonlyArray<number>
  readonly projectIds: ReadonlyArray<number>
  readonly enqueuedNamespaces: number
  readonly enqueuedProjects: number
  readonly duplicates: number
  readonly invalidMembers: number
}

/**
 * One bulk push of Issues::RebalancingWorker for the containers of one type, with one
 * RebalanceRescheduled event per container written *before* the push: the jids are chosen and the
 * de-duplication claims checked first, so each event already says what the push will do (a new job
 * and its jid, or a duplicate of the pending job). A crash between the events and the push leaves
 * events for a push that did not happen; the container is still in the running set (no job ran),
 * so the next run pushes and records it again — an extra event, never a push without one
 * (README, Failure handling).
 */
const reschedule = Effect.fnUntraced(function*(type: RebalanceType, ids: ReadonlyArray<number>) {
  const jobQueue = yield* JobQueue
  const events = yield* EventLog
  // Slices arrive in order: `recorded` is where the next slice starts in `ids`.
  let recorded = 0
  const outcomes = yield* jobQueue.bulkEnqueue({
    workerClass: REBALANCING_WORKER,
    queue: REBALANCING_QUEUE,
    args: ids.map((id) => rebalancingWorkerArgs(type, id)),
    deduplicate: "until_executed"
  }, (slice) => {
    const first = recorded
    recorded += slice.length
    return events.appendAll(slice.map((outcome, i) =>
      new RebalanceRescheduled({
        type,
        id: ids[first + i]!,
        jid: outcome._tag === "Duplicate" ? outcome.existingJid : outcome.jid,
        duplicate: outcome._tag === "Duplicate"
      })
    ))
  })
  const enqueued = outcomes.filter((outcome) => outcome._tag === "Enqueued").length
  const duplicates = ids.length - enqueued
  yield* increment(issueRebalancesRescheduledTotal, enqueued, { type: rebalanceTypeName(type) })
  yield* increment(issueRebalancesDuplicatesTotal, duplicates, { type: rebalanceTypeName(type) })
  return { enqueued, duplicates }
})

const NAME = "reschedule-stuck-issue-rebalances"
// A read of a small set, two primary-key look-ups and two pushes: minutes would mean trouble.
const BUDGET = Duration.minutes(5)
const enqueuedKey = (type: RebalanceType) => type === RebalanceContainer.namespace ? "enqueuedNamespaces" : "enqueuedProjects"

const run = Effect.fn("RescheduleStuckIssueRebalances.run")(function*() {
  const state = yield* RebalancingState
  const records = yield* PlatformRecords
  const { dryRun } = yield* CurrentRun

  const running = parseRunningRebalances(yield* state.runningMembers)
  const { namespaceIds, projectIds, invalidMembers } = running
  if (invalidMembers > 0) {
    yield* Effect.logWarning("Ignoring invalid running-rebalance members").pipe(Effect.annotateLogs({ invalid_members: invalidMembers, sample: running.invalidSample }))
    if (!dryRun) yield* increment(issueRebalancesInvalidMembersTotal, invalidMembers)
  }
  const found = { namespaceIds, projectIds, invalidMembers }
  if (namespaceIds.length === 0 && projectIds.length === 0) {
    yield* Effect.logDebug("No issue rebalances running")
    return { ...found, enqueuedNamespaces: 0, enqueuedProjects: 0, duplicates: 0, ...NOT_HELD } satisfies RescheduleStuckIssueRebalancesSummary
  }

  const namespaces = yield* records.existingNamespaceIds(namespaceIds)
  const projects = yield* records.existingProjectIds(projectIds)
  const gone = { namespace_ids: namespaceIds.filter((id) => !namespaces.includes(id)), project_ids: projectIds.filter((id) => !projects.includes(id)) }
  if (gone.namespace_ids.length > 0 || gone.project_ids.length > 0) yield* Effect.logInfo("Not rescheduling rebalances of deleted containers").pipe(Effect.annotateLogs(gone))

  // Two units, namespaces then projects, each one bulk push behind the fence.
  let duplicates = 0
  const { totals: { enqueuedNamespaces, enqueuedProjects }, heldMs, heldBy } = yield* each({
    batch: NAME, budget: BUDGET, initial: { enqueuedNamespaces: 0, enqueuedProjects: 0 },
    inputs: [{ type: RebalanceContainer.namespace, ids: namespaces }, { type: RebalanceContainer.project, ids: projects }],
    unit: {
      plan: ({ type, ids }) => Effect.succeed(ids.map((id) => ({ type, id }))),
      target: ({ type, id }) => `rebalance:${type}/${id}`,
      dry: (targets) => ({ enqueuedNamespaces: 0, enqueuedProjects: 0, [enqueuedKey(targets[0]!.type)]: targets.length }),
      write: (targets, commit) => Effect.gen(function*() {
        const jobs = yield* reschedule(targets[0]!.type, targets.map(({ id }) => id))
        duplicates += jobs.duplicates
        yield* commit({ enqueuedNamespaces: 0, enqueuedProjects: 0, [enqueuedKey(targets[0]!.type)]: jobs.enqueued })
      })
    }
  })
  const result = { ...found, enqueuedNamespaces, enqueuedProjects, duplicates, heldMs, heldBy } satisfies RescheduleStuckIssueRebalancesSummary
  const fields = { namespace_ids: namespaces, project_ids: projects }
  if (dryRun) yield* Effect.logInfo("Would reschedule stuck issue rebalances (dry run)").pipe(Effect.annotateLogs({ ...fields, invalid_members: invalidMembers }))
  else yield* Effect.logInfo("Rescheduled stuck issue rebalances").pipe(Effect.annotateLogs({ ...fields, enqueued_namespaces: enqueuedNamespaces, enqueued_projects: enqueuedProjects, duplicates, invalid_members: invalidMembers }))
  return result
})

export const RescheduleStuckIssueRebalances = {
  name: NAME,
  worker: "Issues::RescheduleStuckIssueRebalancesWorker",
  description: "Re-enqueues Issues::RebalancingWorker for issue rebalances still marked running in Redis",
  cron: "*/15 * * * *",
  budget: BUDGET,
  // No overlapping runs, including scheduled ones (SPEC §4).
  lease: Option.some({ name: "sweeper/reschedule_stuck_issue_rebalances", ttl: Duration.minutes(6) }),
  // Pushes Issues::RebalancingWorker (Queues) with its duplicate-job keys (QueuesMetadata).
  writes: { tables: ["sweeper_events"], redisStores: ["queues", "queuesMetadata"], queues: [REBALANCING_QUEUE] },
  run: run()
} satisfies Batch<RescheduleStuckIssueRebalancesSummary, unknown, unknown>
