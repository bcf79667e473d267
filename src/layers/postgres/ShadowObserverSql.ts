/**
 * ShadowObserver over GitLab's databases and the pending-uploads hash. Every read is by a
 * candidate's own key (a primary key, a hash field), or bounded through an index GitLab has:
 * `p_ci_builds_status_created_at_project_id_idx` (status, created_at, project_id) WHERE type =
 * 'Ci::Build' for failed builds, `index_project_export_jobs_on_status` for failed export jobs.
 */
import { PgClient } from "@effect/sql-pg"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as SqlClient from "effect/sql/SqlClient"
import { resumedJobWorker } from "../../domain/ConcurrencyLimit.ts"
import { ExportJobStatus } from "../../domain/ExportJob.ts"
import {
  LEGACY_REBALANCING_QUEUE,
  LEGACY_REBALANCING_WORKER,
  parseRunningRebalances,
  RebalanceContainer,
  REBALANCING_QUEUE,
  REBALANCING_WORKER,
  rebalancingWorkerArgs,
  rescheduledRebalance
} from "../../domain/Rebalancing.ts"
import type { BuildReading, ExportJobReading } from "../../domain/Shadow.ts"
import { ConcurrencyLimits } from "../../services/ConcurrencyLimits.ts"
import { JobQueue } from "../../services/JobQueue.ts"
import { PendingDirectUploads } from "../../services/PendingDirectUploads.ts"
import { RebalancingState } from "../../services/RebalancingState.ts"
import { ShadowObserver } from "../../services/ShadowObserver.ts"
import { CiDatabase } from "./Databases.ts"
import { detectBuildsTable } from "./DatabaseSchema.ts"

