import { assert, describe, it } from "@effect/vitest"
import { Cause, DateTime, Duration, Effect, Fiber, Layer, Logger, Metric, Option, References } from "effect"
import { TestClock } from "effect/testing"
import { CurrentRun, type RunInfo } from "../../src/domain/Batch.ts"
import { PENDING_DIRECT_UPLOADS_KEY } from "../../src/domain/DirectUpload.ts"
import { LeaseLost } from "../../src/domain/Errors.ts"
import { MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { MemoryObjectStorage, putObjects } from "../../src/layers/memory/ObjectStorageMemory.ts"
import { StaleUploadRepairLive } from "../../src/layers/protocols/StaleUploadRepairLive.ts"
import { DeleteStaleDirectUploads } from "../../src/programs/DeleteStaleDirectUploads.ts"
import { EventLog } from "../../src/services/EventLog.ts"
import {
  directUploadsDeletedTotal,
  directUploadsSkippedNoStoreTotal,
  directUploadsVanishedTotal
} from "../../src/services/Metrics.ts"
import { PendingDirectUploads } from "../../src/services/PendingDirectUploads.ts"
import { StaleUploadRepair } from "../../src/services/StaleUploadRepair.ts"
import { runBatch } from "../../src/supervisor/RunGuard.ts"
import { MemoryPlatform } from "../support/memory.ts"

const NOW = DateTime.makeUnsafe("2026-03-01T12:00:00Z")
const NOW_SECONDS = DateTime.toEpochMillis(NOW) / 1000
/** The hash value of an upload prepared `seconds` ago. */
const preparedAgo = (seconds: number) => String(NOW_SECONDS - seconds)
const STALE = preparedAgo(4 * 3600)
const FRESH = preparedAgo(3600)

const seed = (entries: Record<string, string>) =>
  Effect.gen(function*() {
    yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
    const redis = yield* MemoryRedis
    redis.hset(PENDING_DIRECT_UPLOADS_KEY, entries)
  })

const hash = Effect.map(MemoryRedis, (redis) => redis.hgetall(PENDING_DIRECT_UPLOADS_KEY))

const vanishedTotal = Effect.map(Metric.value(directUploadsVanishedTotal), (state) => state.count)

/** The program as the run guard would give it `run`; the clock is already at NOW (`seed`). */
const runProgram = (run: Partial<RunInfo> = {}) =>
  Effect.gen(function*() {
    const defaults = yield* CurrentRun
    return yield* DeleteStaleDirectUploads.run.pipe(Effect.provideService(CurrentRun, { ...defaults, ...run }))
  })

const zero = {
  totalPendingEntries: 0,
  totalDeletedStaleEntries: 0,
  executionTimeout: false,
  invalidEntries: 0,
  failedDeletes: 0,
  skippedNoStore: 0,
  vanished: 0,
  heldMs: 0,
  heldBy: []
}

describe("delete-stale-direct-uploads", () => {
  it.effect("nothing to do: an empty hash", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
      assert.deepStrictEqual(yield* runProgram(), zero)
      assert.lengthOf(yield* MemoryEvents, 0)
      assert.lengthOf((yield* MemoryObjectStorage).deletes, 0)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("happy path: the stale object is deleted, then its field, then the event is recorded", () =>
    Effect.gen(function*() {
      yield* seed({ "artifacts:tmp/work/stale": STALE, "artifacts:tmp/work/fresh": FRESH })
      const storage = yield* MemoryObjectStorage
      putObjects(storage, "artifacts", "tmp/work/stale", "tmp/work/fresh")
      const redis = yield* MemoryRedis
      const events = yield* MemoryEvents
      const seenAtDelete: Array<{ fieldPresent: boolean; events: number }> = []
      storage.onDelete = () =>
        seenAtDelete.push({
          fieldPresent: redis.hget(PENDING_DIRECT_UPLOADS_KEY, "artifacts:tmp/work/stale") !== null,
          events: events.length
        })

      const summary = yield* runProgram()
      assert.deepStrictEqual(summary, { ...zero, totalPendingEntries: 2, totalDeletedStaleEntries: 1 })
      assert.deepStrictEqual(seenAtDelete, [{ fieldPresent: true, events: 0 }])
      assert.deepStrictEqual(storage.deletes, [{ location: "artifacts", path: "tmp/work/stale", outcome: "deleted" }])
      assert.deepStrictEqual([...storage.stores.get("artifacts")!], ["tmp/work/fresh"])
      assert.deepStrictEqual(yield* hash, { "artifacts:tmp/work/fresh": FRESH })
      assert.deepStrictEqual(events.map((e) => [e.stream, e.type, e.data]), [[
        "direct_upload:artifacts:tmp/work/stale",
        "StaleDirectUploadDeleted",
        { location: "artifacts", path: "tmp/work/stale", preparedAt: NOW_SECONDS - 4 * 3600 }
      ]])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("boundary: exactly 3 h old stays, 3 h + 1 s is deleted, 3 h − 1 s stays", () =>
    Effect.gen(function*() {
      yield* seed({
        "uploads:exactly": preparedAgo(10800),
        "uploads:older": preparedAgo(10801),
        "uploads:younger": preparedAgo(10799)
      })
      putObjects(yield* MemoryObjectStorage, "uploads", "exactly", "older", "younger")
      const summary = yield* runProgram()
      assert.strictEqual(summary.totalDeletedStaleEntries, 1)
      assert.deepStrictEqual(Object.keys(yield* hash).sort(), ["uploads:exactly", "uploads:younger"])
      assert.deepStrictEqual([...(yield* MemoryObjectStorage).stores.get("uploads")!].sort(), ["exactly", "younger"])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a known location without a store configured: only the field is removed, counted as skippedNoStore", () =>
    Effect.gen(function*() {
      yield* seed({ "terraform_state:state/1": STALE, "artifacts:gone": STALE })
      putObjects(yield* MemoryObjectStorage, "artifacts")
      const summary = yield* runProgram()
      assert.deepStrictEqual(summary, {
        ...zero,
        totalPendingEntries: 2,
        totalDeletedStaleEntries: 1,
        skippedNoStore: 1
      })
      const count = (metric: Metric.Counter<number>) => Effect.map(Metric.value(metric), (state) => state.count)
      assert.strictEqual(yield* count(directUploadsSkippedNoStoreTotal), 1)
      assert.strictEqual(yield* count(directUploadsDeletedTotal), 1)
      assert.deepStrictEqual(yield* hash, {})
      const storage = yield* MemoryObjectStorage
      assert.deepStrictEqual(storage.deletes.filter((d) => d.location === "terraform_state"), [{
        location: "terraform_state",
        path: "state/1",
        outcome: "unconfigured"
      }])
      // No object was deleted where no store is configured: its event says the entry alone went, and why.
      const events = (yield* MemoryEvents).map((e) => [e.stream, e.type, e.data.reason])
      assert.deepStrictEqual(events.sort(), [
        ["direct_upload:artifacts:gone", "StaleDirectUploadDeleted", undefined],
        ["direct_upload:terraform_state:state/1", "StaleDirectUploadEntryRemoved", "no object store"]
      ])
    }).pipe(Effect.provideService(Metric.MetricRegistry, new Map()), Effect.provide(MemoryPlatform())))

  it.effect("an object already gone counts as deleted", () =>
    Effect.gen(function*() {
      yield* seed({ "lfs:objects/ab/cd": STALE })
      putObjects(yield* MemoryObjectStorage, "lfs")
      const summary = yield* runProgram()
      assert.deepStrictEqual(summary, { ...zero, totalPendingEntries: 1, totalDeletedStaleEntries: 1 })
      assert.deepStrictEqual(yield* hash, {})
      assert.deepStrictEqual((yield* MemoryObjectStorage).deletes.map((d) => d.outcome), ["missing"])
      assert.lengthOf(yield* MemoryEvents, 1)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a storage error keeps that field (nothing lost) and the run continues", () =>
    Effect.gen(function*() {
      yield* seed({ "packages:a": STALE, "packages:b": STALE, "packages:c": STALE })
      const storage = yield* MemoryObjectStorage
      putObjects(storage, "packages", "a", "b", "c")
      storage.failures.set("packages:b", "503 Service Unavailable")
      const summary = yield* runProgram()
      assert.deepStrictEqual(summary, {
        ...zero,
        totalPendingEntries: 3,
        totalDeletedStaleEntries: 2,
        failedDeletes: 1
      })
      assert.deepStrictEqual(yield* hash, { "packages:b": STALE })
      assert.deepStrictEqual([...storage.stores.get("packages")!], ["b"])
      assert.deepStrictEqual(storage.deletes.map((d) => [d.path, d.outcome]), [["a", "deleted"], ["b", "failed"], [
        "c",
        "deleted"
      ]])
      assert.deepStrictEqual((yield* MemoryEvents).map((e) => e.data.path), ["a", "c"])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("the repair step runs readsDone after its re-read, before its first write", () =>
    Effect.gen(function*() {
      yield* seed({ "artifacts:ahead/a": STALE })
      const storage = yield* MemoryObjectStorage
      putObjects(storage, "artifacts", "ahead/a")
      const events = yield* EventLog
      const pending = yield* PendingDirectUploads
      const log: Array<string> = []
      const repairs = yield* StaleUploadRepair.pipe(
        Effect.provide(Layer.fresh(StaleUploadRepairLive)),
        Effect.provideService(EventLog, {
          ...events,
          appendAll: (batch) => Effect.andThen(Effect.sync(() => log.push("events")), events.appendAll(batch))
        }),
        Effect.provideService(PendingDirectUploads, {
          ...pending,
          values: (fields) => Effect.andThen(Effect.sync(() => log.push("reread")), pending.values(fields)),
          removeUnchanged: (entries) =>
            Effect.andThen(Effect.sync(() => log.push("entries")), pending.removeUnchanged(entries))
        })
      )
      const field = new TextEncoder().encode("artifacts:ahead/a")
      const upload = { field, location: "artifacts", path: "ahead/a", preparedAt: Number(STALE) } as const
      const outcomes = yield* repairs.repair(
        [{ ...upload, value: new TextEncoder().encode(STALE) }],
        Effect.sync(() => log.push(`readsDone, ${storage.deletes.length} objects deleted`))
      )
      assert.deepStrictEqual(outcomes, ["deleted"])
      assert.deepStrictEqual(log, ["reread", "readsDone, 0 objects deleted", "events", "entries"])
    }).pipe(Effect.provide(MemoryPlatform())))

  // A crash (kill -9) is the process stopping between two steps: here the next step dies instead.
  for (const crash of ["event", "entry"] as const) {
    it.effect(`a crash before the ${crash} step leaves the entry; the next run writes the event (never none)`, () =>
      Effect.gen(function*() {
        yield* seed({ "artifacts:crash/a": STALE })
        putObjects(yield* MemoryObjectStorage, "artifacts", "crash/a")
        const events = yield* EventLog
        const pending = yield* PendingDirectUploads
        const killed = Effect.die(new Error("kill -9"))
        // The repair step is built over the crashing backend, as the composition root builds it over the real ones.
        const crashed = yield* Effect.exit(
          runProgram().pipe(
            Effect.provide(Layer.fresh(StaleUploadRepairLive)),
            crash === "event"
              ? Effect.provideService(EventLog, { ...events, append: () => killed, appendAll: () => killed })
              : Effect.provideService(PendingDirectUploads, {
                ...pending,
                remove: () => killed,
                removeUnchanged: () => killed
              })
          )
        )
        assert.isTrue(crashed._tag === "Failure")
        assert.deepStrictEqual(Object.keys(yield* hash), ["artifacts:crash/a"], "the entry outlives the crash")
        assert.lengthOf(yield* MemoryEvents, crash === "event" ? 0 : 1)

        const summary = yield* runProgram()
        assert.deepStrictEqual(summary, { ...zero, totalPendingEntries: 1, totalDeletedStaleEntries: 1 })
        assert.deepStrictEqual(yield* hash, {})
        assert.deepStrictEqual((yield* MemoryObjectStorage).deletes.map((d) => d.outcome), ["deleted", "missing"])
        const recorded = (yield* MemoryEvents).map((e) => e.stream)
        assert.deepStrictEqual(
          recorded,
          Array.from({ length: crash === "event" ? 1 : 2 }, () => "direct_upload:artifacts:crash/a")
        )
      }).pipe(Effect.provide(MemoryPlatform())))
  }

  it.effect("a lost lease stops the run before the next repair: nothing more is deleted or recorded", () =>
    Effect.gen(function*() {
      yield* seed({ "artifacts:f/1": STALE, "artifacts:f/2": STALE, "artifacts:f/3": STALE })
      const storage = yield* MemoryObjectStorage
      putObjects(storage, "artifacts", "f/1", "f/2", "f/3")
      let held = true
      // The lease is taken away during the first delete.
      storage.onDelete = () => void (held = false)
      const fence = {
        lease: "sweeper/delete_stale_direct_uploads",
        epoch: 1,
        check: Effect.suspend(() =>
          held ? Effect.void : Effect.fail(new LeaseLost({ lease: "sweeper/delete_stale_direct_uploads", epoch: 1 }))
        )
      }
      const exit = yield* Effect.exit(runProgram({ fence: Option.some(fence) }))
      assert.isTrue(
        exit._tag === "Failure" && Cause.findErrorOption(exit.cause).pipe(Option.exists((e) => e instanceof LeaseLost))
      )
      assert.lengthOf(storage.deletes, 1)
      assert.lengthOf(
        Object.keys(yield* hash),
        2,
        "the first entry, once its event is written, is removed; the others stay"
      )
      assert.lengthOf(yield* MemoryEvents, 1)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("malformed entries are kept, counted, and logged once with a sample", () =>
    Effect.gen(function*() {
      const malformed = {
        "artifacts:tmp/bad-value": "yesterday",
        "no-colon-at-all": STALE,
        "avatars:tmp/x": STALE
      }
      yield* seed({ ...malformed, "artifacts:tmp/good": STALE })
      putObjects(yield* MemoryObjectStorage, "artifacts")
      const logs: Array<{ level: string; message: string; annotations: unknown }> = []
      const collector = Logger.make((options) => {
        logs.push({
          level: options.logLevel,
          message: String(options.message),
          annotations: options.fiber.getRef(References.CurrentLogAnnotations)
        })
      })
      const summary = yield* runProgram().pipe(Effect.provide(Logger.layer([collector])))
      assert.deepStrictEqual(summary, {
        ...zero,
        totalPendingEntries: 4,
        totalDeletedStaleEntries: 1,
        invalidEntries: 3
      })
      assert.deepStrictEqual(yield* hash, malformed)
      assert.deepStrictEqual((yield* MemoryObjectStorage).deletes.map((d) => d.path), ["tmp/good"])
      const warnings = logs.filter((log) => log.level === "Warn")
      assert.lengthOf(warnings, 1)
      assert.match(warnings[0]!.message, /malformed/)
      const annotations = warnings[0]!.annotations as { invalid_entries: number; sample: Array<{ reason: string }> }
      assert.strictEqual(annotations.invalid_entries, 3)
      assert.deepStrictEqual(annotations.sample.map((s) => s.reason), [
        "non_numeric_value",
        "no_colon",
        "unknown_location"
      ])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a path containing further colons is kept whole", () =>
    Effect.gen(function*() {
      yield* seed({ "external_diffs:merge_request_diffs/mr-1:diff-2:v3": STALE })
      const storage = yield* MemoryObjectStorage
      putObjects(storage, "external_diffs", "merge_request_diffs/mr-1:diff-2:v3", "merge_request_diffs/mr-1")
      yield* runProgram()
      assert.deepStrictEqual([...storage.stores.get("external_diffs")!], ["merge_request_diffs/mr-1"])
      assert.deepStrictEqual(yield* hash, {})
      const [event] = yield* MemoryEvents
      assert.strictEqual(event!.stream, "direct_upload:external_diffs:merge_request_diffs/mr-1:diff-2:v3")
      assert.strictEqual(event!.data.path, "merge_request_diffs/mr-1:diff-2:v3")
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("budget: slow deletes stop the run once 250 s have elapsed, leaving the rest for the next run", () =>
    Effect.gen(function*() {
      const entries = Object.fromEntries(Array.from({ length: 6 }, (_, i) => [`ci_secure_files:f${i}`, STALE]))
      yield* seed(entries)
      const storage = yield* MemoryObjectStorage
      putObjects(storage, "ci_secure_files", ...Object.keys(entries).map((field) => field.split(":")[1]!))
      storage.latency = Duration.seconds(100)
      const fiber = yield* Effect.forkChild(runProgram())
      yield* TestClock.adjust("20 minutes")
      const summary = yield* Fiber.join(fiber)
      // 100 s, 200 s, 300 s ≥ 250 s: three entries, then stop.
      assert.deepStrictEqual(summary, {
        ...zero,
        totalPendingEntries: 6,
        totalDeletedStaleEntries: 3,
        executionTimeout: true
      })
      assert.deepStrictEqual(Object.keys(yield* hash), [
        "ci_secure_files:f3",
        "ci_secure_files:f4",
        "ci_secure_files:f5"
      ])
      assert.lengthOf(storage.deletes, 3)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("budget 0s handles exactly one entry, even one that is not stale", () =>
    Effect.gen(function*() {
      yield* seed({ "pages:fresh": FRESH, "pages:a": STALE, "pages:b": STALE })
      const summary = yield* runProgram({ budget: Option.some(Duration.zero) })
      assert.deepStrictEqual(summary, { ...zero, totalPendingEntries: 3, executionTimeout: true })
      assert.lengthOf(Object.keys(yield* hash), 3)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("budget 0s with a stale first entry deletes exactly that one", () =>
    Effect.gen(function*() {
      yield* seed({ "pages:a": STALE, "pages:b": STALE, "pages:c": STALE })
      putObjects(yield* MemoryObjectStorage, "pages")
      const summary = yield* runProgram({ budget: Option.some(Duration.zero) })
      assert.deepStrictEqual(summary, {
        ...zero,
        totalPendingEntries: 3,
        totalDeletedStaleEntries: 1,
        executionTimeout: true
      })
      assert.deepStrictEqual(Object.keys(yield* hash), ["pages:b", "pages:c"])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a run that finishes within its budget is not a timeout", () =>
    Effect.gen(function*() {
      yield* seed({ "pages:a": STALE, "pages:b": STALE })
      const storage = yield* MemoryObjectStorage
      putObjects(storage, "pages", "a", "b")
      storage.latency = Duration.seconds(100)
      const fiber = yield* Effect.forkChild(runProgram())
      yield* TestClock.adjust("10 minutes")
      const summary = yield* Fiber.join(fiber)
      assert.deepStrictEqual(summary, { ...zero, totalPendingEntries: 2, totalDeletedStaleEntries: 2 })
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("dry run: counts what would be deleted, deletes nothing", () =>
    Effect.gen(function*() {
      yield* seed({
        "artifacts:a": STALE,
        "artifacts:b": STALE,
        "artifacts:fresh": FRESH,
        "bad": STALE,
        "pages:no-store": STALE
      })
      const storage = yield* MemoryObjectStorage
      putObjects(storage, "artifacts", "a", "b", "fresh")
      const summary = yield* runProgram({ dryRun: true })
      assert.deepStrictEqual(summary, {
        ...zero,
        totalPendingEntries: 5,
        totalDeletedStaleEntries: 2,
        invalidEntries: 1,
        skippedNoStore: 1
      })
      assert.lengthOf(Object.keys(yield* hash), 5)
      assert.lengthOf(storage.deletes, 0)
      assert.strictEqual(storage.stores.get("artifacts")!.size, 3)
      assert.lengthOf(yield* MemoryEvents, 0)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("race: an upload that completes just as its object is deleted: the deletion is recorded, once", () =>
    Effect.gen(function*() {
      yield* seed({ "artifacts:racing": STALE })
      const storage = yield* MemoryObjectStorage
      const redis = yield* MemoryRedis
      putObjects(storage, "artifacts")
      // GitLab's side completes the upload (HDEL) just as we delete the object, after our compare.
      storage.onDelete = () => void redis.hdel(PENDING_DIRECT_UPLOADS_KEY, "artifacts:racing")
      const vanishedBefore = yield* vanishedTotal
      const summary = yield* runProgram()
      // The object went (it was missing here, which counts as deleted): its event says so.
      assert.deepStrictEqual(summary, { ...zero, totalPendingEntries: 1, totalDeletedStaleEntries: 1 })
      assert.deepStrictEqual((yield* MemoryEvents).map((e) => e.data.path), ["racing"])
      assert.strictEqual((yield* vanishedTotal) - vanishedBefore, 0)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("an upload that completed before its step is vanished: its object is left alone, nothing recorded", () =>
    Effect.gen(function*() {
      yield* seed({ "artifacts:done": STALE })
      const storage = yield* MemoryObjectStorage
      putObjects(storage, "artifacts", "done")
      const redis = yield* MemoryRedis
      const vanishedBefore = yield* vanishedTotal
      // Completed between the read (HSCAN) and the step's compare.
      const pending = yield* PendingDirectUploads
      const summary = yield* runProgram().pipe(
        Effect.provide(Layer.fresh(StaleUploadRepairLive)),
        Effect.provideService(PendingDirectUploads, {
          ...pending,
          values: (fields) =>
            Effect.andThen(
              Effect.sync(() => redis.hdel(PENDING_DIRECT_UPLOADS_KEY, "artifacts:done")),
              pending.values(fields)
            )
        })
      )
      assert.deepStrictEqual(summary, { ...zero, totalPendingEntries: 1, vanished: 1 })
      assert.isTrue(storage.stores.get("artifacts")!.has("done"))
      assert.lengthOf(storage.deletes, 0)
      assert.lengthOf(yield* MemoryEvents, 0)
      assert.strictEqual((yield* vanishedTotal) - vanishedBefore, 1)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("race: a field re-registered (new value) just as its object is deleted stays; the deletion is recorded", () =>
    Effect.gen(function*() {
      yield* seed({ "artifacts:again": STALE, "artifacts:other": STALE })
      const storage = yield* MemoryObjectStorage
      putObjects(storage, "artifacts", "again", "other")
      const redis = yield* MemoryRedis
      storage.onDelete = (_, path) => {
        if (path === "again") redis.hset(PENDING_DIRECT_UPLOADS_KEY, { "artifacts:again": FRESH })
      }
      const summary = yield* runProgram()
      assert.deepStrictEqual(summary, { ...zero, totalPendingEntries: 2, totalDeletedStaleEntries: 2 })
      assert.deepStrictEqual(yield* hash, { "artifacts:again": FRESH })
      assert.deepStrictEqual((yield* MemoryEvents).map((e) => e.data.path).toSorted(), ["again", "other"])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("page-sized steps: 2,000 stale entries take a handful of bulk deletes, INSERTs and compare-and-deletes, in that order per step", () =>
    Effect.gen(function*() {
      const entries = Object.fromEntries(Array.from({ length: 2000 }, (_, i) => [`uploads:p/${i}`, STALE]))
      yield* seed(entries)
      putObjects(yield* MemoryObjectStorage, "uploads")
      const events = yield* EventLog
      const pending = yield* PendingDirectUploads
      const calls: Array<string> = []
      const sizes: Array<number> = []
      const summary = yield* runProgram().pipe(
        // The repair step over the counting backends.
        Effect.provide(Layer.fresh(StaleUploadRepairLive)),
        Effect.provideService(EventLog, {
          ...events,
          append: (event) => Effect.andThen(Effect.sync(() => calls.push("append")), events.append(event)),
          appendAll: (batch) => Effect.andThen(Effect.sync(() => calls.push("appendAll")), events.appendAll(batch))
        }),
        Effect.provideService(PendingDirectUploads, {
          ...pending,
          remove: (field) => Effect.andThen(Effect.sync(() => calls.push("remove")), pending.remove(field)),
          removeUnchanged: (batch) =>
            Effect.andThen(
              Effect.sync(() => {
                calls.push("removeUnchanged")
                sizes.push(batch.length)
              }),
              pending.removeUnchanged(batch)
            )
        })
      )
      assert.deepStrictEqual(summary, { ...zero, totalPendingEntries: 2000, totalDeletedStaleEntries: 2000 })
      assert.deepStrictEqual(yield* hash, {})
      assert.lengthOf(yield* MemoryEvents, 2000)
      // Steps of 1, 8, 64, 512, then the rest of the page (up to SCAN_PAGE_SIZE): no per-entry
      // writes, and far fewer than one call per entry.
      assert.notInclude(calls, "append")
      assert.notInclude(calls, "remove")
      assert.deepStrictEqual(sizes, [1, 8, 64, 512, 2000 - 1 - 8 - 64 - 512])
      assert.deepStrictEqual(calls, sizes.flatMap(() => ["appendAll", "removeUnchanged"]))
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("many entries across HSCAN pages, half of them stale: each handled once", () =>
    Effect.gen(function*() {
      const entries = Object.fromEntries(
        Array.from({ length: 750 }, (_, i) => [`uploads:u/${i}`, i % 2 === 0 ? STALE : FRESH])
      )
      yield* seed(entries)
      const storage = yield* MemoryObjectStorage
      putObjects(storage, "uploads")
      const summary = yield* runProgram()
      assert.deepStrictEqual(summary, { ...zero, totalPendingEntries: 750, totalDeletedStaleEntries: 375 })
      assert.strictEqual(new Set(storage.deletes.map((d) => d.path)).size, 375)
      assert.lengthOf(storage.deletes, 375)
      assert.lengthOf(Object.keys(yield* hash), 375)
    }).pipe(Effect.provide(MemoryPlatform())))
})

describe("delete-stale-direct-uploads under the run guard", () => {
  it.effect("takes no lease; the batch budget reaches the program; RunFinished carries the summary", () =>
    Effect.gen(function*() {
      yield* seed({ "artifacts:a": STALE, "artifacts:b": STALE })
      putObjects(yield* MemoryObjectStorage, "artifacts", "a", "b")
      const result = yield* runBatch(DeleteStaleDirectUploads, { trigger: "manual", budget: Duration.zero })
      assert.strictEqual(result.outcome, "succeeded")
      assert.deepStrictEqual(result.summary, {
        ...zero,
        totalPendingEntries: 2,
        totalDeletedStaleEntries: 1,
        executionTimeout: true
      })
      const events = yield* MemoryEvents
      assert.deepStrictEqual(events.map((e) => e.type), ["RunStarted", "StaleDirectUploadDeleted", "RunFinished"])
      assert.isTrue(events.every((e) => e.runId === result.runId))
      assert.deepStrictEqual(events[2]!.data.summary, result.summary)
      assert.deepStrictEqual((yield* MemoryRedis).keys("gitlab:exclusive_lease:*"), [])
    }).pipe(Effect.provide(MemoryPlatform())))

  it("is registered with GitLab's schedule and budget", () => {
    assert.strictEqual(DeleteStaleDirectUploads.cron, "*/6 * * * *")
    assert.strictEqual(Duration.toSeconds(DeleteStaleDirectUploads.budget), 250)
    // Single flight cluster-wide: an exclusive lease outliving the 250 s budget + grace.
    const lease = Option.getOrThrow(DeleteStaleDirectUploads.lease)
    assert.strictEqual(lease.name, "sweeper/delete_stale_direct_uploads")
    assert.isAbove(Duration.toSeconds(lease.ttl), 280)
  })
})
