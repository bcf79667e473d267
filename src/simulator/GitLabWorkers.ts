/**
 * GitLab's own cron workers, as the simulated GitLab runs them beside a Sweeper in shadow mode: they
 * repair what they find by GitLab's rules, so a shadow batch's proposals get their verdicts the way
 * they would on a real instance.
 *
 * - `Ci::StuckBuilds::DropCancelingWorker` (hourly, at :45 of StuckCiJobsWorker's hour): builds in
 *   `canceling` not updated for an hour, read in id order in batches of 100 from the head each time
 *   (GitLab's `loop { relation.limit(100).each { drop } }`), each dropped as GitLab's drop ends a
 *   canceling build (`canceled` on GitLab 19, `failed`/stuck_or_timeout_failure before). A build
 *   whose drop is refused each time stays at the head, so GitLab's loop reads it again and again
 *   and never gets past it (https://gitlab.com/gitlab-org/gitlab/-/issues/590004): it and every
 *   build behind it stay stuck until the worker's time runs out. Sweeper's keyset walk passes such
 *   a row; its proposals for the builds behind it are the sweeperOnly verdicts worth explaining.
 * - `StuckExportJobsWorker` (`30 * * * *`): export jobs `queued` or `started` whose jid's Sidekiq
 *   status key is gone are failed, except a parallel export (one with relation exports) still
 *   inside EXPORT_JOBS_EXPIRATION of its creation.
 * - `StuckCiJobsWorker`'s `DropPendingService`, `DropRunningWorker`, `DropScheduledWorker` (hourly):
 *   pending builds created and updated a day ago, running ones an hour ago, scheduled ones whose
 *   scheduled_at passed an hour ago, failed with the rule's reason under the set in force. (The
 *   pending-stuck rule, which asks whether an online runner could take the build, is not played.)
 * - `ObjectStorage::DeleteStaleDirectUploadsWorker` (`*` + `/6 * * * *`): every entry of
 *   `pending_direct_uploads` older than STALE_AFTER removed (the simulator's objects are left: the
 *   shadow verdict reads the entry).
 * - `Issues::RescheduleStuckIssueRebalancesWorker` (`*` + `/15 * * * *`): every member of the running set,
 *   read as GitLab reads it (`split('/', 2).map(&:to_i)`: "1/09" is namespace 9), whose container
 *   exists gets an `Issues::RebalancingWorker` job (until_executed, `meta.caller_id` the worker's).
 * - `ConcurrencyLimit::ResumeWorker` (every minute, each worker again 1 s later while jobs remain):
 *   per limited worker, limit − executing jobs (1000 when unlimited, none when the breaker is open)
 *   taken from the head of the deferred list and pushed to the worker's queue, marked resumed.
 */
import { PgClient } from "@effect/sql-pg"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Result from "effect/Result"
import * as Stream from "effect/Stream"
import { GITLAB_RESUME_BATCH, parseDeferred, parseLimitOverride, workerKeys } from "../domain/ConcurrencyLimit.ts"
import { parseEntry, PENDING_DIRECT_UPLOADS_KEY, STALE_AFTER } from "../domain/DirectUpload.ts"
import { ENQUEUED_STATUSES, EXPORT_JOBS_EXPIRATION, ExportJobStatus } from "../domain/ExportJob.ts"
import {
  RebalanceContainer,
  REBALANCING_QUEUE,
  REBALANCING_WORKER,
  rebalancingWorkerArgs,
  RESCHEDULE_WORKER,
  RUNNING_REBALANCES_KEY
} from "../domain/Rebalancing.ts"
import { newJid, queueKey } from "../domain/Sidekiq.ts"
import {
  cancelingEnd,
  CurrentFailureReasonSet,
  PENDING_OUTDATED,
  reasonCodeOf,
  RUNNING_OUTDATED,
  SCHEDULED_OUTDATED
} from "../domain/StuckBuilds.ts"
import { JobQueue } from "../services/JobQueue.ts"
import { JobStatus } from "../services/JobStatus.ts"
import { PendingDirectUploads } from "../services/PendingDirectUploads.ts"
import { PlatformRecords } from "../services/PlatformRecords.ts"
import { buildsTable, ciClient } from "./Seed.ts"
import { SimulatorStores } from "./Stores.ts"

/** GitLab's cutoff for a canceling build (DropCancelingService's `updated_before(1.hour.ago)`). */
export const GITLAB_CANCELING_TIMEOUT = Duration.hours(1)
/** DropCancelingService's batch. */
const GITLAB_DROP_BATCH = 100
/** How many times GitLab's loop reads the head before its time runs out (its runtime limiter). */
const GITLAB_LOOP_ROUNDS = 50

