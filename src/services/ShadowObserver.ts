/**
 * What shadow mode reads back of GitLab's state to judge its proposals: each candidate's own row
 * or key (by primary key, by hash field), and, bounded per run, what GitLab's workers repaired
 * through indexes GitLab already has. Only reads.
 */
import * as Context from "effect/Context"
import type * as Effect from "effect/Effect"
import type { BuildReading, ExportJobReading } from "../domain/Shadow.ts"

/** A repair found in GitLab's tables, with what it wrote. */
export interface FoundRepair {
  readonly id: number
  readonly status: string | number
  readonly failureReason?: number | null
  readonly startedAt?: Date | null
  readonly at: Date
}

export interface FoundRepairs {
  readonly found: ReadonlyArray<FoundRepair>
  /** The read stopped at its bound: there may be more (the count is a lower bound, a sample). */
  readonly bounded: boolean
}

export class ShadowObserver extends Context.Service<ShadowObserver, {
  /** Builds by id (primary key): absent from the map when the row is gone. */
  readonly builds: (ids: ReadonlyArray<number>) => Effect.Effect<ReadonlyMap<number, BuildReading>, unknown>
  /** Export jobs by id (primary key). */
  readonly exportJobs: (ids: ReadonlyArray<number>) => Effect.Effect<ReadonlyMap<number, ExportJobReading>, unknown>
  /** pending_direct_uploads values of these fields (base64 bytes), null when gone (HMGET). */
  readonly uploadValues: (fields: ReadonlyArray<string>) => Effect.Effect<ReadonlyArray<string | null>, unknown>
  /**
   * Builds failed with one of `reasons` and finished since `since`, read among the newest `bound`
   * failed builds created since `createdSince` (GitLab's index on status, created_at, project_id).
   */
  readonly failedBuilds: (options: {
    readonly reasons: ReadonlyArray<number>
    readonly since: Date
    readonly createdSince: Date
    readonly bound: number
  }) => Effect.Effect<FoundRepairs, unknown>
  /** Export jobs failed (status 3) and updated since `since`, at most `bound` (GitLab's index on status). */
  readonly failedExportJobs: (
    options: { readonly since: Date; readonly bound: number }
  ) => Effect.Effect<FoundRepairs, unknown>
}>()("sweeper/services/ShadowObserver") {}
