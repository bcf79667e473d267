/** `ci_builds` as drop-canceling-builds needs it. Writes append their event in the same transaction. */
import * as Context from "effect/Context"
import type * as DateTime from "effect/DateTime"
import type * as Effect from "effect/Effect"
import type * as Option from "effect/Option"
import type { SqlError } from "effect/sql/SqlError"
import type { BuildCursor, BuildKey, CancelingBuild, DropOutcome } from "../domain/Build.ts"
import type { FenceError, RowLocked } from "../domain/Errors.ts"

/**
 * What a page write did: the builds it dropped, and those it skipped because another open
 * transaction held their row (`FOR UPDATE`, or an uncommitted write). Both as given, in page
 * order; every other build of the page lost a race (its row changed since it was read).
 */
export interface DropManyResult {
  readonly dropped: ReadonlyArray<CancelingBuild>
  readonly locked: ReadonlyArray<CancelingBuild>
}

export class Builds extends Context.Service<Builds, {
  /** Canceling `Ci::Build`s with created_at and updated_at both < cutoff, keyset after `after`. */
  findStuckCanceling(options: {
    readonly cutoff: DateTime.Utc
    readonly after: Option.Option<BuildCursor>
    readonly limit: number
  }): Effect.Effect<ReadonlyArray<CancelingBuild>, SqlError>
  /** Re-reads one build by its key (id, and partition_id on p_ci_builds). */
  find(key: BuildKey): Effect.Effect<Option.Option<CancelingBuild>, SqlError>
  /**
   * failed / stuck_or_timeout_failure, guarded by status = 'canceling' AND the lock_version read.
   * False on a lock conflict (the row changed since it was read), nothing written. Never waits for
   * a row another transaction holds: fails with RowLocked instead, nothing written.
   */
  drop(build: CancelingBuild, now: DateTime.Utc): Effect.Effect<boolean, SqlError | FenceError | RowLocked>
  /**
   * `drop` for a whole page in one fenced transaction: one guarded UPDATE (each row's own
   * status = 'canceling' AND lock_version as read), one INSERT of the dropped rows' events (on
   * PostgreSQL all of it one statement).
   * Returns the builds it dropped and those it skipped as locked; the others lost a race and were
   * left unchanged. Why skip: a row held by another open transaction would make the page wait for
   * that transaction, however long (measured: 10 locked rows of 1,000 stalled the run until its
   * hard timeout, and every later run at the same page). Skipped rows are left as they are, get no
   * event, and are found again by the next run once the lock is gone.
   */
  dropMany(
    builds: ReadonlyArray<CancelingBuild>,
    now: DateTime.Utc
  ): Effect.Effect<DropManyResult, SqlError | FenceError>
  /**
   * Walks the canceling scan's index from `after` — the start of builds this run has already
   * failed and committed — to the first build still stuck, and reads nothing back. Why: a failed
   * build leaves a dead entry in the index the scan uses until VACUUM, and the first scan to meet it
   * pays a heap fetch for it. Walking a page's entries just after its commit, while its heap pages
   * are hot (and dirty anyway), lets PostgreSQL mark them dead in the index, so the next run's scan
   * skips them instead of fetching 100 k dead rows (measured: BENCHMARKS.md). Backends without such
   * an index do nothing.
   */
  revisitWritten(from: {
    readonly cutoff: DateTime.Utc
    readonly after: Option.Option<BuildCursor>
  }): Effect.Effect<void, SqlError>
  /** failed / data_integrity_failure, guarded by status = 'canceling' only; RowLocked as `drop`. */
  doom(build: CancelingBuild, now: DateTime.Utc): Effect.Effect<boolean, SqlError | FenceError | RowLocked>
  /**
   * A build that lost the race in `dropMany` (attempt 1): re-read, retried on its own with the
   * re-read row (`drop`), doomed (`doom`) when MAX_DROP_ATTEMPTS run out — so a row that keeps
   * changing cannot stay stuck forever; "changed_meanwhile" once it is no longer stuck; "locked"
   * when another open transaction holds its row (never waited for, never doomed: the next run
   * finds it again). One rule for every backend (repair/DropRetry.ts); `now` is the run's decision
   * time.
   */
  retryOrDoom(lost: CancelingBuild, now: DateTime.Utc): Effect.Effect<DropOutcome, SqlError | FenceError>
}>()("sweeper/services/Builds") {}
