/** CI builds (`ci_builds`) as drop-canceling-builds sees them. */
import * as Context from "effect/Context"
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"

/** A build in `canceling` whose created_at and updated_at are both older than this is stuck. */
export const CANCELING_TIMEOUT = Duration.hours(1)
/** The seed's page size: builds read, and repaired in one transaction, at a time. */
export const DROP_BATCH_SIZE = 100
/** Bounds of `SWEEPER_DROP_BATCH_SIZE`: a page is one UPDATE and one INSERT, kept to a sane size. */
export const DROP_BATCH_SIZE_MAX = 10_000

/**
 * The page size drop-canceling-builds runs with (`SWEEPER_DROP_BATCH_SIZE`); the composition root
 * provides it from configuration, a program run bare sees the seed's 100.
 */
export const DropBatchSize = Context.Reference<number>("sweeper/domain/Build/DropBatchSize", {
  defaultValue: () => DROP_BATCH_SIZE
})
/**
 * Optimistic-lock retries after a build's first drop attempt lost its race: GitLab drops with
 * `Gitlab::OptimisticLocking.retry_lock(build, 3)`, which re-reads and retries while
 * `retry_attempts < max_retries`, i.e. one attempt plus three retries.
 */
export const DROP_LOCK_RETRIES = 3
/** Drop attempts in all (the first plus `DROP_LOCK_RETRIES`) before a build is doomed instead. */
export const MAX_DROP_ATTEMPTS = 1 + DROP_LOCK_RETRIES

/**
 * What became of a build that lost the race in its page's write (`Builds.retryOrDoom`); "locked":
 * another open transaction held its row, so it was skipped, not waited for and never doomed.
 */
export type DropOutcome = "dropped" | "doomed" | "changed_meanwhile" | "locked"

/** What a build retried on its own adds to the run's counts: a drop or a doom (changed or locked: nothing). */
export const retriedCounts = (outcome: DropOutcome) => ({
  dropped: outcome === "dropped" ? 1 : 0,
  doomed: outcome === "doomed" ? 1 : 0
})

/**
 * The seed's "Dropping outdated build" line, as the message's structured value rather than
 * annotations: the JSON line is the same (supervisor/Logging.ts flattens both), and a page of 1000 logs
 * in ≈ 2 ms instead of ≈ 10–25 ms (measured), most of which went to setting annotations per line.
 */
export const DROPPING_MESSAGE = "Dropping outdated build"
export const droppingFields = (build: CancelingBuild, attempt: number) => ({
  build_id: build.id,
  runner_id: build.runnerId,
  status: build.status,
  failure_reason: "stuck_or_timeout_failure",
  attempt
})

/**
 * A page's "Dropping outdated build" lines as one line: GitLab's fields of every build (its id,
 * runner and status, in page order) under `builds`, the reason and attempt once. Logging them one
 * line per build cost about a third of a 100,000-build run (32 MB of JSON through the logger) for
 * nothing a page's line does not say; a retried build (attempt ≥ 2) still gets its own line.
 */
export const droppingPageFields = (builds: ReadonlyArray<CancelingBuild>) => ({
  failure_reason: "stuck_or_timeout_failure",
  attempt: 1,
  count: builds.length,
  builds: builds.map((build) => ({ build_id: build.id, runner_id: build.runnerId, status: build.status }))
})

export const FailureReason = {
  stuck_or_timeout_failure: 3,
  data_integrity_failure: 12
} as const

export const BUILD_STATUSES = [
  "created",
  "pending",
  "running",
  "success",
  "failed",
  "canceling",
  "canceled",
  "skipped",
  "manual",
  "scheduled",
  "preparing",
  "waiting_for_resource",
  "waiting_for_callback"
] as const
export type BuildStatus = typeof BUILD_STATUSES[number]

/**
 * What names one build: its id, and on GitLab's partitioned `p_ci_builds` (primary key
 * `(id, partition_id)`) its partition too. Absent on a plain `ci_builds`.
 */
export interface BuildKey {
  readonly id: number
  readonly partitionId?: number | undefined
}

export interface CancelingBuild extends BuildKey {
  readonly projectId: number
  readonly runnerId: number | null
  /** Its pipeline (GitLab's commit_id), when the backend reads it. */
  readonly pipelineId?: number | null | undefined
  readonly status: string
  readonly lockVersion: number
  readonly createdAt: DateTime.Utc
  readonly updatedAt: DateTime.Utc
  /**
   * created_at exactly as stored, when the store is finer than a DateTime: GitLab's timestamps have
   * microseconds, a DateTime milliseconds. The keyset cursor must use it, or a page ending inside a
   * millisecond would be read again (and a dry run, which changes nothing, would never advance).
   */
  readonly createdAtExact?: string | undefined
}

/**
 * Keyset position in (created_at, project_id, id[, partition_id]) order: the primary key breaks ties
 * so no row is read twice (on `p_ci_builds` the key is (id, partition_id)).
 */
export interface BuildCursor {
  readonly createdAt: DateTime.Utc
  readonly projectId: number
  readonly id: number
  readonly partitionId?: number | undefined
  /** See CancelingBuild.createdAtExact. */
  readonly createdAtExact?: string | undefined
}

export const cursorOf = (build: CancelingBuild): BuildCursor => ({
  createdAt: build.createdAt,
  projectId: build.projectId,
  id: build.id,
  partitionId: build.partitionId,
  createdAtExact: build.createdAtExact
})

/** Everything strictly before this instant is "older than" the timeout. */
export const cancelingCutoff = (now: DateTime.Utc): DateTime.Utc => DateTime.subtractDuration(now, CANCELING_TIMEOUT)

export const isStuckCanceling = (
  build: Pick<CancelingBuild, "status" | "createdAt" | "updatedAt">,
  now: DateTime.Utc
) => {
  const cutoff = cancelingCutoff(now)
  return build.status === "canceling" && DateTime.isLessThan(build.createdAt, cutoff) &&
    DateTime.isLessThan(build.updatedAt, cutoff)
}
