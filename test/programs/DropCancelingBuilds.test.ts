import { assert, describe, it } from "@effect/vitest"
import { DateTime, Duration, Effect, Logger, Option, References } from "effect"
import { TestClock } from "effect/testing"
import { leaseKey } from "../../src/domain/Lease.ts"
import { type BuildRecord, MemoryBuilds } from "../../src/layers/memory/BuildsMemory.ts"
import { MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { DropCancelingBuilds } from "../../src/programs/DropCancelingBuilds.ts"
import { HealthGate, openGate } from "../../src/services/HealthGate.ts"
import { Lease } from "../../src/services/Lease.ts"
import { runBatch } from "../../src/supervisor/RunGuard.ts"
import { MemoryPlatform } from "../support/memory.ts"

const NOW = DateTime.makeUnsafe("2026-03-01T12:00:00Z")
const ago = (d: Duration.Input) => DateTime.subtractDuration(NOW, Duration.fromInputUnsafe(d))

let nextId = 1
const build = (overrides: Partial<BuildRecord> = {}): BuildRecord => ({
  id: nextId++,
  projectId: 1,
  runnerId: 7,
  type: "Ci::Build",
  status: "canceling",
  failureReason: null,
  lockVersion: 0,
  createdAt: ago("2 hours"),
  updatedAt: ago("2 hours"),
  finishedAt: null,
  ...overrides
})

const seed = (...rows: ReadonlyArray<BuildRecord>) =>
  Effect.gen(function*() {
    yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
    const state = yield* MemoryBuilds
    for (const row of rows) state.rows.set(row.id, row)
  })

const statusOf = (id: number) => Effect.map(MemoryBuilds, (s) => s.rows.get(id)!)

const runProgram = Effect.gen(function*() {
  yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
  return yield* DropCancelingBuilds.run
})

describe("drop-canceling-builds", () => {
  it.effect("nothing to do: no canceling builds", () =>
    Effect.gen(function*() {
      yield* seed(build({ status: "running" }))
      const summary = yield* runProgram
      assert.deepStrictEqual(summary, { dropped: 0, doomed: 0, batches: 0, skippedLocked: 0, heldMs: 0, heldBy: [] })
      assert.lengthOf(yield* MemoryEvents, 0)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("happy path: fails stuck builds with stuck_or_timeout_failure and records an event each", () =>
    Effect.gen(function*() {
      const stuck = build({ runnerId: 42, lockVersion: 3 })
      yield* seed(stuck)
      const summary = yield* runProgram
      assert.deepStrictEqual(summary, { dropped: 1, doomed: 0, batches: 1, skippedLocked: 0, heldMs: 0, heldBy: [] })
      const row = yield* statusOf(stuck.id)
      assert.strictEqual(row.status, "failed")
      assert.strictEqual(row.failureReason, 3)
      assert.strictEqual(row.lockVersion, 4)
      assert.isTrue(DateTime.Equivalence(row.finishedAt!, NOW))
      assert.isTrue(DateTime.Equivalence(row.updatedAt, NOW))
      const events = yield* MemoryEvents
      assert.deepStrictEqual(events.map((e) => [e.stream, e.type, e.data]), [
        [`build:${stuck.id}`, "BuildDropped", { id: stuck.id, project_id: 1, runner_id: 42, failure_reason: 3 }]
      ])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("threshold is strict: exactly 1 h old stays, 1 h + 1 s is dropped, 1 h − 1 s stays", () =>
    Effect.gen(function*() {
      const exactly = build({ createdAt: ago("1 hour"), updatedAt: ago("1 hour") })
      const older = build({ createdAt: ago("3601 seconds"), updatedAt: ago("3601 seconds") })
      const younger = build({ createdAt: ago("3599 seconds"), updatedAt: ago("3599 seconds") })
      yield* seed(exactly, older, younger)
      const summary = yield* runProgram
      assert.strictEqual(summary.dropped, 1)
      assert.strictEqual((yield* statusOf(older.id)).status, "failed")
      assert.strictEqual((yield* statusOf(exactly.id)).status, "canceling")
      assert.strictEqual((yield* statusOf(younger.id)).status, "canceling")
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("an old build updated recently is left alone (both timestamps must be old)", () =>
    Effect.gen(function*() {
      const touched = build({ createdAt: ago("5 hours"), updatedAt: ago("10 minutes") })
      yield* seed(touched)
      assert.strictEqual((yield* runProgram).dropped, 0)
      assert.strictEqual((yield* statusOf(touched.id)).status, "canceling")
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("other statuses and bridges are untouched", () =>
    Effect.gen(function*() {
      const others = ["created", "pending", "running", "success", "failed", "canceled", "manual"].map((status) =>
        build({ status })
      )
      const bridge = build({ type: "Ci::Bridge" })
      yield* seed(...others, bridge)
      assert.strictEqual((yield* runProgram).dropped, 0)
      for (const row of [...others, bridge]) {
        const after = yield* statusOf(row.id)
        assert.strictEqual(after.status, row.status)
        assert.strictEqual(after.lockVersion, 0)
      }
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a lock conflict is retried with the re-read row and then dropped", () =>
    Effect.gen(function*() {
      const contended = build()
      yield* seed(contended)
      const state = yield* MemoryBuilds
      state.conflicts.set(contended.id, 2)
      const summary = yield* runProgram
      assert.deepStrictEqual(summary, { dropped: 1, doomed: 0, batches: 1, skippedLocked: 0, heldMs: 0, heldBy: [] })
      const row = yield* statusOf(contended.id)
      assert.strictEqual(row.failureReason, 3)
      assert.strictEqual(row.lockVersion, 3) // two concurrent bumps, then ours
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("three lock conflicts are three retries: the fourth attempt drops it (GitLab's retry_lock(build, 3))", () =>
    Effect.gen(function*() {
      const contended = build()
      yield* seed(contended)
      const state = yield* MemoryBuilds
      state.conflicts.set(contended.id, 3)
      const summary = yield* runProgram
      assert.deepStrictEqual(summary, { dropped: 1, doomed: 0, batches: 1, skippedLocked: 0, heldMs: 0, heldBy: [] })
      const row = yield* statusOf(contended.id)
      assert.strictEqual(row.failureReason, 3)
      assert.strictEqual(row.lockVersion, 4) // three concurrent bumps, then ours
      assert.strictEqual(state.transactions, 4) // the page, then one per retry
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a build that conflicts on every attempt (one plus three retries) is doomed with data_integrity_failure", () =>
    Effect.gen(function*() {
      const hopeless = build()
      yield* seed(hopeless)
      const state = yield* MemoryBuilds
      state.conflicts.set(hopeless.id, 4)
      const summary = yield* runProgram
      assert.deepStrictEqual(summary, { dropped: 0, doomed: 1, batches: 1, skippedLocked: 0, heldMs: 0, heldBy: [] })
      const row = yield* statusOf(hopeless.id)
      assert.strictEqual(row.status, "failed")
      assert.strictEqual(row.failureReason, 12)
      const events = yield* MemoryEvents
      assert.deepStrictEqual(events.map((e) => e.type), ["BuildDoomed"])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a build that finished while we retried is neither dropped nor doomed", () =>
    Effect.gen(function*() {
      const racing = build()
      yield* seed(racing)
      const state = yield* MemoryBuilds
      state.conflicts.set(racing.id, 1)
      // The concurrent writer also moved it to canceled.
      const original = state.rows.get(racing.id)!
      state.rows.set(
        racing.id,
        new Proxy(original, {
          get: (target, key) => key === "status" && target.lockVersion > 0 ? "canceled" : Reflect.get(target, key)
        })
      )
      const summary = yield* runProgram
      assert.deepStrictEqual(summary, { dropped: 0, doomed: 0, batches: 1, skippedLocked: 0, heldMs: 0, heldBy: [] })
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("250 stuck builds: three keyset batches of at most 100, each build exactly once", () =>
    Effect.gen(function*() {
      const rows = Array.from(
        { length: 250 },
        (_, i) => build({ projectId: i % 7, createdAt: ago(`${7200 + (i % 13)} seconds`) })
      )
      yield* seed(...rows)
      const summary = yield* runProgram
      assert.deepStrictEqual(summary, { dropped: 250, doomed: 0, batches: 3, skippedLocked: 0, heldMs: 0, heldBy: [] })
      const state = yield* MemoryBuilds
      assert.deepStrictEqual(state.pages.map((page) => page.length), [100, 100, 50])
      assert.strictEqual(state.transactions, 3) // one per page at the default 100
      const seen = state.pages.flat()
      assert.strictEqual(new Set(seen).size, 250)
      const events = yield* MemoryEvents
      assert.strictEqual(new Set(events.map((e) => e.stream)).size, 250)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a page is one transaction; rows that lost the race are re-read, retried and doomed one by one as before", () =>
    Effect.gen(function*() {
      const plain = [build(), build(), build()]
      const retried = build({ runnerId: 11 }) // lock_version bumped once between read and write
      const hopeless = build({ runnerId: 12 }) // bumped at every attempt
      const finished = build({ runnerId: 13 }) // moved out of canceling between read and write
      yield* seed(plain[0]!, retried, plain[1]!, hopeless, finished, plain[2]!)
      const state = yield* MemoryBuilds
      state.conflicts.set(retried.id, 1)
      state.conflicts.set(hopeless.id, 4)
      const original = state.rows.get(finished.id)!
      state.rows.set(
        finished.id,
        new Proxy(original, {
          get: (target, key) => key === "status" && state.pages.length > 0 ? "canceled" : Reflect.get(target, key)
        })
      )
      const summary = yield* runProgram
      assert.deepStrictEqual(summary, { dropped: 4, doomed: 1, batches: 1, skippedLocked: 0, heldMs: 0, heldBy: [] })
      // The page (1) + retried's second attempt (1) + hopeless's attempts 2 to 4 (3) + its doom (1).
      assert.strictEqual(state.transactions, 6)
      for (const row of plain) assert.strictEqual((yield* statusOf(row.id)).lockVersion, 1)
      assert.strictEqual((yield* statusOf(retried.id)).failureReason, 3)
      assert.strictEqual((yield* statusOf(retried.id)).lockVersion, 2) // the concurrent bump, then ours
      assert.strictEqual((yield* statusOf(hopeless.id)).failureReason, 12)
      assert.strictEqual(original.status, "canceling") // ours never wrote it
      assert.strictEqual(original.lockVersion, 0)
      const events = yield* MemoryEvents
      // The page's drops commit together, in page order; the retried ones follow.
      assert.deepStrictEqual(events.map((e) => [e.type, e.data.id]), [
        ["BuildDropped", plain[0]!.id],
        ["BuildDropped", plain[1]!.id],
        ["BuildDropped", plain[2]!.id],
        ["BuildDropped", retried.id],
        ["BuildDoomed", hopeless.id]
      ])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a build another transaction holds is skipped and counted, never waited for nor doomed; the next run drops it", () =>
    Effect.gen(function*() {
      const free = [build(), build()]
      const held = build({ runnerId: 21 }) // held when the page is written
      const heldOnRetry = build({ runnerId: 22 }) // lost the page's race, then held when retried
      yield* seed(free[0]!, held, heldOnRetry, free[1]!)
      const state = yield* MemoryBuilds
      state.locked.add(held.id)
      state.locked.add(heldOnRetry.id)
      state.conflicts.set(heldOnRetry.id, 1)
      const summary = yield* runProgram
      assert.deepStrictEqual(summary, { dropped: 2, doomed: 0, batches: 1, skippedLocked: 2, heldMs: 0, heldBy: [] })
      // The page, then heldOnRetry's one retry, which found it held: no further attempt, no doom.
      assert.strictEqual(state.transactions, 2)
      assert.strictEqual((yield* statusOf(held.id)).status, "canceling")
      assert.strictEqual((yield* statusOf(heldOnRetry.id)).status, "canceling")
      assert.deepStrictEqual((yield* MemoryEvents).map((e) => e.data.id), [free[0]!.id, free[1]!.id])
      // The lock is gone: the next run drops both, each once.
      state.locked.clear()
      assert.deepStrictEqual(yield* runProgram, {
        dropped: 2,
        doomed: 0,
        batches: 1,
        skippedLocked: 0,
        heldMs: 0,
        heldBy: []
      })
      assert.deepStrictEqual((yield* MemoryEvents).map((e) => [e.type, e.data.id]), [
        ["BuildDropped", free[0]!.id],
        ["BuildDropped", free[1]!.id],
        ["BuildDropped", held.id],
        ["BuildDropped", heldOnRetry.id]
      ])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a build skipped as locked run after run is counted across runs and warned about from the 3rd", () =>
    Effect.gen(function*() {
      const stuck = build({ runnerId: 31 })
      yield* seed(stuck)
      ;(yield* MemoryBuilds).locked.add(stuck.id)
      const warnings: Array<{ message: string; annotations: Record<string, unknown> }> = []
      const collector = Logger.make((options) => {
        if (options.logLevel !== "Warn") return
        const annotations = options.fiber.getRef(References.CurrentLogAnnotations) as Record<string, unknown>
        const message = Array.isArray(options.message) ? options.message : [options.message]
        warnings.push({ message: String(message[0]), annotations: { ...annotations, ...message[1] } })
      })
      for (let run = 1; run <= 4; run++) {
        yield* runProgram.pipe(Effect.provide(Logger.layer([collector])))
        yield* TestClock.adjust("1 hour")
      }
      const locked = warnings.filter((w) => w.message.includes("locked"))
      assert.deepStrictEqual(locked.map((w) => [w.annotations.build_id, w.annotations.runs]), [
        [stuck.id, 3],
        [stuck.id, 4]
      ])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("SWEEPER_DROP_BATCH_SIZE: pages of that size, one write transaction per page", () =>
    Effect.gen(function*() {
      yield* seed(...Array.from({ length: 20 }, (_, i) => build({ projectId: i })))
      const summary = yield* runProgram
      assert.deepStrictEqual(summary, { dropped: 20, doomed: 0, batches: 3, skippedLocked: 0, heldMs: 0, heldBy: [] })
      const state = yield* MemoryBuilds
      assert.deepStrictEqual(state.pages.map((page) => page.length), [7, 7, 6])
      assert.strictEqual(state.transactions, 3)
      assert.lengthOf(yield* MemoryEvents, 20)
    }).pipe(Effect.provide(MemoryPlatform({ dropBatchSize: 7 }))))

  it.effect("GitLab's Dropping outdated build line: one per page, carrying every build's id, runner and status", () =>
    Effect.gen(function*() {
      const rows = Array.from({ length: 10 }, (_, i) => build({ projectId: i, runnerId: 100 + i }))
      yield* seed(...rows)
      const lines: Array<Record<string, unknown>> = []
      const collector = Logger.make((options) => {
        const message = Array.isArray(options.message) ? options.message : [options.message]
        if (message[0] === "Dropping outdated build") lines.push(message[1] as Record<string, unknown>)
      })
      yield* runProgram.pipe(Effect.provide(Logger.layer([collector])))
      // Pages of 7: two lines, not ten, and together every build of the run in page order.
      assert.deepStrictEqual(lines.map((line) => [line.count, line.attempt, line.failure_reason]), [
        [7, 1, "stuck_or_timeout_failure"],
        [3, 1, "stuck_or_timeout_failure"]
      ])
      assert.deepStrictEqual(
        lines.flatMap((line) => line.builds as ReadonlyArray<unknown>),
        rows.map((row) => ({ build_id: row.id, runner_id: row.runnerId, status: "canceling" }))
      )
    }).pipe(Effect.provide(MemoryPlatform({ dropBatchSize: 7 }))))

  it.effect("a page exactly the batch size ends with one empty read, no extra transaction", () =>
    Effect.gen(function*() {
      yield* seed(...Array.from({ length: 14 }, () => build()))
      assert.deepStrictEqual(yield* runProgram, {
        dropped: 14,
        doomed: 0,
        batches: 2,
        skippedLocked: 0,
        heldMs: 0,
        heldBy: []
      })
      const state = yield* MemoryBuilds
      assert.deepStrictEqual(state.pages.map((page) => page.length), [7, 7, 0])
      assert.strictEqual(state.transactions, 2)
    }).pipe(Effect.provide(MemoryPlatform({ dropBatchSize: 7 }))))

  it.effect("keyset pages follow (created_at, project_id) order across batches", () =>
    Effect.gen(function*() {
      const rows = Array.from({ length: 120 }, (_, i) => build({ projectId: 200 - i, createdAt: ago("3 hours") }))
      yield* seed(...rows)
      yield* runProgram
      const state = yield* MemoryBuilds
      const order = state.pages.flat().map((id) => state.rows.get(id)!.projectId)
      assert.deepStrictEqual(order, [...order].sort((a, b) => a - b))
    }).pipe(Effect.provide(MemoryPlatform())))
})

describe("drop-canceling-builds under the run guard", () => {
  const guarded = (options: { dryRun?: boolean } = {}) =>
    Effect.gen(function*() {
      yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
      return yield* runBatch(DropCancelingBuilds, { trigger: "manual", ...options })
    })

  it.effect("health gate: asked before every page; held past the deadline → stops, the pages before it dropped, the hold in the summary", () =>
    Effect.gen(function*() {
      const rows = Array.from({ length: 250 }, () => build())
      yield* seed(...rows)
      let asked = 0
      const gate = {
        ...openGate,
        beforeUnit: ({ batch }: { batch: string }) =>
          Effect.succeed(
            batch === "drop-canceling-builds" && ++asked <= 2
              ? { proceed: true, heldMs: 700, heldBy: ["replicationLag"] }
              : { proceed: false, heldMs: 1000, heldBy: ["walRate"] }
          )
      }
      const summary = yield* runProgram.pipe(Effect.provideService(HealthGate, gate))
      assert.deepStrictEqual(summary, {
        dropped: 200,
        doomed: 0,
        batches: 2,
        skippedLocked: 0,
        heldMs: 2400,
        heldBy: ["replicationLag", "walRate"]
      })
      assert.strictEqual(asked, 3)
      assert.lengthOf([...(yield* MemoryBuilds).rows.values()].filter((row) => row.status === "canceling"), 50)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("lease held elsewhere → skipped, nothing changed", () =>
    Effect.gen(function*() {
      const stuck = build()
      yield* seed(stuck)
      const redis = yield* MemoryRedis
      redis.set(leaseKey("ci/stuck_builds/drop_canceling_worker"), "someone-else", { exSeconds: 1800 })
      const result = yield* guarded()
      assert.strictEqual(result.outcome, "skipped")
      assert.strictEqual(result.reason, "lease held")
      assert.strictEqual((yield* statusOf(stuck.id)).status, "canceling")
      const events = yield* MemoryEvents
      assert.deepStrictEqual(events.map((e) => e.type), ["RunStarted", "RunFinished"])
      assert.strictEqual(events[1]!.data.outcome, "skipped")
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("takes the 30 min lease for the run and releases it afterwards", () =>
    Effect.gen(function*() {
      yield* seed(build())
      const result = yield* guarded()
      assert.strictEqual(result.outcome, "succeeded")
      assert.deepStrictEqual(result.summary, {
        dropped: 1,
        doomed: 0,
        batches: 1,
        skippedLocked: 0,
        heldMs: 0,
        heldBy: []
      })
      const redis = yield* MemoryRedis
      assert.isFalse(redis.exists(leaseKey("ci/stuck_builds/drop_canceling_worker")))
      const events = yield* MemoryEvents
      assert.deepStrictEqual(events.map((e) => e.type), ["RunStarted", "BuildDropped", "RunFinished"])
      assert.isTrue(events.every((e) => e.runId === result.runId))
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("dry run: reports what would be dropped, changes nothing, takes no lease", () =>
    Effect.gen(function*() {
      const stuck = build()
      yield* seed(stuck)
      const redis = yield* MemoryRedis
      redis.set(leaseKey("ci/stuck_builds/drop_canceling_worker"), "someone-else", { exSeconds: 1800 })
      const result = yield* guarded({ dryRun: true })
      assert.strictEqual(result.outcome, "succeeded")
      assert.deepStrictEqual(result.summary, {
        dropped: 1,
        doomed: 0,
        batches: 1,
        skippedLocked: 0,
        heldMs: 0,
        heldBy: []
      })
      assert.strictEqual((yield* statusOf(stuck.id)).status, "canceling")
      const events = yield* MemoryEvents
      assert.deepStrictEqual(events.map((e) => [e.type, e.data.dryRun]), [["RunStarted", true], ["RunFinished", true]])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a holder whose lease was taken over stops at the next page (the fence is checked per transaction) and records LeaseLost", () =>
    Effect.gen(function*() {
      const rows = Array.from({ length: 5 }, () => build())
      yield* seed(...rows)
      const redis = yield* MemoryRedis
      const state = yield* MemoryBuilds
      // While the first page (2 builds) is written, the lease expires and another process takes it.
      const first = rows[0]!
      state.rows.set(
        first.id,
        new Proxy(first, {
          set: (target, key, value) => {
            if (key === "status" && value === "failed") {
              redis.set(leaseKey("ci/stuck_builds/drop_canceling_worker"), "other", { exSeconds: 1800 })
            }
            return Reflect.set(target, key, value)
          }
        })
      )
      const result = yield* guarded()
      assert.strictEqual(result.outcome, "failed")
      assert.strictEqual(result.reason, "lease lost")
      // The page whose fence was checked before the takeover commits whole; nothing after it.
      const failed = [...state.rows.values()].filter((row) => row.status === "failed").map((row) => row.id)
      assert.deepStrictEqual(failed, [rows[0]!.id, rows[1]!.id])
      const types = (yield* MemoryEvents).map((e) => e.type)
      assert.deepStrictEqual(types, ["RunStarted", "BuildDropped", "BuildDropped", "LeaseLost", "RunFinished"])
      // The other holder's lease is untouched by our release.
      assert.strictEqual(redis.get(leaseKey("ci/stuck_builds/drop_canceling_worker")), "other")
    }).pipe(Effect.provide(MemoryPlatform({ dropBatchSize: 2 }))))

  it.effect("the lease is renewed while a long run holds it", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
      const lease = yield* Lease
      const redis = yield* MemoryRedis
      const handle = Option.getOrThrow(yield* lease.tryAcquire("x", Duration.seconds(30)))
      yield* TestClock.adjust("29 seconds")
      assert.isTrue(yield* lease.renew(handle))
      yield* TestClock.adjust("29 seconds")
      assert.isTrue(redis.exists(leaseKey("x")))
      yield* TestClock.adjust("2 seconds")
      assert.isFalse(redis.exists(leaseKey("x")))
    }).pipe(Effect.provide(MemoryPlatform())))
})
