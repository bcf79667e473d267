/**
 * Each batch's backlog is what its own run would repair: on one seeded fixture (in memory), every
 * batch with a backlog reader counts exactly what a dry run of the batch reports it would repair —
 * including the things the run deliberately leaves alone (young parallel exports, rebalances of
 * deleted containers, workers without a limit or with the breaker open), which must not count.
 */
import { assert, describe, it } from "@effect/vitest"
import { DateTime, Duration, Effect } from "effect"
import { TestClock } from "effect/testing"
import { CurrentRun } from "../../src/domain/Batch.ts"
import { workerKeys } from "../../src/domain/ConcurrencyLimit.ts"
import { PENDING_DIRECT_UPLOADS_KEY } from "../../src/domain/DirectUpload.ts"
import { jobStatusKey } from "../../src/domain/SidekiqStatus.ts"
import { type BuildRecord, MemoryBuilds } from "../../src/layers/memory/BuildsMemory.ts"
import { type ExportJobRecord, MemoryExportJobs } from "../../src/layers/memory/ExportJobsMemory.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { MemoryPlatformRecords } from "../../src/layers/memory/PlatformRecordsMemory.ts"
import { ConcurrencyLimitResume } from "../../src/programs/ConcurrencyLimitResume.ts"
import { concurrencyLimitResumeBacklog } from "../../src/programs/ConcurrencyLimitResumeBacklog.ts"
import { DeleteStaleDirectUploads } from "../../src/programs/DeleteStaleDirectUploads.ts"
import { DropCancelingBuilds } from "../../src/programs/DropCancelingBuilds.ts"
import { batches } from "../../src/programs/index.ts"
import { RescheduleStuckIssueRebalances } from "../../src/programs/RescheduleStuckIssueRebalances.ts"
import { StuckExportJobs } from "../../src/programs/StuckExportJobs.ts"
import { ConcurrencyLimits } from "../../src/services/ConcurrencyLimits.ts"
import { MemoryPlatform } from "../support/memory.ts"

const NOW = DateTime.makeUnsafe("2026-03-01T12:00:00Z")
const ago = (d: Duration.Input) => DateTime.subtractDuration(NOW, Duration.fromInputUnsafe(d))
const seconds = (d: Duration.Input) => Math.floor(DateTime.toEpochMillis(ago(d)) / 1000)

const UNLIMITED = "Releases::CreateEvidenceWorker"
const LIMITED = "Namespaces::ProcessSyncEventsWorker"
const BROKEN = "Geo::VerificationBatchWorker"
const UNKNOWN = "Some::UnconfiguredWorker"
const settings = {
  concurrencyLimits: {
    [UNLIMITED]: { limit: 0, queue: "default" },
    [LIMITED]: { limit: 10, queue: "default" },
    [BROKEN]: { limit: 5, queue: "default" }
  }
}

const build = (id: number, age: Duration.Input, status = "canceling"): BuildRecord => ({
  id,
  projectId: 1,
  runnerId: 7,
  type: "Ci::Build",
  status,
  failureReason: null,
  lockVersion: 0,
  createdAt: ago(age),
  updatedAt: ago(age),
  finishedAt: null
})

const exportJob = (id: number, age: Duration.Input): ExportJobRecord => ({
  id,
  projectId: 100 + id,
  jid: `jid-${id}`,
  status: 1,
  createdAt: ago(age),
  updatedAt: ago(age)
})

const deferred = (age: Duration.Input) => JSON.stringify({ args: [1], context: {}, buffered_at: seconds(age) })

/** Something for every batch, with what its run leaves alone beside what it repairs. */
const seedAll = Effect.gen(function*() {
  yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
  const redis = yield* MemoryRedis
  // Builds: three stuck canceling, one canceling for only ten minutes, one old but running.
  const builds = yield* MemoryBuilds
  for (const row of [build(1, "2 hours"), build(2, "3 hours"), build(3, "5 hours")]) builds.rows.set(row.id, row)
  builds.rows.set(4, build(4, "10 minutes"))
  builds.rows.set(5, build(5, "5 hours", "running"))
  // Exports: two whose worker is gone, one still tracked, a parallel one an hour old (in its 6 h
  // grace: left alone) and a parallel one seven hours old (past it), both workers gone.
  const exports = yield* MemoryExportJobs
  const rows = [exportJob(1, "3 hours"), exportJob(2, "2 hours"), exportJob(3, "4 hours")]
  rows.push(exportJob(4, "1 hour"), exportJob(5, "7 hours"))
  for (const row of rows) exports.jobs.set(row.id, row)
  exports.relationExports.push(
    { id: 1, projectExportJobId: 4, relation: "issues" },
    { id: 2, projectExportJobId: 5, relation: "issues" }
  )
  redis.set(jobStatusKey("jid-3"), "1", { exSeconds: 3600 })
  // Uploads: two stale, one fresh, one malformed (never deleted).
  redis.hset(PENDING_DIRECT_UPLOADS_KEY, {
    "artifacts:tmp/a": String(seconds("4 hours")),
    "artifacts:tmp/b": String(seconds("5 hours")),
    "artifacts:tmp/fresh": String(seconds("1 hour")),
    "artifacts:tmp/bad": "soon"
  })
  // Rebalances: a namespace and a project that exist, a project that is gone, a malformed member.
  const records = yield* MemoryPlatformRecords
  records.namespaces.add(10)
  records.projects.add(20)
  redis.sadd("gitlab:issues-position-rebalances:running_rebalances", "1/10", "2/20", "2/21", "3/x")
  // Deferred jobs: an unlimited worker (3), a limited one with room (2), one whose breaker is open
  // (4, left alone) and one with no limit anywhere (5, left alone).
  redis.rpush(workerKeys(UNLIMITED).deferred, deferred("10 minutes"), deferred("5 minutes"), deferred("1 minute"))
  redis.rpush(workerKeys(LIMITED).deferred, deferred("20 minutes"), deferred("2 minutes"))
  redis.set(workerKeys(BROKEN).currentLimit, "-1")
  redis.rpush(workerKeys(BROKEN).deferred, ...Array.from({ length: 4 }, () => deferred("2 hours")))
  redis.rpush(workerKeys(UNKNOWN).deferred, ...Array.from({ length: 5 }, () => deferred("3 hours")))
})

