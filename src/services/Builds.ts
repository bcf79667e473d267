/** `ci_builds` as drop-canceling-builds needs it. Writes append their event in the same transaction. */
import { Context, type DateTime, type Effect, type Option } from "effect"
import type { SqlError } from "effect/sql/SqlError"
import type { BuildCursor, BuildKey, CancelingBuild } from "../domain/Build.ts"
import type { LeaseLost } from "../domain/Errors.ts"

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
   * False on a lock conflict (the row changed since it was read), nothing written.
   */
  drop(build: CancelingBuild, now: DateTime.Utc): Effect.Effect<boolean, SqlError | LeaseLost>
  /**
   * `drop` for a whole page in one fenced transaction: one guarded UPDATE (each row's own
   * status = 'canceling' AND lock_version as read), one INSERT of the dropped rows' events.
   * Returns the builds it dropped, as given; the others lost a race and were left unchanged.
   */
  dropMany(builds: ReadonlyArray<CancelingBuild>, now: DateTime.Utc): Effect.Effect<ReadonlyArray<CancelingBuild>, SqlError | LeaseLost>
  /** failed / data_integrity_failure, guarded by status = 'canceling' only. */
  doom(build: CancelingBuild, now: DateTime.Utc): Effect.Effect<boolean, SqlError | LeaseLost>
}>()("sweeper/services/Builds") {}
