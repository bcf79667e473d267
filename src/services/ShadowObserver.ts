/**
 * What shadow mode reads back of GitLab's state to judge its proposals: each candidate's own row
 * or key (by primary key, by hash field), and, bounded per run, what GitLab's workers repaired
 * through indexes GitLab already has. Only reads.
 */
import * as Context from "effect/Context"
import type * as Effect from "effect/Effect"
import type { DeferredReading } from "../domain/ConcurrencyLimit.ts"
import type { RebalanceReading, RebalanceType } from "../domain/Rebalancing.ts"
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
  /**
   * Each rebalance's own keys: its member of the running set (one SMEMBERS of a set of at most a
   * few), GitLab's `recently_finished` mark, and the until_executed claims of the job Sweeper would
   * push and of the legacy one (a GET each).
   */
  readonly rebalances: (
    containers: ReadonlyArray<{ readonly type: RebalanceType; readonly id: number }>
  ) => Effect.Effect<ReadonlyArray<RebalanceReading>, unknown>
  /**
   * The containers of the jobs GitLab's reschedule worker pushed that are still waiting in
   * `queue:issues_rebalancing` (their `meta.caller_id`), among its first `bound` jobs.
   */
  readonly rescheduledRebalances: (bound: number) => Effect.Effect<
    { readonly found: ReadonlyArray<{ readonly type: RebalanceType; readonly id: number }>; readonly bounded: boolean },
    unknown
  >
  /**
   * Each worker's deferred list: digests of its first `count` elements (LRANGE, bounded by the
   * proposal), its length and the worker's limit now.
   */
  readonly deferredHeads: (
    requests: ReadonlyArray<{ readonly worker: string; readonly count: number }>
  ) => Effect.Effect<ReadonlyArray<DeferredReading>, unknown>
  /**
   * Workers whose Sidekiq queue holds jobs a concurrency-limit resume pushed (GitLab's, in shadow
   * mode: Sweeper pushes none), among the first `bound` jobs of each known worker's queue.
   */
  readonly resumedByGitLab: (bound: number) => Effect.Effect<
    { readonly found: ReadonlyArray<{ readonly worker: string; readonly jobs: number }>; readonly bounded: boolean },
    unknown
  >
}>()("sweeper/services/ShadowObserver") {}