export const ShadowObserverSql = Layer.effect(
  ShadowObserver,
  Effect.gen(function*() {
    const main = yield* PgClient.PgClient
    const ci = (yield* CiDatabase).sql
    const pending = yield* PendingDirectUploads
    const rebalancing = yield* RebalancingState
    const jobQueue = yield* JobQueue
    const limits = yield* ConcurrencyLimits
    const buildsTable = Effect.provideService(detectBuildsTable, SqlClient.SqlClient, ci)

    return ShadowObserver.of({
      builds: (ids) =>
        Effect.gen(function*() {
          if (ids.length === 0) return new Map()
          const table = yield* buildsTable
          const rows = yield* ci<{ id: string; status: string; failure_reason: number | null; updated_at: Date }>`
            SELECT id, status, failure_reason, updated_at FROM ${ci(table.name)} WHERE id IN ${ci.in(ids)}`
          return new Map(rows.map((row): [number, BuildReading] => [Number(row.id), {
            status: row.status,
            failureReason: row.failure_reason === null ? null : Number(row.failure_reason),
            updatedAt: row.updated_at
          }]))
        }),
      exportJobs: (ids) =>
        Effect.gen(function*() {
          if (ids.length === 0) return new Map()
          const rows = yield* main<{ id: string; status: number; jid: string }>`
            SELECT id, status, jid FROM project_export_jobs WHERE id IN ${main.in(ids)}`
          return new Map(
            rows.map((
              row
            ): [number, ExportJobReading] => [Number(row.id), { status: Number(row.status), jid: row.jid }])
          )
        }),
      uploadValues: (fields) =>
        fields.length === 0 ? Effect.succeed([]) : Effect.map(
          pending.values(fields.map((field) => Buffer.from(field, "base64"))),
          (values) => values.map((value) => value === null ? null : Buffer.from(value).toString("base64"))
        ),
      failedBuilds: ({ bound, createdSince, reasons, since }) =>
        Effect.gen(function*() {
          const table = yield* buildsTable
          // The newest `bound` failed builds by created_at (the index's order), then the filter: the
          // read stops at `bound` rows whatever the filter keeps.
          const rows = yield* ci<
            { id: string; failure_reason: number; finished_at: Date | null; started_at: Date | null; n: string }
          >`
            SELECT id, failure_reason, finished_at, started_at, count(*) OVER () AS n FROM (
              SELECT id, failure_reason, finished_at, started_at, updated_at FROM ${ci(table.name)}
              WHERE status = 'failed' AND type = 'Ci::Build' AND created_at >= ${createdSince}
              ORDER BY created_at DESC LIMIT ${bound}
            ) recent
            WHERE failure_reason IN ${ci.in(reasons)} AND coalesce(finished_at, updated_at) >= ${since}`
          const scanned = yield* ci<{ n: string }>`SELECT count(*) AS n FROM (
              SELECT 1 FROM ${ci(table.name)}
              WHERE status = 'failed' AND type = 'Ci::Build' AND created_at >= ${createdSince}
              LIMIT ${bound}) r`
          return {
            found: rows.map((row) => ({
              id: Number(row.id),
              status: "failed",
              failureReason: Number(row.failure_reason),
              startedAt: row.started_at,
              at: row.finished_at ?? since
            })),
            bounded: Number(scanned[0]?.n ?? 0) >= bound
          }
        }),
      failedExportJobs: ({ bound, since }) =>
        Effect.gen(function*() {
          const rows = yield* main<{ id: string; updated_at: Date }>`SELECT id, updated_at FROM project_export_jobs
            WHERE status = ${ExportJobStatus.failed} AND updated_at >= ${since} LIMIT ${bound + 1}`
          return {
            found: rows.slice(0, bound).map((row) => ({
              id: Number(row.id),
              status: ExportJobStatus.failed,
              at: row.updated_at
            })),
            bounded: rows.length > bound
          }
        }),
      rebalances: (containers) =>
        Effect.gen(function*() {
          if (containers.length === 0) return []
          const running = parseRunningRebalances(yield* rebalancing.runningMembers)
          return yield* Effect.forEach(containers, ({ id, type }) =>
            Effect.gen(function*() {
              const args = rebalancingWorkerArgs(type, id)
              return {
                running: (type === RebalanceContainer.namespace ? running.namespaceIds : running.projectIds)
                  .includes(id),
                finished: yield* rebalancing.recentlyFinished(type, id),
                job: yield* jobQueue.claimHolder(REBALANCING_QUEUE, REBALANCING_WORKER, args),
                legacyJob: yield* jobQueue.claimHolder(LEGACY_REBALANCING_QUEUE, LEGACY_REBALANCING_WORKER, args)
              }
            }))
        }),
      rescheduledRebalances: (bound) =>
        Effect.map(jobQueue.peek(REBALANCING_QUEUE, bound + 1), (jobs) => ({
          found: jobs.slice(0, bound).flatMap((job) => Option.toArray(rescheduledRebalance(job))),
          bounded: jobs.length > bound
        })),
      deferredHeads: (requests) =>
        Effect.forEach(requests, ({ count, worker }) =>
          Effect.gen(function*() {
            const setting = yield* limits.limitOf(worker)
            return {
              head: yield* limits.deferredDigests(worker, count),
              length: yield* limits.queueSize(worker),
              limit: Option.match(setting, { onNone: () => null, onSome: (found) => found.limit })
            }
          })),
      resumedByGitLab: (bound) =>
        Effect.gen(function*() {
          let bounded = false
          const found: Array<{ readonly worker: string; readonly jobs: number }> = []
          for (const worker of yield* limits.workersWithDeferredJobs) {
            // A worker whose keys hold the wrong type is the batch's to report, not the observer's.
            const setting = yield* Effect.catchTag(limits.limitOf(worker), "WrongTypeKey", () =>
              Effect.succeed(Option.none()))
            if (Option.isNone(setting)) {
              continue
            }
            const jobs = yield* jobQueue.peek(setting.value.queue, bound + 1)
            bounded ||= jobs.length > bound
            const resumed = jobs.slice(0, bound).filter((job) =>
              Option.getOrNull(resumedJobWorker(job)) === worker
            ).length
            if (resumed > 0) {
              found.push({ worker, jobs: resumed })
            }
          }
          return { found, bounded }
        })
    })
  })
)
