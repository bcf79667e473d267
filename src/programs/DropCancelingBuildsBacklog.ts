/**
 * drop-canceling-builds' backlog: the run's own scan (`findStuckCanceling` at the run's cutoff),
 * stopped after BACKLOG_CAP + 1 builds. Every build it returns is one the run would fail; each has
 * been due since both its timestamps passed the one-hour cutoff.
 */
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { BACKLOG_CAP, backlogPart, type BacklogReading, earliest } from "../domain/Backlog.ts"
import { decisionTime } from "../domain/Batch.ts"
import { CANCELING_TIMEOUT, cancelingCutoff } from "../domain/Build.ts"
import { Builds } from "../services/Builds.ts"

export const dropCancelingBuildsBacklog = Effect.gen(function*() {
  const cutoff = cancelingCutoff(yield* decisionTime)
  const found = yield* (yield* Builds).findStuckCanceling({ cutoff, after: Option.none(), limit: BACKLOG_CAP + 1 })
  const stuck = found.slice(0, BACKLOG_CAP)
  const due = stuck.map((build) =>
    DateTime.addDuration(DateTime.max(build.createdAt, build.updatedAt), CANCELING_TIMEOUT)
  )
  return { parts: [backlogPart("canceling builds", stuck.length, found.length > BACKLOG_CAP, earliest(due))] }
}) satisfies Effect.Effect<BacklogReading, unknown, Builds>