/** A dry run of the batch's program, as `sweeper run --dry-run` gives it. */
const dry = <A, E, R>(run: Effect.Effect<A, E, R>) =>
  Effect.gen(function*() {
    const defaults = yield* CurrentRun
    return yield* run.pipe(Effect.provideService(CurrentRun, { ...defaults, dryRun: true }))
  })

describe("every batch's backlog is its own dry run's repair count", () => {
  it.effect("on one fixture, backlog count = what a dry run would repair, for every batch with a reader", () =>
    Effect.gen(function*() {
      yield* seedAll
      const backlogOf = Effect.fnUntraced(function*(name: string) {
        const reader = batches.find((b) => b.name === name)!.backlog!
        const reading = yield* reader
        return { count: reading.parts.reduce((sum, p) => sum + p.count, 0), reading }
      })
      // Backlogs first: a dry run writes nothing, but read before it anyway.
      const drop = yield* backlogOf(DropCancelingBuilds.name)
      const exports = yield* backlogOf(StuckExportJobs.name)
      const uploads = yield* backlogOf(DeleteStaleDirectUploads.name)
      const rebalances = yield* backlogOf(RescheduleStuckIssueRebalances.name)
      const resume = yield* backlogOf(ConcurrencyLimitResume.name)

      const dropRun = yield* dry(DropCancelingBuilds.run)
      assert.strictEqual(dropRun.dropped, 3)
      assert.strictEqual(drop.count, dropRun.dropped)

      const exportRun = yield* dry(StuckExportJobs.run)
      assert.deepInclude(exportRun, { failed: 3, skippedParallel: 1 })
      assert.strictEqual(exports.count, exportRun.failed)
      // Due since its last change (3 h ago); the old parallel one only since its grace ended (1 h ago).
      assert.deepStrictEqual(exports.reading.parts[0]!.oldestAt, DateTime.toDateUtc(ago("3 hours")))

      const uploadRun = yield* dry(DeleteStaleDirectUploads.run)
      assert.strictEqual(uploadRun.totalDeletedStaleEntries + uploadRun.skippedNoStore, 2)
      assert.strictEqual(uploads.count, uploadRun.totalDeletedStaleEntries + uploadRun.skippedNoStore)

      const rebalanceRun = yield* dry(RescheduleStuckIssueRebalances.run)
      assert.strictEqual(rebalanceRun.enqueuedNamespaces + rebalanceRun.enqueuedProjects, 2)
      assert.strictEqual(rebalances.count, rebalanceRun.enqueuedNamespaces + rebalanceRun.enqueuedProjects)

      const resumeRun = yield* dry(ConcurrencyLimitResume.run)
      assert.strictEqual(resumeRun.resumedJobs, 5)
      assert.strictEqual(resume.count, resumeRun.resumedJobs)
      assert.deepStrictEqual(resume.reading.parts.map((p) => [p.label, p.count]), [[LIMITED, 2], [UNLIMITED, 3]])
      assert.include(resume.reading.note, "1 with jobs deferred but no limit set")
      assert.include(resume.reading.note, "1 with jobs deferred behind an open breaker")
    }).pipe(Effect.provide(MemoryPlatform(settings))))

  it.effect("resume's run keeps the backlog's workers known: its own discovery replaces the sweep's", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
      const limits = yield* ConcurrencyLimits
      const redis = yield* MemoryRedis
      // A sample sweeps the (empty) keyspace; a worker deferring right after waits for the next sweep.
      assert.lengthOf((yield* concurrencyLimitResumeBacklog).parts, 0)
      redis.set(workerKeys(UNKNOWN).currentLimit, "4")
      redis.rpush(workerKeys(UNKNOWN).deferred, deferred("1 minute"))
      assert.lengthOf((yield* concurrencyLimitResumeBacklog).parts, 0, "within SWEEP.every: nothing scanned")
      // The run's discovery (every minute where the batch runs) is a complete one: the next sample has it.
      yield* limits.workersWithDeferredJobs
      const reading = yield* concurrencyLimitResumeBacklog
      assert.deepStrictEqual(reading.parts.map((p) => [p.label, p.count]), [[UNKNOWN, 1]])
      assert.isFalse(reading.stale)
    }).pipe(Effect.provide(MemoryPlatform(settings))))

  it.effect("prune-events has no reader: nothing of GitLab's waits on it", () =>
    Effect.sync(() => assert.isUndefined(batches.find((b) => b.name === "prune-events")!.backlog)))
})
