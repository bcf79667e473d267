/**
 * Builds as the stuck-builds family (drop-pending, drop-running, drop-scheduled) needs them: one
 * contract for every rule of src/domain/StuckBuilds.ts, so the three programs differ only in the
 * rules they walk. Writes append their event in the same transaction.
 */
import * as Context from "effect/Context"
import type * as DateTime from "effect/DateTime"
import type * as Effect from "effect/Effect"
import type * as Option from "effect/Option"
import type { SqlError } from "effect/sql/SqlError"
import type { BuildCursor, CancelingBuild, DropOutcome } from "../domain/Build.ts"
import type { FenceError } from "../domain/Errors.ts"
import type { FailureReasonSet, StuckRule } from "../domain/StuckBuilds.ts"
import type { DropManyResult } from "./Builds.ts"

/** A build the family read: the same fields (key, lock_version, keyset position) as drop-canceling's. */
export type FamilyBuild = CancelingBuild

export class StuckBuilds extends Context.Service<StuckBuilds, {
  /**
   * A keyset page (created_at, project_id, id[, partition_id]) of the builds `rule` matches at
   * `now`, after `after`. Every row is read once per run whatever its fate: a row that cannot be
   * repaired is passed, never read again by the same run.
   */
  findStuck(options: {
    readonly rule: StuckRule
    readonly now: DateTime.Utc
    readonly after: Option.Option<BuildCursor>
    readonly limit: number
  }): Effect.Effect<ReadonlyArray<FamilyBuild>, SqlError>
  /**
   * The page failed with the rule's reason in `reasons`, in one fenced transaction: each row guarded
   * by the rule itself (still matching at `now`) and the lock_version read; rows another open
   * transaction holds are skipped (`locked`), never waited for. Returns what it dropped and skipped;
   * every other row lost a race or was refused, and is left as it was.
   */
  dropMany(
    rule: StuckRule,
    reasons: FailureReasonSet,
    builds: ReadonlyArray<FamilyBuild>,
    now: DateTime.Utc
  ): Effect.Effect<DropManyResult, SqlError | FenceError>
  /**
   * A build that lost the race in `dropMany`: re-read, retried alone while it still matches the rule
   * (retry_lock's three retries), then doomed as data_integrity_failure; "locked" when another open
   * transaction holds it; "changed_meanwhile" once it no longer matches. A write that fails (e.g. a
   * * trigger refusing it) fails this build only: "refused", counted and passed.
   */
  retryOrDoom(
    rule: StuckRule,
    reasons: FailureReasonSet,
    lost: FamilyBuild,
    now: DateTime.Utc
  ): Effect.Effect<DropOutcome | "refused", SqlError | FenceError>
}>()("sweeper/services/StuckBuilds") {}
