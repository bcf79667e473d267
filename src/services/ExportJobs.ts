/** `project_export_jobs` as stuck-export-jobs needs it. The fail write appends its event in the same transaction. */
import * as Context from "effect/Context"
import type * as DateTime from "effect/DateTime"
import type * as Effect from "effect/Effect"
import type { SqlError } from "effect/sql/SqlError"
import type { FenceError } from "../domain/Errors.ts"
import type { EnqueuedExportJob, ExportJobRef } from "../domain/ExportJob.ts"

/**
 * What a slice write did: the jids it failed (by id), and the ids of the jobs it skipped because
 * another open transaction held their row. Every other job of the slice changed meanwhile.
 */
export interface FailManyResult {
  readonly failed: ReadonlyArray<string>
  readonly locked: ReadonlyArray<number>
}

export class ExportJobs extends Context.Service<ExportJobs, {
  /** (id, jid) of every queued or started job, by id. */
  listEnqueued: Effect.Effect<ReadonlyArray<ExportJobRef>, SqlError>
  /** The first `limit` of those (the same scan, stopped early): a bounded read for the backlog. */
  firstEnqueued(limit: number): Effect.Effect<ReadonlyArray<ExportJobRef>, SqlError>
  /** Those of `ids` still queued or started, as they are now, with their relation export counts, by id. */
  findEnqueued(ids: ReadonlyArray<number>): Effect.Effect<ReadonlyArray<EnqueuedExportJob>, SqlError>
  /**
   * status = failed, updated_at = now for every job of the slice in ONE transaction: one UPDATE, each
   * row guarded by status IN (queued, started) AND the jid read, and one multi-row INSERT of their
   * ExportJobFailed events. Returns the jids actually failed, by id; a row that changed meanwhile is
   * left out and nothing is written for it. A row another open transaction holds is never waited
   * for (a GitLab request updating the export, an operator's session): it is skipped, returned in
   * `locked`, left as it is, and found again by the next run.
   */
  failMany(
    jobs: ReadonlyArray<EnqueuedExportJob>,
    now: DateTime.Utc
  ): Effect.Effect<FailManyResult, SqlError | FenceError>
}>()("sweeper/services/ExportJobs") {}
