/**
 * drop-pending-builds — port of the pending half of GitLab's Ci::StuckBuilds::DropPendingService,
 * which GitLab's hourly StuckCiJobsWorker runs inline at :00. Three rules, in GitLab's order:
 * - outdated: pending builds created and updated over a day ago (BUILD_PENDING_OUTDATED_TIMEOUT);
 * - waiting for ack: pending builds handed to a runner and not updated for an hour
 *   (BUILD_PENDING_OUTDATED_WAITING_FOR_ACK_TIMEOUT), passed over while the runner's acknowledgement
 *   window is still open (GitLab's Redis entry) → runner_provisioning_timeout; GitLab 18 only, so
 *   not with `SWEEPER_FAILURE_REASONS=gitlab-19` (19 removed the rule), and only once the operator
 *   has named that reason's integer (no GitLab source pins it: domain/StuckBuilds.ts);
 * - stuck: pending builds created and updated over an hour ago (BUILD_PENDING_STUCK_TIMEOUT) that
 *   no online runner could pick (GitLab's `build.stuck?`).
 * Outdated and stuck fail the build with stuck_or_timeout_failure, or with GitLab 19's reasons
 * (stuck_pending_with_matching_runners / stuck_pending_no_matching_runners) under gitlab-19.
 * Pages, retry-or-doom, budget, gate and dry run are the family's walk (repair/StuckFamily.ts).
 *
 * Why a keyset walk: GitLab's stuck loop stops at the first pending build that is not stuck and
 * re-reads "the first 100" until empty, so one row that cannot be failed keeps the worker busy for
 * ever; here every row is read once per run.
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { type Batch, CurrentRun } from "../domain/Batch.ts"
import { PENDING_OUTDATED, PENDING_STUCK, PENDING_WAITING_FOR_ACK } from "../domain/StuckBuilds.ts"
import { dropStuckRules, stuckBacklog, type StuckFamilySummary } from "../repair/StuckFamily.ts"
import { buildsDoomedTotal, buildsDroppedTotal, increment } from "../services/Metrics.ts"

export type DropPendingBuildsSummary = StuckFamilySummary

const NAME = "drop-pending-builds"
const BUDGET = Duration.minutes(25)

const run = Effect.fn("DropPendingBuilds.run")(function*() {
  const { dryRun } = yield* CurrentRun
  yield* Effect.logInfo("Cleaning pending timed-out builds")
  const summary = yield* dropStuckRules(NAME, BUDGET, [PENDING_OUTDATED, PENDING_WAITING_FOR_ACK, PENDING_STUCK])
  if (!dryRun) {
    yield* Effect.all([increment(buildsDroppedTotal, summary.dropped), increment(buildsDoomedTotal, summary.doomed)])
  }
  return summary satisfies DropPendingBuildsSummary
})

/** What waits for this batch now: its rules' own first page (the dashboard card, `sweeper_backlog`). */
export const dropPendingBuildsBacklog = stuckBacklog([PENDING_OUTDATED, PENDING_WAITING_FOR_ACK, PENDING_STUCK])

export const DropPendingBuilds = {
  name: NAME,
  worker: "Ci::StuckBuilds::DropPendingService (StuckCiJobsWorker)",
  description: "Fails CI builds pending for over a day, unacknowledged by their runner for an hour, " +
    "or pending an hour with no online runner",
  cron: "0 * * * *",
  budget: BUDGET,
  // GitLab's StuckCiJobsWorker lease: the whole family runs under it there; here each batch has its own.
  lease: Option.some({ name: "ci/stuck_builds/drop_pending_worker", ttl: Duration.minutes(30) }),
  writes: { tables: ["ci_builds", "p_ci_builds", "sweeper_events"] },
  repairedCounts: ["dropped", "doomed"],
  run: run(),
  backlog: dropPendingBuildsBacklog
} satisfies Batch<DropPendingBuildsSummary, unknown, unknown>
