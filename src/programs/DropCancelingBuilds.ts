/**
 * drop-canceling-builds — port of GitLab's Ci::StuckBuilds::DropCancelingWorker (seed:
 * drop-canceling-builds.ja.md, SPEC §2). Builds stuck in `canceling` for over an hour (created_at
 * and updated_at both) are failed with stuck_or_timeout_failure, a keyset page (100 by default,
 * `SWEEPER_DROP_BATCH_SIZE`) at a time, each page in one fenced transaction. A build whose row
 * keeps changing under us (optimistic lock conflicts) is retried on its own, then doomed as
 * data_integrity_failure so it cannot stay stuck forever. A build whose row another open transaction
 * holds is skipped, never waited for (issue 18: a page must not stall on it): counted in
 * `skippedLocked`, logged once per page with its ids, and found again by the next run.
 *
 * GitLab's parent StuckCiJobsWorker runs at :00 and schedules this worker 45 minutes later; Sweeper
 * uses :45 as its own cron so that a restart between :00 and :45 cannot lose the run.
 */
import { DateTime, Duration, Effect, Option } from "effect"
import type { Batch } from "../domain/Batch.ts"
import { CurrentRun, reportProgress, decisionTime, wouldChange } from "../domain/Batch.ts"
import {
  type BuildCursor,
  cancelingCutoff,
  type CancelingBuild,
  cursorOf,
  DropBatchSize,
  isStuckCanceling,
  MAX_DROP_ATTEMPTS
} from "../domain/Build.ts"
import { Builds } from "../services/Builds.ts"
import { buildsDoomedTotal, buildsDroppedTotal, increment } from "../services/Metrics.ts"

export interface DropCancelingBuildsSummary {
  readonly dropped: number
  readonly doomed: number
  readonly batches: number
  /** Builds passed over because another open transaction held their row; the next run retries them. */
  readonly skippedLocked: number
}

type DropResult = "dropped" | "doomed" | "changed_meanwhile" | "locked"

// The fields as the message's structured value, not as annotations: the JSON line is the same
// (runtime/Logging.ts flattens both), and a page of 1000 logs in ≈ 2 ms instead of ≈ 10–25 ms
// (measured), most of which went to setting annotations per line, even when Info is filtered out.
const logDropping = (build: CancelingBuild, attempt: number) =>
  Effect.logInfo("Dropping outdated build", {
    build_id: build.id,
    runner_id: build.runnerId,
    status: build.status,
    failure_reason: "stuck_or_timeout_failure",
    attempt
  })

/**
 * A build that lost the race in its page's write (attempt 1): re-read, retry on its own with the
 * re-read row, doom when the attempts run out. Rare, so one transaction per attempt is fine.
 */
const retryOrDoom = (lost: CancelingBuild, now: DateTime.Utc) =>
  retryOrDoomLocked(lost, now).pipe(Effect.catchTag("RowLocked", () => Effect.succeed("locked" satisfies DropResult)))