/**
 * The builds GitLab's drop refuses every time (a transition that raises, a row a validation
 * rejects): the simulator picks them, GitLab's worker cannot drop them.
 */
export class RefusedDrops extends Context.Reference<ReadonlySet<number>>("sweeper/simulator/RefusedDrops", {
  defaultValue: () => new Set<number>()
}) {}

const utc = (millis: number) => new Date(millis).toISOString().replace("T", " ").replace("Z", "")

/** One run of GitLab's DropCancelingWorker at `nowMillis`; returns the builds it dropped. */
export const gitlabDropCanceling = Effect.fn("GitLab.dropCanceling")(function*(nowMillis: number) {
  const sql = yield* ciClient
  const table = yield* buildsTable()
  const refused = yield* RefusedDrops
  const end = cancelingEnd(yield* CurrentFailureReasonSet)
  const cutoff = utc(nowMillis - Duration.toMillis(GITLAB_CANCELING_TIMEOUT))
  const dropped: Array<number> = []
  for (let round = 0; round < GITLAB_LOOP_ROUNDS; round++) {
    // Always from the head: GitLab's loop has no cursor, it relies on each drop taking its row out.
    const head = yield* sql<{ id: string }>`SELECT id FROM ${sql(table)}
      WHERE status = 'canceling' AND updated_at < ${cutoff}::timestamp ORDER BY id LIMIT ${GITLAB_DROP_BATCH}`
    if (head.length === 0) break
    for (const { id } of head) {
      // A refused drop raises inside `each`: the rest of the batch is not reached this round.
      if (refused.has(Number(id))) break
      yield* sql`UPDATE ${sql(table)} SET status = ${end.status},
        failure_reason = COALESCE(${end.written}::int, failure_reason), updated_at = ${utc(nowMillis)}::timestamp
        WHERE id = ${id} AND status = 'canceling'`
      dropped.push(Number(id))
    }
  }
  return dropped
})

/** One run of GitLab's StuckExportJobsWorker at `nowMillis`; returns the export jobs it failed. */
export const gitlabStuckExportJobs = Effect.fn("GitLab.stuckExportJobs")(function*(nowMillis: number) {
  // Export jobs are main's tables.
  const sql = yield* PgClient.PgClient
  const enqueued = yield* sql<{ id: string; jid: string }>`SELECT id, jid FROM project_export_jobs
    WHERE status IN ${sql.in(ENQUEUED_STATUSES)} AND jid IS NOT NULL ORDER BY id`
  if (enqueued.length === 0) return []
  const completed = new Set(yield* (yield* JobStatus).completedJids(enqueued.map((job) => job.jid)).pipe(Effect.orDie))
  const ids = enqueued.filter((job) => completed.has(job.jid)).map((job) => job.id)
  if (ids.length === 0) return []
  // Selected again by status (GitLab's guard against a job that moved meanwhile), parallel exports
  // in their grace left alone.
  const grace = new Date(nowMillis - Duration.toMillis(EXPORT_JOBS_EXPIRATION))
  const failed = yield* sql<{ id: string }>`UPDATE project_export_jobs j SET status = ${ExportJobStatus.failed},
      updated_at = ${new Date(nowMillis)}
    WHERE j.id IN ${sql.in(ids)} AND j.status IN ${sql.in(ENQUEUED_STATUSES)}
      AND (j.created_at < ${grace}
        OR NOT EXISTS (SELECT 1 FROM project_relation_exports r WHERE r.project_export_job_id = j.id))
    RETURNING j.id`
  return failed.map((row) => Number(row.id))
})

/** One run of StuckCiJobsWorker's drops (pending outdated, running, scheduled); returns the builds it failed. */
export const gitlabStuckCiJobs = Effect.fn("GitLab.stuckCiJobs")(function*(nowMillis: number) {
  const sql = yield* ciClient
  const table = yield* buildsTable()
  const set = yield* CurrentFailureReasonSet
  const failed: Array<number> = []
  for (const rule of [PENDING_OUTDATED, RUNNING_OUTDATED, SCHEDULED_OUTDATED]) {
    const reason = yield* reasonCodeOf(rule, set)
    const cutoff = utc(nowMillis - Duration.toMillis(rule.timeout))
    const old = rule.timestamps === "scheduled_at"
      ? sql`scheduled_at < ${cutoff}::timestamp`
      : sql`created_at < ${cutoff}::timestamp AND updated_at < ${cutoff}::timestamp`
    const rows = yield* sql<{ id: string }>`UPDATE ${sql(table)} SET status = 'failed', failure_reason = ${reason},
        updated_at = ${utc(nowMillis)}::timestamp, finished_at = ${utc(nowMillis)}::timestamp
      WHERE status = ${rule.status} AND ${old} RETURNING id`
    failed.push(...rows.map((row) => Number(row.id)))
  }
  return failed
})

