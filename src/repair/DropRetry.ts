/**
 * Retry-or-doom for drop-canceling-builds, shared by BuildsSql and BuildsMemory so both back
 * `Builds.retryOrDoom` with the same rule: a build that lost the race in its page's write
 * (attempt 1) is re-read and retried on its own with the re-read row; when MAX_DROP_ATTEMPTS run
 * out it is doomed as data_integrity_failure, so a row that keeps changing under us cannot stay
 * stuck forever. Rare, so one transaction per attempt is fine. A row another open transaction holds
 * (RowLocked from `drop` or `doom`) is "locked": skipped, never waited for and never doomed (issue
 * 18), found again by the next run.
 */
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import type { SqlError } from "effect/sql/SqlError"
import {
  type CancelingBuild,
  type DropOutcome,
  DROPPING_MESSAGE,
  droppingFields,
  isStuckCanceling,
  MAX_DROP_ATTEMPTS
} from "../domain/Build.ts"
import type { FenceError } from "../domain/Errors.ts"
import type { Builds } from "../services/Builds.ts"

type Attempts = Pick<Builds["Service"], "find" | "drop" | "doom">

export const retryOrDoom = (builds: Attempts) => {
  const attempts = retryOrDoomLocked(builds)
  return (lost: CancelingBuild, now: DateTime.Utc): Effect.Effect<DropOutcome, SqlError | FenceError> =>
    attempts(lost, now).pipe(Effect.catchTag("RowLocked", () => Effect.succeed("locked" as const)))
}

const retryOrDoomLocked = (builds: Attempts) =>
  Effect.fnUntraced(function*(lost: CancelingBuild, now: DateTime.Utc) {
    let current = lost
    for (let attempt = 2;; attempt++) {
      const reread = yield* builds.find(current)
      if (Option.isNone(reread) || !isStuckCanceling(reread.value, now)) return "changed_meanwhile" as const
      current = reread.value
      if (attempt > MAX_DROP_ATTEMPTS) break
      yield* Effect.logInfo(DROPPING_MESSAGE, droppingFields(current, attempt))
      if (yield* builds.drop(current, yield* DateTime.now)) return "dropped" as const
    }
    yield* Effect.logWarning("Dooming build that could not be dropped").pipe(Effect.annotateLogs({
      build_id: current.id,
      project_id: current.projectId,
      runner_id: current.runnerId,
      failure_reason: "data_integrity_failure",
      attempts: MAX_DROP_ATTEMPTS
    }))
    return (yield* builds.doom(current, yield* DateTime.now)) ? "doomed" as const : "changed_meanwhile" as const
  })
