/**
 * drop-canceling-builds — port of GitLab's Ci::StuckBuilds::DropCancelingWorker (seed:
 * drop-canceling-builds.ja.md, SPEC §2). Builds stuck in `canceling` for over an hour (created_at
 * and updated_at both) are failed with stuck_or_timeout_failure, 100 at a time. A build whose row
 * keeps changing under us (optimistic lock conflicts) is retried, then doomed as
 * data_integrity_failure so it cannot stay stuck forever.
 *
 * GitLab's parent StuckCiJobsWorker runs at :00 and schedules this worker 45 minutes later; Sweeper
 * uses :45 as its own cron so that a restart between :00 and :45 cannot lose the run.
 */
import { DateTime, Duration, Effect, Option } from "effect"
import type { Batch } from "../domain/Batch.ts"
import { CurrentRun, reportProgress, decisionTime, wouldChange } from "../domain/Batch.ts"
import {
  cancelingCutoff,
  type CancelingBuild,
  cursorOf,
  DROP_BATCH_SIZE,
  isStuckCanceling,
  MAX_DROP_ATTEMPTS
} from "../domain/Build.ts"
import { Builds } from "../services/Builds.ts"
import { buildsDoomedTotal, buildsDroppedTotal, increment } from "../services/Metrics.ts"

export interface DropCancelingBuildsSummary {
  readonly dropped: number
  readonly doomed: number
  readonly batches: number
}

type DropResult = "dropped" | "doomed" | "changed_meanwhile"

/** Drop with optimistic-lock retries; re-read after each conflict; doom when retries run out. */
const dropOrDoom = Effect.fnUntraced(function*(build: CancelingBuild, now: DateTime.Utc) {
  const builds = yield* Builds
  let current = build
  for (let attempt = 1; attempt <= MAX_DROP_ATTEMPTS; attempt++) {
    yield* Effect.logInfo("Dropping outdated build").pipe(Effect.annotateLogs({
      build_id: current.id,
      runner_id: current.runnerId,
      status: current.status,
      failure_reason: "stuck_or_timeout_failure",
      attempt
    }))
    if (yield* builds.drop(current, yield* DateTime.now)) return "dropped" satisfies DropResult
    const reread = yield* builds.find(current)
    if (Option.isNone(reread) || !isStuckCanceling(reread.value, now)) return "changed_meanwhile" satisfies DropResult
    current = reread.value
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

const run = Effect.fn("DropCancelingBuilds.run")(function*() {
  const builds = yield* Builds
  const { dryRun } = yield* CurrentRun
  const now = yield* decisionTime
  yield* Effect.logInfo("Cleaning canceling, timed-out builds")

  let dropped = 0
  let doomed = 0
  let batches = 0
  let after = Option.none<ReturnType<typeof cursorOf>>()
  while (true) {
    const batch = yield* builds.findStuckCanceling({ cutoff: cancelingCutoff(now), after, limit: DROP_BATCH_SIZE })
    if (batch.length === 0) break
    batches++
    for (const build of batch) {
      if (dryRun) {
        dropped++
        yield* wouldChange(`build:${build.id}`)
        continue
      }
      const result = yield* dropOrDoom(build, now)
      if (result === "dropped") dropped++
      if (result === "doomed") doomed++
      yield* reportProgress({ dropped: result === "dropped" ? 1 : 0, doomed: result === "doomed" ? 1 : 0 })
    }
    if (batch.length < DROP_BATCH_SIZE) break
    after = Option.some(cursorOf(batch[batch.length - 1]!))
  }

  if (!dryRun) {
    yield* increment(buildsDroppedTotal, dropped)
    yield* increment(buildsDoomedTotal, doomed)
  }
  return { dropped, doomed, batches } satisfies DropCancelingBuildsSummary
})

export const DropCancelingBuilds = {
  name: "drop-canceling-builds",
  worker: "Ci::StuckBuilds::DropCancelingWorker",
  description: "Fails CI builds stuck in canceling for over an hour (stuck_or_timeout_failure)",
  cron: "45 * * * *",
  budget: Duration.minutes(25),
  lease: Option.some({ name: "ci/stuck_builds/drop_canceling_worker", ttl: Duration.minutes(30) }),
  run: run()
} satisfies Batch<DropCancelingBuildsSummary, unknown, unknown>
