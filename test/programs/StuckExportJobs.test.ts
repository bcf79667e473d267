import { assert, describe, it } from "@effect/vitest"
import { DateTime, Duration, Effect, Metric } from "effect"
import { TestClock } from "effect/testing"
import { DEFAULT_JOB_STATUS_TTL, EXPORT_JOB_STATUS_TTL, jobStatusKey } from "../../src/domain/SidekiqStatus.ts"
import { MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import { type ExportJobRecord, MemoryExportJobs } from "../../src/layers/memory/ExportJobsMemory.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { StuckExportJobs } from "../../src/programs/StuckExportJobs.ts"
import { JobStatus } from "../../src/services/JobStatus.ts"
import { stuckExportJobsFailedTotal } from "../../src/services/Metrics.ts"
import { runBatch } from "../../src/supervisor/RunGuard.ts"
import { MemoryPlatform } from "../support/memory.ts"

const NOW = DateTime.makeUnsafe("2026-03-01T12:30:00Z")
const ago = (d: Duration.Input) => DateTime.subtractDuration(NOW, Duration.fromInputUnsafe(d))

let nextId = 1
const job = (overrides: Partial<ExportJobRecord> = {}): ExportJobRecord => {
  const id = nextId++
  return {
    id,
    projectId: 100 + id,
    jid: `jid-${id}`,
    status: 1,
    createdAt: ago("1 hour"),
    updatedAt: ago("1 hour"),
    ...overrides
  }
}

let nextRelationId = 1
const seed = (...rows: ReadonlyArray<ExportJobRecord>) =>
  Effect.gen(function*() {
    yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
    const state = yield* MemoryExportJobs
    for (const row of rows) state.jobs.set(row.id, row)
  })

/** Gives a job relation exports, making it a parallel export. */
const withRelations = (row: ExportJobRecord, relations: ReadonlyArray<string> = ["issues", "merge_requests"]) =>
  Effect.gen(function*() {
    const state = yield* MemoryExportJobs
    for (const relation of relations) {
      state.relationExports.push({ id: nextRelationId++, projectExportJobId: row.id, relation })
    }
  })

/** Its Sidekiq job is still queued or running. */
const running = (...rows: ReadonlyArray<ExportJobRecord>) =>
  Effect.gen(function*() {
    const status = yield* JobStatus
    for (const row of rows) yield* status.track(row.jid, EXPORT_JOB_STATUS_TTL)
  })

const rowOf = (id: number) => Effect.map(MemoryExportJobs, (s) => s.jobs.get(id)!)

const runProgram = Effect.gen(function*() {
  yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
  return yield* StuckExportJobs.run
})

const empty = {
  checked: 0,
  completed: 0,
  failed: 0,
  skippedParallel: 0,
  skippedRequeued: 0,
  skippedLocked: 0,
  failedJids: [],
  heldMs: 0,
  heldBy: []
}

describe("stuck-export-jobs", () => {
  it.effect("a large backlog fails in slices of 1000, every job with its event; the summary lists only the first 100 jids", () =>
    Effect.gen(function*() {
      const rows = Array.from({ length: 2_345 }, () => job({ status: 0 }))
      yield* seed(...rows)
      const summary = yield* runProgram
      assert.strictEqual(summary.failed, 2_345)
      assert.deepStrictEqual(summary.failedJids, rows.slice(0, 100).map((row) => row.jid))
      assert.deepStrictEqual((yield* MemoryExportJobs).failSlices, [1000, 1000, 345])
      const events = yield* MemoryEvents
      assert.strictEqual(events.filter((e) => e.type === "ExportJobFailed").length, 2_345)
      for (const row of rows) assert.strictEqual((yield* rowOf(row.id)).status, 3)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("nothing to do: no queued or started export jobs", () =>
    Effect.gen(function*() {
      const done = job({ status: 2 })
      const failed = job({ status: 3 })
      yield* seed(done, failed)
      assert.deepStrictEqual(yield* runProgram, empty)
      assert.strictEqual((yield* rowOf(done.id)).status, 2)
      assert.lengthOf(yield* MemoryEvents, 0)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("no completed jids: every Sidekiq job still running → nothing written, not even a re-read", () =>
    Effect.gen(function*() {
      const queued = job({ status: 0 })
      const started = job({ status: 1 })
      yield* seed(queued, started)
      yield* running(queued, started)
      const state = yield* MemoryExportJobs
      state.beforeFail.set(queued.id, () => assert.fail("must not try to fail"))
      assert.deepStrictEqual(yield* runProgram, { ...empty, checked: 2 })
      assert.deepStrictEqual(state.reReads, [])
      assert.strictEqual((yield* rowOf(queued.id)).status, 0)
      assert.strictEqual((yield* rowOf(started.id)).status, 1)
      assert.lengthOf(yield* MemoryEvents, 0)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("happy path: completed jobs still queued/started are failed with an event each", () =>
    Effect.gen(function*() {
      const stuckQueued = job({ status: 0, projectId: 7 })
      const stuckStarted = job({ status: 1, projectId: 8 })
      const alive = job({ status: 1 })
      yield* seed(stuckQueued, stuckStarted, alive)
      yield* running(alive)
      const summary = yield* runProgram
      // Only the completed ones are read again.
      assert.deepStrictEqual((yield* MemoryExportJobs).reReads, [[stuckQueued.id, stuckStarted.id]])
      assert.deepStrictEqual(summary, {
        checked: 3,
        completed: 2,
        failed: 2,
        skippedParallel: 0,
        skippedRequeued: 0,
        skippedLocked: 0,
        heldMs: 0,
        heldBy: [],
        failedJids: [stuckQueued.jid, stuckStarted.jid]
      })
      for (const stuck of [stuckQueued, stuckStarted]) {
        const row = yield* rowOf(stuck.id)
        assert.strictEqual(row.status, 3)
        assert.isTrue(DateTime.Equivalence(row.updatedAt, NOW))
      }
      assert.strictEqual((yield* rowOf(alive.id)).status, 1)
      const events = yield* MemoryEvents
      assert.deepStrictEqual(events.map((e) => [e.stream, e.type, e.data]), [
        [`export_job:${stuckQueued.id}`, "ExportJobFailed", {
          id: stuckQueued.id,
          jid: stuckQueued.jid,
          project_id: 7
        }],
        [`export_job:${stuckStarted.id}`, "ExportJobFailed", {
          id: stuckStarted.id,
          jid: stuckStarted.jid,
          project_id: 8
        }]
      ])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("parallel exports: exactly 6 h old is failed, 6 h − 1 s is left alone, 6 h + 1 s is failed", () =>
    Effect.gen(function*() {
      const exactly = job({ createdAt: ago("6 hours") })
      const younger = job({ createdAt: ago("21599 seconds") })
      const older = job({ createdAt: ago("21601 seconds") })
      yield* seed(exactly, younger, older)
      for (const row of [exactly, younger, older]) yield* withRelations(row)
      const summary = yield* runProgram
      assert.strictEqual(summary.completed, 3)
      assert.strictEqual(summary.failed, 2)
      assert.strictEqual(summary.skippedParallel, 1)
      assert.deepStrictEqual(summary.failedJids, [exactly.jid, older.jid])
      assert.strictEqual((yield* rowOf(exactly.id)).status, 3)
      assert.strictEqual((yield* rowOf(younger.id)).status, 1)
      assert.strictEqual((yield* rowOf(older.id)).status, 3)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a job without relation exports is failed regardless of age", () =>
    Effect.gen(function*() {
      const fresh = job({ createdAt: ago("1 second") })
      const recent = job({ createdAt: ago("21599 seconds") })
      const old = job({ createdAt: ago("3 days") })
      yield* seed(fresh, recent, old)
      // A relation export of another job does not make these parallel.
      const other = job({ status: 2 })
      yield* seed(other)
      yield* withRelations(other)
      const summary = yield* runProgram
      assert.strictEqual(summary.failed, 3)
      assert.strictEqual(summary.skippedParallel, 0)
      for (const row of [fresh, recent, old]) assert.strictEqual((yield* rowOf(row.id)).status, 3)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a job re-enqueued (new jid) between the reads is left to its new worker", () =>
    Effect.gen(function*() {
      const requeued = job()
      const stuck = job()
      yield* seed(requeued, stuck)
      const state = yield* MemoryExportJobs
      const redis = yield* MemoryRedis
      state.afterListEnqueued.push(() => {
        state.jobs.get(requeued.id)!.jid = "jid-requeued"
        redis.set(jobStatusKey("jid-requeued"), "1", { exSeconds: 21600 })
      })
      const summary = yield* runProgram
      assert.deepStrictEqual(summary, {
        checked: 2,
        completed: 2,
        failed: 1,
        skippedParallel: 0,
        skippedRequeued: 1,
        skippedLocked: 0,
        heldMs: 0,
        heldBy: [],
        failedJids: [stuck.jid]
      })
      const row = yield* rowOf(requeued.id)
      assert.strictEqual(row.status, 1)
      assert.strictEqual(row.jid, "jid-requeued")
      assert.deepStrictEqual((yield* MemoryEvents).map((e) => e.stream), [`export_job:${stuck.id}`])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a job that finished while its status was looked up drops out at the re-read", () =>
    Effect.gen(function*() {
      const finishing = job()
      yield* seed(finishing)
      const state = yield* MemoryExportJobs
      state.afterListEnqueued.push(() => {
        state.jobs.get(finishing.id)!.status = 2
      })
      const summary = yield* runProgram
      assert.deepStrictEqual(summary, { ...empty, checked: 1, completed: 1 })
      assert.strictEqual((yield* rowOf(finishing.id)).status, 2)
      assert.lengthOf(yield* MemoryEvents, 0)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("race at the write: a job that finishes right before the UPDATE is not overwritten", () =>
    Effect.gen(function*() {
      const racing = job()
      const requeuedLate = job()
      const stuck = job()
      yield* seed(racing, requeuedLate, stuck)
      const state = yield* MemoryExportJobs
      state.beforeFail.set(racing.id, () => {
        state.jobs.get(racing.id)!.status = 2
      })
      state.beforeFail.set(requeuedLate.id, () => {
        state.jobs.get(requeuedLate.id)!.jid = "jid-late"
      })
      const summary = yield* runProgram
      assert.strictEqual(summary.failed, 1)
      assert.deepStrictEqual(summary.failedJids, [stuck.jid])
      assert.strictEqual((yield* rowOf(racing.id)).status, 2)
      assert.strictEqual((yield* rowOf(requeuedLate.id)).status, 1)
      assert.deepStrictEqual((yield* MemoryEvents).map((e) => e.stream), [`export_job:${stuck.id}`])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a job another transaction holds is skipped and counted, not reported as changed; the next run fails it", () =>
    Effect.gen(function*() {
      const held = job()
      const stuck = job()
      yield* seed(held, stuck)
      const state = yield* MemoryExportJobs
      state.locked.add(held.id)
      const summary = yield* runProgram
      assert.deepStrictEqual(summary, {
        ...empty,
        checked: 2,
        completed: 2,
        failed: 1,
        skippedLocked: 1,
        failedJids: [stuck.jid]
      })
      assert.strictEqual((yield* rowOf(held.id)).status, 1)
      state.locked.clear()
      const next = yield* runProgram
      assert.deepStrictEqual(next, { ...empty, checked: 1, completed: 1, failed: 1, failedJids: [held.jid] })
      assert.deepStrictEqual((yield* MemoryEvents).map((e) => e.stream), [
        `export_job:${stuck.id}`,
        `export_job:${held.id}`
      ])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("an expired status key counts as completed (the worker died without cleaning up)", () =>
    Effect.gen(function*() {
      const crashed = job({ createdAt: ago("2 hours") })
      yield* seed(crashed)
      const status = yield* JobStatus
      yield* status.track(crashed.jid, DEFAULT_JOB_STATUS_TTL)
      // Still tracked: nothing to do.
      assert.strictEqual((yield* StuckExportJobs.run).failed, 0)
      assert.strictEqual((yield* rowOf(crashed.id)).status, 1)
      yield* TestClock.adjust(Duration.sum(DEFAULT_JOB_STATUS_TTL, Duration.seconds(1)))
      const summary = yield* StuckExportJobs.run
      assert.deepStrictEqual(summary.failedJids, [crashed.jid])
      assert.strictEqual((yield* rowOf(crashed.id)).status, 3)
    }).pipe(Effect.provide(MemoryPlatform())))
})

describe("stuck-export-jobs under the run guard", () => {
  const guarded = (options: { dryRun?: boolean } = {}) =>
    Effect.gen(function*() {
      yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
      return yield* runBatch(StuckExportJobs, { trigger: "manual", ...options })
    })

  const failedCounter = Effect.map(Metric.value(stuckExportJobsFailedTotal), (state) => state.count)

  it.effect("records the failures between RunStarted and RunFinished, all with the run id, and counts them", () =>
    Effect.gen(function*() {
      const stuck = job()
      yield* seed(stuck)
      assert.strictEqual(yield* failedCounter, 0)
      const result = yield* guarded()
      assert.strictEqual(result.outcome, "succeeded")
      assert.deepStrictEqual(result.summary, {
        checked: 1,
        completed: 1,
        failed: 1,
        skippedParallel: 0,
        skippedRequeued: 0,
        skippedLocked: 0,
        heldMs: 0,
        heldBy: [],
        failedJids: [stuck.jid]
      })
      const events = yield* MemoryEvents
      assert.deepStrictEqual(events.map((e) => e.type), ["RunStarted", "ExportJobFailed", "RunFinished"])
      assert.isTrue(events.every((e) => e.runId === result.runId))
      assert.deepStrictEqual(events[2]!.data.summary, result.summary)
      assert.strictEqual(yield* failedCounter, 1)
    }).pipe(Effect.provideService(Metric.MetricRegistry, new Map()), Effect.provide(MemoryPlatform())))

  it.effect("dry run: reports what would be failed, writes nothing", () =>
    Effect.gen(function*() {
      const stuck = job()
      const parallel = job({ createdAt: ago("1 hour") })
      yield* seed(stuck, parallel)
      yield* withRelations(parallel)
      const result = yield* guarded({ dryRun: true })
      assert.strictEqual(result.outcome, "succeeded")
      assert.deepStrictEqual(result.summary, {
        checked: 2,
        completed: 2,
        failed: 1,
        skippedParallel: 1,
        skippedRequeued: 0,
        skippedLocked: 0,
        heldMs: 0,
        heldBy: [],
        failedJids: [stuck.jid]
      })
      const row = yield* rowOf(stuck.id)
      assert.strictEqual(row.status, 1)
      assert.isTrue(DateTime.Equivalence(row.updatedAt, ago("1 hour")))
      const events = yield* MemoryEvents
      assert.deepStrictEqual(events.map((e) => e.type), ["RunStarted", "RunFinished"])
      assert.strictEqual(yield* failedCounter, 0)
    }).pipe(Effect.provideService(Metric.MetricRegistry, new Map()), Effect.provide(MemoryPlatform())))
})
