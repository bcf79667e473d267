/**
 * drop-scheduled-builds — port of GitLab's Ci::StuckBuilds::DropScheduledService
 * (DropScheduledWorker, which StuckCiJobsWorker schedules 30 minutes after its :00 run). Delayed
 * builds still `scheduled` an hour after their scheduled_at (BUILD_SCHEDULED_OUTDATED_TIMEOUT) are
 * failed with stale_schedule, in every GitLab version. Pages, retry-or-doom, budget, gate and dry run
 * are the family's walk (repair/StuckFamily.ts).
 *
 * Sweeper's cron is :30 itself, so a restart between :00 and :30 cannot lose the run.
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { type Batch, CurrentRun } from "../domain/Batch.ts"
import { SCHEDULED_OUTDATED } from "../domain/StuckBuilds.ts"
import { dropStuckRules, stuckBacklog, type StuckFamilySummary } from "../repair/StuckFamily.ts"
import { buildsDoomedTotal, buildsDroppedTotal, increment } from "../services/Metrics.ts"

export type DropScheduledBuildsSummary = StuckFamilySummary

const NAME = "drop-scheduled-builds"
const BUDGET = Duration.minutes(25)

const run = Effect.fn("DropScheduledBuilds.run")(function*() {
  const { dryRun } = yield* CurrentRun
  yield* Effect.logInfo("Cleaning scheduled, timed-out builds")
  const summary = yield* dropStuckRules(NAME, BUDGET, [SCHEDULED_OUTDATED])
  if (!dryRun) {
    yield* Effect.all([increment(buildsDroppedTotal, summary.dropped), increment(buildsDoomedTotal, summary.doomed)])
  }
  return summary satisfies DropScheduledBuildsSummary
})

/** What waits for this batch now: its rules' own first page (the dashboard card, `sweeper_backlog`). */
export const dropScheduledBuildsBacklog = stuckBacklog([SCHEDULED_OUTDATED])

export const DropScheduledBuilds = {
  name: NAME,
  worker: "Ci::StuckBuilds::DropScheduledWorker",
  description: "Fails delayed CI builds still scheduled an hour past their time (stale_schedule)",
  cron: "30 * * * *",
  budget: BUDGET,
  lease: Option.some({ name: "ci/stuck_builds/drop_scheduled_worker", ttl: Duration.minutes(30) }),
  writes: { tables: ["ci_builds", "p_ci_builds", "sweeper_events"] },
  repairedCounts: ["dropped", "doomed"],
  run: run(),
  backlog: dropScheduledBuildsBacklog
} satisfies Batch<DropScheduledBuildsSummary, unknown, unknown>
