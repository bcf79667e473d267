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
 */
import { PgClient } from "@effect/sql-pg"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import { ENQUEUED_STATUSES, EXPORT_JOBS_EXPIRATION, ExportJobStatus } from "../domain/ExportJob.ts"
import { cancelingEnd, CurrentFailureReasonSet } from "../domain/StuckBuilds.ts"
import { JobStatus } from "../services/JobStatus.ts"
import { buildsTable, ciClient } from "./Seed.ts"

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