const retryOrDoomLocked = Effect.fnUntraced(function*(lost: CancelingBuild, now: DateTime.Utc) {
  const builds = yield* Builds
  let current = lost
  for (let attempt = 2; ; attempt++) {
    const reread = yield* builds.find(current)
    if (Option.isNone(reread) || !isStuckCanceling(reread.value, now)) return "changed_meanwhile" satisfies DropResult
    current = reread.value
    if (attempt > MAX_DROP_ATTEMPTS) break
    yield* logDropping(current, attempt)
    if (yield* builds.drop(current, yield* DateTime.now)) return "dropped" satisfies DropResult
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

/**
 * Attempt 1 for the whole page in one transaction; the rows that lost the race one by one. Rows
 * another transaction holds (in the page write or in a retry) are skipped and logged once.
 */
const dropPage = Effect.fnUntraced(function*(page: ReadonlyArray<CancelingBuild>, now: DateTime.Utc) {
  const builds = yield* Builds
  for (const build of page) yield* logDropping(build, 1)
  const written = yield* builds.dropMany(page, yield* DateTime.now)
  const won = new Set(written.dropped)
  const skipped = new Set(written.locked)
  // Committed: a retried run (transient error) counts these even if a later step fails.
  yield* reportProgress({ dropped: won.size, doomed: 0, skippedLocked: skipped.size })
  let dropped = won.size
  let doomed = 0
  for (const build of page) {
    if (won.has(build) || skipped.has(build)) continue
    const result = yield* retryOrDoom(build, now)
    if (result === "dropped") dropped++
    if (result === "doomed") doomed++
    if (result === "locked") skipped.add(build)
    yield* reportProgress({ dropped: result === "dropped" ? 1 : 0, doomed: result === "doomed" ? 1 : 0, skippedLocked: result === "locked" ? 1 : 0 })
  }
  // Info, not Warn: the logger keeps one warning per message per run, and every page says its own.
  if (skipped.size > 0) {
    yield* Effect.logInfo("Skipped builds locked by another transaction", {
      build_ids: [...skipped].map((build) => build.id),
      count: skipped.size
    })
  }
  return { dropped, doomed, skippedLocked: skipped.size }
})

const run = Effect.fn("DropCancelingBuilds.run")(function*() {
  const builds = yield* Builds
  const { dryRun } = yield* CurrentRun
  const batchSize = yield* DropBatchSize
  const now = yield* decisionTime
  yield* Effect.logInfo("Cleaning canceling, timed-out builds")
  const cutoff = cancelingCutoff(now)
  const read = (after: Option.Option<BuildCursor>) => builds.findStuckCanceling({ cutoff, after, limit: batchSize })

  let dropped = 0
  let doomed = 0
  let batches = 0
  let skippedLocked = 0
  // Where the current page starts, and where the last two pages written and committed start: each
  // committed page is walked twice (once just after its commit, again one page later), because
  // PostgreSQL marks an entry dead only once no snapshot in the database can still see its row,
  // and a snapshot held elsewhere (an ANALYZE, a long transaction) can make the first walk mark
  // nothing; walking entries already marked costs only index pages.
  let pageAfter = Option.none<BuildCursor>()
  let committed: ReadonlyArray<Option.Option<BuildCursor>> = []
  // Housekeeping for the next run's scan, not part of the repair: its failure fails nothing.
  const revisit = (after: Option.Option<BuildCursor>) => builds.revisitWritten({ cutoff, after }).pipe(Effect.ignore)
  let page = yield* read(Option.none())
  while (page.length > 0) {
    batches++
    const upTo = cursorOf(page[page.length - 1]!)
    // A short page is the last one; otherwise the next page's keyset cursor is known now.
    const next = page.length < batchSize
      ? Effect.succeed<ReadonlyArray<CancelingBuild>>([])
      : read(Option.some(upTo))
    if (dryRun) {
      dropped += page.length
      for (const build of page) yield* wouldChange(`build:${build.id}`)
      page = yield* next
      continue
    }
    // The next page is read while this one is written, on another pooled connection (the write
    // holds its own). Safe with the fence: the read writes nothing, so it needs no fence, and every
    // row it returns is written later in a statement of its own that checks the fence then. Its
    // rows are strictly after this page in keyset order, so the two never touch the same row; and
    // whatever the read sees of this page's commit or of other writers, each row's guard (status,
    // lock_version as read) is checked again when its page is written. Before it, the same fiber
    // revisits the two pages before (committed before this write began; the walk reads nothing and
    // stops at the first build still stuck, at the latest this page's first). If this write fails
    // (LeaseLost, SqlError), the read is interrupted with it. The embedded database has one
    // connection: the read then simply waits for the write.
    const ahead = committed.length === 0 ? next : Effect.andThen(revisit(committed[0]!), next)
    const [written, nextPage] = yield* Effect.all([dropPage(page, now), ahead], { concurrency: 2 })
    dropped += written.dropped
    doomed += written.doomed
    skippedLocked += written.skippedLocked
    committed = [...committed, pageAfter].slice(-2)
    pageAfter = Option.some(upTo)
    page = nextPage
  }
  // The last pages written have not been walked twice yet.
  if (committed.length > 0) yield* revisit(committed[0]!)

  if (!dryRun) {
    yield* increment(buildsDroppedTotal, dropped)
    yield* increment(buildsDoomedTotal, doomed)
  }
  return { dropped, doomed, batches, skippedLocked } satisfies DropCancelingBuildsSummary
})

export const DropCancelingBuilds = {
  name: "drop-canceling-builds",
  worker: "Ci::StuckBuilds::DropCancelingWorker",
  description: "Fails CI builds stuck in canceling for over an hour (stuck_or_timeout_failure)",
  cron: "45 * * * *",
  budget: Duration.minutes(25),
  lease: Option.some({ name: "ci/stuck_builds/drop_canceling_worker", ttl: Duration.minutes(30) }),
  // ci_builds, or GitLab's partitioned p_ci_builds; each build's event in sweeper_events.
  writes: { tables: ["ci_builds", "p_ci_builds", "sweeper_events"] },
  run: run()
} satisfies Batch<DropCancelingBuildsSummary, unknown, unknown>