/** One run of DeleteStaleDirectUploadsWorker; returns how many entries it removed. */
export const gitlabDeleteStaleDirectUploads = Effect.fn("GitLab.deleteStaleDirectUploads")(
  function*(nowMillis: number) {
    const stores = yield* SimulatorStores
    const entries = yield* Stream.runCollect((yield* PendingDirectUploads).scan()).pipe(Effect.orDie)
    const staleBefore = (nowMillis - Duration.toMillis(STALE_AFTER)) / 1000
    let removed = 0
    for (const raw of entries) {
      const entry = parseEntry(raw)
      if (Result.isFailure(entry) || entry.success.preparedAt >= staleBefore) continue
      yield* stores.hdel("sharedState", PENDING_DIRECT_UPLOADS_KEY, Buffer.from(raw.field).toString("utf8"))
      removed++
    }
    return removed
  }
)

/** One run of RescheduleStuckIssueRebalancesWorker; returns how many jobs it pushed. */
export const gitlabRescheduleStuckIssueRebalances = Effect.fn("GitLab.rescheduleStuckIssueRebalances")(function*() {
  const members = yield* (yield* SimulatorStores).smembers("sharedState", RUNNING_REBALANCES_KEY)
  // Ruby's `to_i`: the leading digits, 0 when none.
  const toI = (text: string) => Number(/^\d*/.exec(text)![0] || "0")
  const ids = (type: number) =>
    members.map((member) => member.split("/")).filter(([t]) => toI(t!) === type).map(([, id]) => toI(id ?? ""))
  const records = yield* PlatformRecords
  const namespaces = yield* records.existingNamespaceIds(ids(RebalanceContainer.namespace)).pipe(Effect.orDie)
  const projects = yield* records.existingProjectIds(ids(RebalanceContainer.project)).pipe(Effect.orDie)
  const args = [
    ...namespaces.map((id) => rebalancingWorkerArgs(RebalanceContainer.namespace, id)),
    ...projects.map((id) => rebalancingWorkerArgs(RebalanceContainer.project, id))
  ]
  if (args.length === 0) return 0
  const pushed = yield* (yield* JobQueue).bulkEnqueue({
    workerClass: REBALANCING_WORKER,
    queue: REBALANCING_QUEUE,
    args,
    deduplicate: "until_executed",
    extra: { "meta.caller_id": RESCHEDULE_WORKER }
  }).pipe(Effect.orDie)
  return pushed.filter((outcome) => outcome._tag === "Enqueued").length
})

/** One run of ConcurrencyLimit::ResumeWorker over `limited` workers; returns how many jobs it resumed. */
export const gitlabConcurrencyLimitResume = Effect.fn("GitLab.concurrencyLimitResume")(function*(
  limited: Readonly<Record<string, { readonly limit: number; readonly queue: string }>>,
  nowMillis: number
) {
  const stores = yield* SimulatorStores
  let resumed = 0
  for (const [worker, setting] of Object.entries(limited)) {
    const keys = workerKeys(worker)
    const override = yield* stores.get("queuesMetadata", keys.currentLimit)
    const limit = Option.getOrElse(
      override === null ? Option.none() : parseLimitOverride(override),
      () => setting.limit
    )
    if (limit < 0) continue
    // GitLab counts the jobs executing now (its trackers), not the slots Sweeper reserves.
    const executing = yield* stores.hlen("queuesMetadata", keys.executing)
    const capacity = limit > 0 ? limit - executing : GITLAB_RESUME_BATCH
    for (let i = 0; i < capacity; i++) {
      const raw = yield* stores.lpop("sharedState", keys.deferred)
      if (raw === null) break
      // GitLab's deserialize raises on an element that is no job: the simulator's GitLab drops it.
      const deferred = parseDeferred(raw)
      if (Option.isNone(deferred)) continue
      yield* stores.lpush(
        "queues",
        queueKey(setting.queue),
        JSON.stringify({
          class: worker,
          args: deferred.value.args,
          jid: yield* newJid,
          queue: setting.queue,
          created_at: nowMillis / 1000,
          enqueued_at: nowMillis / 1000,
          concurrency_limit_resume: true,
          concurrency_limit_buffered_at: deferred.value.buffered_at ?? null
        })
      )
      resumed++
    }
  }
  return resumed
})
