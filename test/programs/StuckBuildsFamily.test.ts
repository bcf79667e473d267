/**
 * The stuck-builds family's programs on memory layers under TestClock: each rule's boundary (one
 * second either side), GitLab's order of the pending rules, the reason sets, lock conflicts retried
 * then doomed, rows that cannot leave the scope counted and passed, the gate, lease and dry run
 * through the run guard.
 */
import { assert, describe, it } from "@effect/vitest"
import { DateTime, Duration, Effect, Option } from "effect"
import { TestClock } from "effect/testing"
import { CurrentRun } from "../../src/domain/Batch.ts"
import { leaseKey } from "../../src/domain/Lease.ts"
import { CurrentFailureReasonSet, RunnerProvisioningTimeoutReason } from "../../src/domain/StuckBuilds.ts"
import { MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { type FamilyBuildRecord, MemoryStuckBuilds } from "../../src/layers/memory/StuckBuildsMemory.ts"
import { DropPendingBuilds } from "../../src/programs/DropPendingBuilds.ts"
import { DropRunningBuilds } from "../../src/programs/DropRunningBuilds.ts"
import { DropScheduledBuilds } from "../../src/programs/DropScheduledBuilds.ts"
import { HealthGate, openGate } from "../../src/services/HealthGate.ts"
import { RunnerAckQueue } from "../../src/services/RunnerAckQueue.ts"
import { runBatch } from "../../src/supervisor/RunGuard.ts"
import { MemoryPlatform } from "../support/memory.ts"

const NOW = DateTime.makeUnsafe("2026-03-01T12:00:00Z")
const ago = (d: Duration.Input) => DateTime.subtractDuration(NOW, Duration.fromInputUnsafe(d))

let nextId = 1
const build = (overrides: Partial<FamilyBuildRecord> = {}): FamilyBuildRecord => ({
  id: nextId++,
  projectId: 1,
  runnerId: 7,
  status: "running",
  failureReason: null,
  lockVersion: 0,
  createdAt: ago("2 hours"),
  updatedAt: ago("2 hours"),
  scheduledAt: null,
  finishedAt: null,
  ...overrides
})

const seed = (...rows: ReadonlyArray<FamilyBuildRecord>) =>
  Effect.gen(function*() {
    yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
    const state = yield* MemoryStuckBuilds
    for (const row of rows) state.rows.set(row.id, row)
    return state
  })

const row = (id: number) => Effect.map(MemoryStuckBuilds, (s) => s.rows.get(id)!)
const summaryOf = <A>(program: Effect.Effect<A, unknown, any>) =>
  Effect.andThen(TestClock.setTime(DateTime.toEpochMillis(NOW)), program)

describe("drop-running-builds", () => {
  it.effect("an hour with no update: 1 h + 1 s dropped, exactly 1 h and 1 h − 1 s stay; complete builds untouched", () =>
    Effect.gen(function*() {
      const older = build({ createdAt: ago("3601 seconds"), updatedAt: ago("3601 seconds") })
      const exactly = build({ createdAt: ago("1 hour"), updatedAt: ago("1 hour") })
      const younger = build({ createdAt: ago("3599 seconds"), updatedAt: ago("3599 seconds") })
      const success = build({ status: "success", createdAt: ago("1 day"), updatedAt: ago("1 day") })
      yield* seed(older, exactly, younger, success)
      const summary = yield* summaryOf(DropRunningBuilds.run)
      assert.deepStrictEqual(summary, {
        dropped: 1,
        doomed: 0,
        batches: 1,
        skippedLocked: 0,
        refused: 0,
        heldMs: 0,
        heldBy: []
      })
      assert.deepStrictEqual([(yield* row(older.id)).status, (yield* row(older.id)).failureReason], ["failed", 3])
      for (const kept of [exactly, younger, success]) {
        assert.strictEqual((yield* row(kept.id)).failureReason, null)
      }
      const events = yield* MemoryEvents
      assert.deepStrictEqual(events.map((e) => [e.stream, e.type, e.data.stuck_type, e.data.rule]), [
        [`build:${older.id}`, "BuildDropped", "outdated", "running_outdated"]
      ])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("GitLab 19's reason set: no_updates_running (27)", () =>
    Effect.gen(function*() {
      const stale = build()
      yield* seed(stale)
      yield* summaryOf(DropRunningBuilds.run).pipe(Effect.provideService(CurrentFailureReasonSet, "gitlab-19"))
      assert.strictEqual((yield* row(stale.id)).failureReason, 27)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a row that keeps changing is retried three times, then doomed (data_integrity_failure)", () =>
    Effect.gen(function*() {
      const contended = build()
      const hopeless = build()
      const state = yield* seed(contended, hopeless)
      state.conflicts.set(contended.id, 2)
      state.conflicts.set(hopeless.id, 4)
      const summary = yield* summaryOf(DropRunningBuilds.run)
      assert.deepStrictEqual([summary.dropped, summary.doomed], [1, 1])
      assert.strictEqual((yield* row(contended.id)).failureReason, 3)
      assert.strictEqual((yield* row(hopeless.id)).failureReason, 12)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a locked row, a refused row and a zombie are counted and passed; the rest of every page is repaired", () =>
    Effect.gen(function*() {
      const rows = Array.from({ length: 250 }, () => build())
      const state = yield* seed(...rows)
      state.locked.add(rows[0]!.id)
      state.refused.add(rows[120]!.id)
      state.zombies.add(rows[249]!.id)
      const summary = yield* summaryOf(DropRunningBuilds.run)
      assert.deepStrictEqual([summary.dropped, summary.skippedLocked, summary.refused, summary.batches], [
        247,
        1,
        2,
        3
      ])
      // Each page read once: the walk never comes back to a row it passed.
      assert.deepStrictEqual(state.pages.map((p) => p.length), [100, 100, 50])
    }).pipe(Effect.provide(MemoryPlatform())))
})

describe("drop-pending-builds", () => {
  it.effect("outdated after a day whatever the runners; stuck after an hour only with no online runner", () =>
    Effect.gen(function*() {
      const dayOld = build({ status: "pending", createdAt: ago("86401 seconds"), updatedAt: ago("86401 seconds") })
      const dayExactly = build({ status: "pending", createdAt: ago("1 day"), updatedAt: ago("1 day") })
      const hourNoRunner = build({ status: "pending", createdAt: ago("3601 seconds"), updatedAt: ago("3601 seconds") })
      const hourExactly = build({ status: "pending", createdAt: ago("1 hour"), updatedAt: ago("1 hour") })
      const hourWithRunner = build({ status: "pending", createdAt: ago("2 hours"), updatedAt: ago("2 hours") })
      const state = yield* seed(dayOld, dayExactly, hourNoRunner, hourExactly, hourWithRunner)
      for (const b of [dayOld, dayExactly, hourWithRunner]) state.onlineRunner.add(b.id)
      const summary = yield* summaryOf(DropPendingBuilds.run).pipe(
        Effect.provideService(CurrentFailureReasonSet, "gitlab-19")
      )
      assert.strictEqual(summary.dropped, 2)
      assert.strictEqual((yield* row(dayOld.id)).failureReason, 25)
      assert.strictEqual((yield* row(hourNoRunner.id)).failureReason, 26)
      for (const kept of [dayExactly, hourExactly, hourWithRunner]) {
        assert.strictEqual((yield* row(kept.id)).status, "pending")
      }
      const events = yield* MemoryEvents
      assert.deepStrictEqual(events.map((e) => e.data.stuck_type), ["outdated", "stuck"])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("the two pending walks share the run's budget: spent in the first, the second never starts", () =>
    Effect.gen(function*() {
      const outdated = Array.from(
        { length: 150 },
        () => build({ status: "pending", createdAt: ago("2 days"), updatedAt: ago("2 days") })
      )
      const stuckOnly = build({ status: "pending", createdAt: ago("2 hours"), updatedAt: ago("2 hours") })
      const state = yield* seed(...outdated, stuckOnly)
      for (const b of outdated) state.onlineRunner.add(b.id)
      const summary = yield* summaryOf(DropPendingBuilds.run).pipe(
        Effect.provideService(CurrentRun, {
          runId: null,
          batch: DropPendingBuilds.name,
          dryRun: false,
          budget: Option.some(Duration.zero),
          fence: Option.none()
        })
      )
      assert.deepStrictEqual([summary.dropped, summary.batches], [100, 1])
      assert.strictEqual((yield* row(stuckOnly.id)).status, "pending")
    }).pipe(Effect.provide(MemoryPlatform())))
})

describe("drop-pending-builds: a runner assigned, its acknowledgement awaited", () => {
  // Created long ago but updated recently enough that neither the day nor the stuck rule applies.
  const assigned = (updated: Duration.Input, overrides: Partial<FamilyBuildRecord> = {}) =>
    build({ status: "pending", createdAt: ago("36 hours"), updatedAt: ago(updated), ...overrides })

  /** The operator named runner_provisioning_timeout's integer in their GitLab (24 in this test). */
  const named = Effect.provideService(RunnerProvisioningTimeoutReason, Option.some(24))

  it.effect("1 h + 1 s without update → runner_provisioning_timeout as named (24); exactly 1 h, 30 min, no runner stay", () =>
    Effect.gen(function*() {
      const stale = assigned("3601 seconds")
      const exactly = assigned("1 hour")
      const recent = assigned("30 minutes")
      const noRunner = assigned("2 hours", { runnerId: null })
      const state = yield* seed(stale, exactly, recent, noRunner)
      for (const b of [stale, exactly, recent, noRunner]) state.onlineRunner.add(b.id)
      const summary = yield* summaryOf(DropPendingBuilds.run)
      assert.strictEqual(summary.dropped, 1)
      assert.deepStrictEqual([(yield* row(stale.id)).status, (yield* row(stale.id)).failureReason], ["failed", 24])
      for (const kept of [exactly, recent, noRunner]) assert.strictEqual((yield* row(kept.id)).status, "pending")
      const events = yield* MemoryEvents
      assert.deepStrictEqual(events.map((e) => [e.data.stuck_type, e.data.rule]), [[
        "waiting_for_ack",
        "pending_waiting_for_ack"
      ]])
    }).pipe(named, Effect.provide(MemoryPlatform())))

  it.effect("runner_provisioning_timeout's integer not named: the rule is off, no guessed integer is written", () =>
    Effect.gen(function*() {
      const stale = assigned("3601 seconds")
      const state = yield* seed(stale)
      state.onlineRunner.add(stale.id)
      const summary = yield* summaryOf(DropPendingBuilds.run)
      assert.strictEqual(summary.dropped, 0)
      assert.deepStrictEqual([(yield* row(stale.id)).status, (yield* row(stale.id)).failureReason], ["pending", null])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("skipped while the runner's ack window is open, even across a whole page; dropped once it expires", () =>
    Effect.gen(function*() {
      // A full first page (100) of builds still awaiting their runner, then one that is not: the walk
      // passes the page without dropping any and still reaches the last one.
      const waiting = Array.from({ length: 100 }, () => assigned("2 hours"))
      const last = assigned("2 hours", { createdAt: ago("35 hours") })
      const state = yield* seed(...waiting, last)
      for (const b of [...waiting, last]) state.onlineRunner.add(b.id)
      const queue = yield* RunnerAckQueue
      for (const b of waiting) yield* queue.setWaiting(b.id, 900)
      const dry = yield* summaryOf(DropPendingBuilds.run).pipe(
        Effect.provideService(CurrentRun, {
          runId: null,
          batch: DropPendingBuilds.name,
          dryRun: true,
          budget: Option.none(),
          fence: Option.none()
        })
      )
      assert.strictEqual(dry.dropped, 1)
      const first = yield* summaryOf(DropPendingBuilds.run)
      assert.strictEqual(first.dropped, 1)
      assert.strictEqual((yield* row(last.id)).failureReason, 24)
      for (const b of waiting) assert.strictEqual((yield* row(b.id)).status, "pending")
      // GitLab's entry lives two minutes past the runner's last ping; then the builds are fair game.
      yield* TestClock.adjust("121 seconds")
      const later = yield* DropPendingBuilds.run
      assert.strictEqual(later.dropped, 100)
    }).pipe(named, Effect.provide(MemoryPlatform())))

  it.effect("GitLab 19's reason set: the rule does not run (GitLab 19 removed it; 24 means another reason there)", () =>
    Effect.gen(function*() {
      const stale = assigned("2 hours")
      const state = yield* seed(stale)
      state.onlineRunner.add(stale.id)
      const summary = yield* summaryOf(DropPendingBuilds.run).pipe(
        Effect.provideService(CurrentFailureReasonSet, "gitlab-19")
      )
      assert.strictEqual(summary.dropped, 0)
      assert.strictEqual((yield* row(stale.id)).status, "pending")
    }).pipe(named, Effect.provide(MemoryPlatform())))
})

describe("drop-scheduled-builds", () => {
  it.effect("an hour past scheduled_at → stale_schedule (7) in both reason sets; no scheduled_at stays", () =>
    Effect.gen(function*() {
      const past = build({ status: "scheduled", scheduledAt: ago("3601 seconds") })
      const exactly = build({ status: "scheduled", scheduledAt: ago("1 hour") })
      const none = build({ status: "scheduled", scheduledAt: null })
      yield* seed(past, exactly, none)
      const summary = yield* summaryOf(DropScheduledBuilds.run).pipe(
        Effect.provideService(CurrentFailureReasonSet, "gitlab-19")
      )
      assert.strictEqual(summary.dropped, 1)
      assert.strictEqual((yield* row(past.id)).failureReason, 7)
      assert.strictEqual((yield* row(exactly.id)).status, "scheduled")
      assert.strictEqual((yield* row(none.id)).status, "scheduled")
    }).pipe(Effect.provide(MemoryPlatform())))
})

describe("the family under the run guard", () => {
  const guarded = (options: { dryRun?: boolean } = {}) =>
    Effect.gen(function*() {
      yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
      return yield* runBatch(DropRunningBuilds, { trigger: "manual", ...options })
    })

  it.effect("dry run: counts what would be dropped, changes nothing, takes no lease", () =>
    Effect.gen(function*() {
      const stale = build()
      yield* seed(stale)
      const redis = yield* MemoryRedis
      redis.set(leaseKey("ci/stuck_builds/drop_running_worker"), "someone-else", { exSeconds: 1800 })
      const result = yield* guarded({ dryRun: true })
      assert.strictEqual(result.outcome, "succeeded")
      assert.deepInclude(result.summary as object, { dropped: 1 })
      assert.strictEqual((yield* row(stale.id)).status, "running")
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("lease held elsewhere → skipped, nothing changed", () =>
    Effect.gen(function*() {
      const stale = build()
      yield* seed(stale)
      const redis = yield* MemoryRedis
      redis.set(leaseKey("ci/stuck_builds/drop_running_worker"), "someone-else", { exSeconds: 1800 })
      const result = yield* guarded()
      assert.strictEqual(result.outcome, "skipped")
      assert.strictEqual((yield* row(stale.id)).status, "running")
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("the health gate is asked before every page; a hold past the deadline stops the walk", () =>
    Effect.gen(function*() {
      yield* seed(...Array.from({ length: 250 }, () => build()))
      let asked = 0
      const gate = {
        ...openGate,
        beforeUnit: () =>
          Effect.succeed(
            ++asked <= 2
              ? { proceed: true, heldMs: 0, heldBy: [] }
              : { proceed: false, heldMs: 1000, heldBy: ["walRate"] }
          )
      }
      const summary = yield* summaryOf(DropRunningBuilds.run).pipe(Effect.provideService(HealthGate, gate))
      assert.deepInclude(summary, { dropped: 200, batches: 2, heldBy: ["walRate"] })
    }).pipe(Effect.provide(MemoryPlatform())))
})
