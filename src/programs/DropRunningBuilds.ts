/**
 * drop-running-builds — port of GitLab's Ci::StuckBuilds::DropRunningService (DropRunningWorker,
 * which StuckCiJobsWorker schedules 15 minutes after its :00 run). Running builds created and updated
 * over an hour ago (BUILD_RUNNING_OUTDATED_TIMEOUT; the created_at bound is GitLab's newer query,
 * which lets the (status, created_at, project_id) index serve it) are failed with
 * stuck_or_timeout_failure, or no_updates_running with `SWEEPER_FAILURE_REASONS=gitlab-19`.
 * Pages, retry-or-doom, budget, gate and dry run are the family's walk (repair/StuckFamily.ts).
 *
 * Sweeper's cron is :15 itself, so a restart between :00 and :15 cannot lose the run.
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { type Batch, CurrentRun } from "../domain/Batch.ts"
import { RUNNING_OUTDATED } from "../domain/StuckBuilds.ts"
import { dropStuckRules, stuckBacklog, type StuckFamilySummary } from "../repair/StuckFamily.ts"
import { buildsDoomedTotal, buildsDroppedTotal, increment } from "../services/Metrics.ts"

export type DropRunningBuildsSummary = StuckFamilySummary

const NAME = "drop-running-builds"
const BUDGET = Duration.minutes(25)

const run = Effect.fn("DropRunningBuilds.run")(function*() {
  const { dryRun } = yield* CurrentRun
  yield* Effect.logInfo("Cleaning running, timed-out builds")
  const summary = yield* dropStuckRules(NAME, BUDGET, [RUNNING_OUTDATED])
  if (!dryRun) {
    yield* Effect.all([increment(buildsDroppedTotal, summary.dropped), increment(buildsDoomedTotal, summary.doomed)])
  }
  return summary satisfies DropRunningBuildsSummary
})

/** What waits for this batch now: its rules' own first page (the dashboard card, `sweeper_backlog`). */
export const dropRunningBuildsBacklog = stuckBacklog([RUNNING_OUTDATED])

export const DropRunningBuilds = {
  name: NAME,
  worker: "Ci::StuckBuilds::DropRunningWorker",
  description: "Fails CI builds running with no update for over an hour",
  cron: "15 * * * *",
  budget: BUDGET,
  lease: Option.some({ name: "ci/stuck_builds/drop_running_worker", ttl: Duration.minutes(30) }),
  writes: { tables: ["ci_builds", "p_ci_builds", "sweeper_events"] },
  repairedCounts: ["dropped", "doomed"],
  run: run(),
  backlog: dropRunningBuildsBacklog
} satisfies Batch<DropRunningBuildsSummary, unknown, unknown>
