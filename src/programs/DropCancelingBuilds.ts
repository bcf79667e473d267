/**
 * drop-canceling-builds — port of GitLab's Ci::StuckBuilds::DropCancelingWorker. Builds stuck in `canceling` for over
 * an hour (created_at
 * and updated_at both) are failed with stuck_or_timeout_failure, a keyset page (100 by default,
 * `SWEEPER_DROP_BATCH_SIZE`) at a time, each page in one fenced transaction. A build whose row
 * keeps changing under us (optimistic lock conflicts) is retried on its own, then doomed as
 * data_integrity_failure so it cannot stay stuck forever (`Builds.retryOrDoom`). A build whose row
 * another open transaction holds is skipped, never waited for (a page must not stall on
 * it): counted once per run in `skippedLocked`, logged once per page with its ids, counted across runs
 * (`repair/LockedRowTally.ts`), and found again by the next run.
 *
 * Paging, read-ahead, the revisit walk of committed pages, budget, gate and dry run are the repair
 * loop's (repair/RepairLoop.ts `keysetPages`).
 *
 * GitLab's parent StuckCiJobsWorker runs at :00 and schedules this worker 45 minutes later; Sweeper
 * uses :45 as its own cron so that a restart between :00 and :45 cannot lose the run.
 */
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { type Batch, CurrentRun, decisionTime } from "../domain/Batch.ts"
import {
  type CancelingBuild,
  cancelingCutoff,
  cursorOf,
  DropBatchSize,
  DROPPING_MESSAGE,
  droppingPageFields,
  retriedCounts
} from "../domain/Build.ts"
import { cancelingProposal } from "../domain/Shadow.ts"
import { lockedRowTally } from "../repair/LockedRowTally.ts"
import { type Held, keysetPages } from "../repair/RepairLoop.ts"
import { Builds } from "../services/Builds.ts"
import { buildsDoomedTotal, buildsDroppedTotal, increment } from "../services/Metrics.ts"
import { dropCancelingBuildsBacklog } from "./DropCancelingBuildsBacklog.ts"

export interface DropCancelingBuildsSummary extends Held {
  readonly dropped: number
  readonly doomed: number
  readonly batches: number
  /** Builds passed over because another open transaction held their row; the next run retries them. */
  readonly skippedLocked: number
}

const NAME = "drop-canceling-builds"
const BUDGET = Duration.minutes(25)

const run = Effect.fn("DropCancelingBuilds.run")(function*() {
  const builds = yield* Builds
  const { dryRun } = yield* CurrentRun
  const size = yield* DropBatchSize
  const now = yield* decisionTime
  yield* Effect.logInfo("Cleaning canceling, timed-out builds")
  const cutoff = cancelingCutoff(now)
  const locked = yield* lockedRowTally(NAME, "build_ids", "Skipped builds locked by another transaction")

  // Attempt 1 for the whole page in one transaction; the rows that lost the race one by one. Rows
  // another transaction holds (in the page write or in a retry) are skipped and logged once.
  const dropPage = (
    page: ReadonlyArray<CancelingBuild>,
    commit: (c: { dropped: number; doomed: number; skippedLocked: number }) => Effect.Effect<void>
  ) =>
    Effect.gen(function*() {
      // GitLab's per-build line, written once per page with every build's fields (Build.ts).
      yield* Effect.logInfo(DROPPING_MESSAGE, droppingPageFields(page))
      const written = yield* builds.dropMany(page, yield* DateTime.now)
      const won = new Set(written.dropped)
      const skipped = new Set(written.locked)
      yield* commit({ dropped: won.size, doomed: 0, skippedLocked: 0 })
      for (const lost of page.filter((build) => !won.has(build) && !skipped.has(build))) {
        const outcome = yield* builds.retryOrDoom(lost, now)
        if (outcome === "locked") skipped.add(lost)
        yield* commit({ ...retriedCounts(outcome), skippedLocked: 0 })
      }
      // Info per page; a build held run after run is warned about on its own.
      const firstSkipped = yield* locked.unit(page.map((build) => build.id), [...skipped].map((build) => build.id))
      if (firstSkipped > 0) yield* commit({ dropped: 0, doomed: 0, skippedLocked: firstSkipped })
    })

  const { totals: { dropped, doomed, skippedLocked }, units: batches, stop, heldMs, heldBy } = yield* keysetPages({
    batch: NAME,
    budget: BUDGET,
    initial: { dropped: 0, doomed: 0, skippedLocked: 0 },
    size,
    read: (after) => builds.findStuckCanceling({ cutoff, after, limit: size }),
    cursor: cursorOf,
    revisit: (after) => builds.revisitWritten({ cutoff, after }),
    // Two pages written at once: pages share no build, and a page claims its rows without waiting
    // (SKIP LOCKED), so one page's statement runs while the page before it commits.
    writesInFlight: 2,
    unit: {
      // The page read is what the write drops (its guard re-checks each row).
      plan: Effect.succeed,
      target: (build) => `build:${build.id}`,
      propose: yield* cancelingProposal,
      dry: (page) => ({ dropped: page.length, doomed: 0, skippedLocked: 0 }),
      write: dropPage,
      fence: false
    }
  })

  if (stop === "done") yield* locked.complete
  if (!dryRun) yield* Effect.all([increment(buildsDroppedTotal, dropped), increment(buildsDoomedTotal, doomed)])
  return { dropped, doomed, batches, skippedLocked, heldMs, heldBy } satisfies DropCancelingBuildsSummary
})

export const DropCancelingBuilds = {
  name: NAME,
  worker: "Ci::StuckBuilds::DropCancelingWorker",
  description: "Fails CI builds stuck in canceling for over an hour (stuck_or_timeout_failure)",
  cron: "45 * * * *",
  budget: BUDGET,
  lease: Option.some({ name: "ci/stuck_builds/drop_canceling_worker", ttl: Duration.minutes(30) }),
  // ci_builds, or GitLab's partitioned p_ci_builds; each build's event in sweeper_events.
  writes: { tables: ["ci_builds", "p_ci_builds", "sweeper_events"] },
  repairedCounts: ["dropped", "doomed"],
  run: run(),
  backlog: dropCancelingBuildsBacklog
} satisfies Batch<DropCancelingBuildsSummary, unknown, unknown>
