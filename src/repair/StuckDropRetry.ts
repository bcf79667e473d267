/**
 * Retry-or-doom for the stuck-builds family, shared by StuckBuildsSql and StuckBuildsMemory: a build
 * that lost its page's race is re-read (still matching its rule?), retried alone with the re-read
 * row (GitLab's `retry_lock(build, 3)`), and doomed as data_integrity_failure when the attempts run
 * out (GitLab's `doom!`). Every exit is bounded: a row held by another transaction is "locked", a
 * write refused for good (a trigger raising, or swallowing the update) is "refused"; both are
 * counted and passed, never retried within the run, so one bad row cannot keep a run going.
 */
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import type { SqlError } from "effect/sql/SqlError"
import { type DropOutcome, MAX_DROP_ATTEMPTS } from "../domain/Build.ts"
import { type FenceError, isTransientSqlError, type RowLocked } from "../domain/Errors.ts"
import type { StuckRule } from "../domain/StuckBuilds.ts"
import type { FamilyBuild } from "../services/StuckBuilds.ts"

export type FamilyOutcome = DropOutcome | "refused"

/** One build's write: true written, false lost a race, "refused" a write that can never apply. */
type Write = (build: FamilyBuild) => Effect.Effect<boolean | "refused", SqlError | FenceError | RowLocked>

export interface FamilyAttempts {
  /** The build re-read, when it still matches the rule. */
  readonly find: (build: FamilyBuild) => Effect.Effect<Option.Option<FamilyBuild>, SqlError>
  readonly drop: Write
  readonly doom: Write
}

export const retryOrDoomFamily =
  (rule: StuckRule, builds: FamilyAttempts) =>
  (lost: FamilyBuild): Effect.Effect<FamilyOutcome, SqlError | FenceError> =>
    Effect.gen(function*() {
      let current = lost
      for (let attempt = 2; attempt <= MAX_DROP_ATTEMPTS; attempt++) {
        const reread = yield* builds.find(current)
        if (Option.isNone(reread)) return "changed_meanwhile" as const
        current = reread.value
        const written = yield* builds.drop(current)
        if (written === "refused") return "refused" as const
        if (written) return "dropped" as const
      }
      if (Option.isNone(yield* builds.find(current))) return "changed_meanwhile" as const
      yield* Effect.logWarning("Dooming build that could not be dropped").pipe(Effect.annotateLogs({
        build_id: current.id,
        build_stuck_type: rule.stuckType,
        failure_reason: "data_integrity_failure",
        attempts: MAX_DROP_ATTEMPTS,
        at: DateTime.formatIso(yield* DateTime.now)
      }))
      const doomed = yield* builds.doom(current)
      return doomed === "refused" ? "refused" as const : doomed ? "doomed" as const : "changed_meanwhile" as const
    }).pipe(
      Effect.catchTag("RowLocked", () => Effect.succeed("locked" as const)),
      Effect.catchIf(
        (error): error is SqlError => error._tag === "SqlError" && !isTransientSqlError(error),
        (error) =>
          Effect.as(
            Effect.logInfo("Build write refused", { build_id: lost.id, error: error.message }),
            "refused" as const
          )
      )
    )
