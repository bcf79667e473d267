import { assert, describe, it } from "@effect/vitest"
import { ConfigProvider, Context, Duration, Effect, Exit, Fiber, Layer, Logger, Option, Ref, Scope } from "effect"
import { ConnectionError, SqlError } from "effect/sql/SqlError"
import { TestClock } from "effect/testing"
import type { SweeperSettings } from "../../src/config/Config.ts"
import { type InvalidConfig, RedisError } from "../../src/domain/Errors.ts"
import { BatchPaused, BatchResumed, RunStarted } from "../../src/domain/Events.ts"
import { leaseKey } from "../../src/domain/Lease.ts"
import { MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import type { RegisteredBatch } from "../../src/programs/index.ts"
import { EventLog } from "../../src/services/EventLog.ts"
import { Lease } from "../../src/services/Lease.ts"
import { Scheduler, schedulerLayer, supervise } from "../../src/supervisor/Scheduler.ts"
import { MemoryPlatform } from "../support/memory.ts"

const T0 = Date.parse("2026-05-01T00:01:00Z")
const at = (hhmmss: string) => `2026-05-01T${hhmmss}.000Z`

/** A test batch every 10 minutes whose program is `body` (given the 1-based run number). */
const testBatch = (
  body: (run: number) => Effect.Effect<unknown, unknown>,
  overrides: Partial<RegisteredBatch> = {}
) =>
  Effect.gen(function*() {
    const runs = yield* Ref.make(0)
    const batch: RegisteredBatch = {
      name: "test-batch",
      worker: "TestWorker",
      description: "test",
      cron: "*/10 * * * *",
      budget: Duration.hours(1),
      lease: Option.none(),
      run: Effect.flatMap(Ref.updateAndGet(runs, (n) => n + 1), body),
      ...overrides
    }
    return { batch, runs }
  })

const events = (type: string) =>
  Effect.gen(function*() {
    const all = yield* MemoryEvents
    return all.filter((e) => e.type === type)
  })

const scheduledAts = (type: string) => Effect.map(events(type), (found) => found.map((e) => e.data.scheduled_at))

/** Builds the scheduler in its own scope so a test can close it (shutdown) explicitly. */
const startScheduler = (batch: RegisteredBatch, env: Record<string, string> = {}) =>
  Effect.gen(function*() {
    const scope = yield* Scope.make()
    const context = yield* Layer.buildWithScope(schedulerLayer([batch]), scope).pipe(
      Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromEnv({ env }))
    )
    return { scope, scheduler: Context.get(context, Scheduler) }
  })

const platform = (settings: Partial<SweeperSettings> = {}) => MemoryPlatform(settings)

describe("Scheduler: batch actors", () => {
  it.effect("fires on cron ticks, not at boot", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const { batch, runs } = yield* testBatch(() => Effect.succeed({ ok: true }))
      yield* startScheduler(batch)
      yield* TestClock.adjust("1 second")
      assert.strictEqual(yield* Ref.get(runs), 0)
      yield* TestClock.adjust("9 minutes")
      assert.strictEqual(yield* Ref.get(runs), 1)
      yield* TestClock.adjust("10 minutes")
      assert.strictEqual(yield* Ref.get(runs), 2)
      assert.deepStrictEqual(yield* scheduledAts("RunStarted"), [at("00:10:00"), at("00:20:00")])
      assert.deepStrictEqual((yield* events("RunStarted")).map((e) => e.data.trigger), ["schedule", "schedule"])
    }).pipe(Effect.provide(platform())))

  it.effect("ticks during a run coalesce into one pending run; the others are recorded as overlap", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      // The first run takes 25 minutes: ticks at :20 and :30 arrive while it runs.
      const { batch, runs } = yield* testBatch((n) => n === 1 ? Effect.sleep("25 minutes") : Effect.void)
      yield* startScheduler(batch)
      yield* TestClock.adjust("9 minutes") // 00:10 run starts
      yield* TestClock.adjust("25 minutes") // 00:35 it ends; the 00:30 tick runs
      yield* TestClock.adjust("1 second")
      assert.strictEqual(yield* Ref.get(runs), 2)
      assert.deepStrictEqual(yield* scheduledAts("RunStarted"), [at("00:10:00"), at("00:30:00")])
      const missed = yield* events("TickMissed")
      assert.deepStrictEqual(missed.map((e) => [e.data.scheduled_at, e.data.reason]), [[at("00:20:00"), "overlap"]])
    }).pipe(Effect.provide(platform())))

  it.effect("paused batches record their ticks as missed and run again after resume", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const { batch, runs } = yield* testBatch(() => Effect.void)
      const { scheduler } = yield* startScheduler(batch)
      yield* scheduler.pause("test-batch", "spec")
      yield* TestClock.adjust("9 minutes")
      assert.strictEqual(yield* Ref.get(runs), 0)
      assert.strictEqual((yield* scheduler.snapshots)[0]!.status, "paused")
      yield* scheduler.resume("test-batch", "spec")
      yield* TestClock.adjust("10 minutes")
      assert.strictEqual(yield* Ref.get(runs), 1)
      const missed = yield* events("TickMissed")
      assert.deepStrictEqual(missed.map((e) => [e.data.scheduled_at, e.data.reason]), [[at("00:10:00"), "paused"]])
      assert.lengthOf(yield* events("BatchPaused"), 1)
      assert.lengthOf(yield* events("BatchResumed"), 1)
    }).pipe(Effect.provide(platform())))

  it.effect("a paused batch's missed ticks say paused, in one Info line per pause, not a warning per tick", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const lines: Array<{ level: string; message: string }> = []
      const collector = Logger.make((options) => {
        const message = Array.isArray(options.message) ? options.message[0] : options.message
        if (String(message).startsWith("Tick missed")) lines.push({ level: options.logLevel, message: String(message) })
      })
      const { batch } = yield* testBatch(() => Effect.void)
      const { scheduler } = yield* startScheduler(batch).pipe(Effect.provide(Logger.layer([collector])))
      yield* scheduler.pause("test-batch", "ops")
      yield* TestClock.adjust("29 minutes") // 00:10, 00:20, 00:30 missed
      yield* scheduler.resume("test-batch", "ops")
      yield* scheduler.pause("test-batch", "ops")
      yield* TestClock.adjust("20 minutes") // 00:40, 00:50 missed under the second pause
      const missed = yield* events("TickMissed")
      assert.deepStrictEqual(missed.map((e) => e.data.reason), ["paused", "paused", "paused", "paused", "paused"])
      assert.deepStrictEqual(lines, [
        { level: "Info", message: "Tick missed: paused by ops; its ticks are skipped until it is resumed" },
        { level: "Info", message: "Tick missed: paused by ops; its ticks are skipped until it is resumed" }
      ])
    }).pipe(Effect.provide(platform())))

  it.effect("a pause written by another process (CLI, another replica) stops the next tick; its resume lets ticks run", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const { batch, runs } = yield* testBatch(() => Effect.void)
      const { scheduler } = yield* startScheduler(batch)
      const log = yield* EventLog
      yield* log.append(new BatchPaused({ batch: "test-batch", by: "cli:ops" }))
      yield* TestClock.adjust("9 minutes")
      assert.strictEqual(yield* Ref.get(runs), 0)
      const snapshot = (yield* scheduler.snapshots)[0]!
      assert.strictEqual(snapshot.status, "paused")
      assert.strictEqual(snapshot.history.pausedBy, "cli:ops")
      yield* log.append(new BatchResumed({ batch: "test-batch", by: "cli:ops" }))
      yield* TestClock.adjust("10 minutes")
      assert.strictEqual(yield* Ref.get(runs), 1)
      assert.strictEqual((yield* scheduler.snapshots)[0]!.status, "idle")
      const missed = yield* events("TickMissed")
      assert.deepStrictEqual(missed.map((e) => [e.data.scheduled_at, e.data.reason]), [[at("00:10:00"), "paused"]])
    }).pipe(Effect.provide(platform())))

  it.effect("a pause or resume that cannot be recorded fails, changes nothing, and is not undone later", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const { batch, runs } = yield* testBatch(() => Effect.void)
      const log = yield* EventLog
      const down = yield* Ref.make(false)
      const refused = new SqlError({
        reason: new ConnectionError({
          cause: new Error("connect ECONNREFUSED 127.0.0.1:5432"),
          message: "PgClient: Connection refused"
        })
      })
      // The database refuses writes while `down`; reads still answer, so the refresh before each tick sees the log.
      const flaky = EventLog.of({
        ...log,
        append: (event) => Effect.flatMap(Ref.get(down), (isDown) => isDown ? Effect.fail(refused) : log.append(event))
      })
      const { scheduler } = yield* startScheduler(batch).pipe(Effect.provideService(EventLog, flaky))

      yield* Ref.set(down, true)
      const failed = yield* Effect.flip(scheduler.pause("test-batch", "spec"))
      assert.strictEqual(failed._tag, "PauseNotRecorded")
      assert.include(failed.message, "ECONNREFUSED")
      assert.strictEqual((yield* scheduler.snapshots)[0]!.status, "idle", "nothing changed")
      assert.lengthOf(yield* events("BatchPaused"), 0)
      yield* Ref.set(down, false)
      yield* TestClock.adjust("9 minutes")
      assert.strictEqual(yield* Ref.get(runs), 1, "the batch was never paused")

      // One that answers success is in the log, so the refresh before the next tick keeps it.
      yield* scheduler.pause("test-batch", "spec")
      assert.lengthOf(yield* events("BatchPaused"), 1)
      yield* TestClock.adjust("10 minutes")
      assert.strictEqual(yield* Ref.get(runs), 1)
      assert.strictEqual((yield* scheduler.snapshots)[0]!.status, "paused")

      yield* Ref.set(down, true)
      assert.strictEqual((yield* Effect.flip(scheduler.resume("test-batch", "spec")))._tag, "PauseNotRecorded")
      assert.strictEqual((yield* scheduler.snapshots)[0]!.status, "paused", "a resume not recorded leaves it paused")
      yield* Ref.set(down, false)
      yield* TestClock.adjust("10 minutes")
      assert.strictEqual(yield* Ref.get(runs), 1)
      assert.lengthOf(yield* events("BatchResumed"), 0)
    }).pipe(Effect.provide(platform())))

  it.effect("a pause during a run answers at once; the status follows it when the run ends", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const { batch, runs } = yield* testBatch((n) => n === 1 ? Effect.sleep("5 minutes") : Effect.void)
      const { scheduler } = yield* startScheduler(batch)
      yield* TestClock.adjust("9 minutes") // 00:10 run starts, runs until 00:15
      assert.strictEqual((yield* scheduler.snapshots)[0]!.status, "running")
      yield* scheduler.pause("test-batch", "spec")
      assert.lengthOf(yield* events("BatchPaused"), 1)
      yield* TestClock.adjust("6 minutes")
      assert.strictEqual((yield* scheduler.snapshots)[0]!.status, "paused")
      yield* TestClock.adjust("10 minutes")
      assert.strictEqual(yield* Ref.get(runs), 1)
    }).pipe(Effect.provide(platform())))

  it.effect("a failing or dying run does not stop the next tick", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const { batch, runs } = yield* testBatch((n) =>
        n === 1 ? Effect.fail("boom") : n === 2 ? Effect.die(new Error("defect")) : Effect.succeed("fine")
      )
      const { scheduler } = yield* startScheduler(batch)
      yield* TestClock.adjust("29 minutes")
      assert.strictEqual(yield* Ref.get(runs), 3)
      const outcomes = (yield* events("RunFinished")).map((e) => e.data.outcome)
      assert.deepStrictEqual(outcomes, ["failed", "failed", "succeeded"])
      const snapshot = (yield* scheduler.snapshots)[0]!
      assert.strictEqual(snapshot.history.consecutiveFailures, 0)
      assert.strictEqual(snapshot.history.lastRun?.outcome, "succeeded")
    }).pipe(Effect.provide(platform())))

  it.effect("after 5 failed runs the breaker skips ticks (breaker_open) for its cool-down, then one tick runs half-open", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      // Fails five times, then succeeds: runs at :10–:50 fail; cool-down is 3 periods (30 min).
      const { batch, runs } = yield* testBatch((n) => n <= 5 ? Effect.fail("down") : Effect.void)
      const { scheduler } = yield* startScheduler(batch)
      yield* TestClock.adjust("49 minutes") // 00:50, fifth failure
      assert.strictEqual(yield* Ref.get(runs), 5)
      yield* TestClock.adjust("20 minutes") // ticks 01:00 and 01:10 skipped
      assert.strictEqual(yield* Ref.get(runs), 5)
      const missed = (yield* events("TickMissed")).map((e) => [e.data.scheduled_at, e.data.reason])
      assert.deepStrictEqual(missed, [[at("01:00:00"), "breaker_open"], [at("01:10:00"), "breaker_open"]])
      // A manual run is the operator's override and goes through while the breaker is open.
      assert.strictEqual((yield* scheduler.runNow("test-batch")).outcome, "succeeded")
      yield* TestClock.adjust("10 minutes") // 01:20: closed again after the manual success
      assert.strictEqual(yield* Ref.get(runs), 7)
    }).pipe(Effect.provide(platform())))

  it.effect("the breaker half-opens after its cool-down: one failing tick opens it again", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const { batch, runs } = yield* testBatch(() => Effect.fail("still down"))
      yield* startScheduler(batch)
      yield* TestClock.adjust("49 minutes") // five failures, the last at 00:50
      yield* TestClock.adjust("30 minutes") // 01:00, 01:10 skipped; 01:20 runs half-open and fails
      assert.strictEqual(yield* Ref.get(runs), 6)
      yield* TestClock.adjust("10 minutes") // 01:30 skipped again
      assert.strictEqual(yield* Ref.get(runs), 6)
      const reasons = (yield* events("TickMissed")).map((e) => e.data.reason)
      assert.deepStrictEqual(reasons, ["breaker_open", "breaker_open", "breaker_open"])
    }).pipe(Effect.provide(platform())))

  it.effect("at start-up the latest missed tick runs once; older missed ticks are recorded as downtime", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(Date.parse(at("00:00:00")))
      const log = yield* EventLog
      yield* log.append(
        new RunStarted({
          batch: "test-batch",
          run_id: "00000000-0000-0000-0000-000000000001",
          scheduled_at: at("00:00:00"),
          node: "old",
          trigger: "schedule",
          dryRun: false
        })
      )
      yield* TestClock.setTime(Date.parse(at("00:25:00")))
      const { batch, runs } = yield* testBatch(() => Effect.void)
      yield* startScheduler(batch)
      yield* TestClock.adjust("1 second")
      assert.strictEqual(yield* Ref.get(runs), 1)
      const started = yield* events("RunStarted")
      assert.deepStrictEqual(started.slice(1).map((e) => [e.data.scheduled_at, e.data.trigger]), [[
        at("00:20:00"),
        "startup"
      ]])
      const missed = yield* events("TickMissed")
      assert.deepStrictEqual(missed.map((e) => [e.data.scheduled_at, e.data.reason]), [[at("00:10:00"), "downtime"]])
      // And the normal schedule carries on.
      yield* TestClock.adjust("5 minutes")
      assert.strictEqual(yield* Ref.get(runs), 2)
    }).pipe(Effect.provide(platform())))

  it.effect("with the skip policy nothing runs at start-up and every missed tick is recorded", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(Date.parse(at("00:00:00")))
      const log = yield* EventLog
      yield* log.append(
        new RunStarted({
          batch: "test-batch",
          run_id: "00000000-0000-0000-0000-000000000001",
          scheduled_at: at("00:00:00"),
          node: "old",
          trigger: "schedule",
          dryRun: false
        })
      )
      yield* TestClock.setTime(Date.parse(at("00:35:00")))
      const { batch, runs } = yield* testBatch(() => Effect.void, { missedRuns: "skip" })
      yield* startScheduler(batch)
      yield* TestClock.adjust("1 second")
      assert.strictEqual(yield* Ref.get(runs), 0)
      const missed = (yield* events("TickMissed")).map((e) => e.data.scheduled_at)
      assert.deepStrictEqual(missed, [at("00:30:00"), at("00:20:00"), at("00:10:00")])
    }).pipe(Effect.provide(platform())))

  it.effect("state is rebuilt from events: a restarted actor knows its last outcome", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const { batch } = yield* testBatch(() => Effect.fail("nope"))
      const first = yield* startScheduler(batch)
      yield* TestClock.adjust("9 minutes")
      yield* Scope.close(first.scope, Exit.void)
      const second = yield* startScheduler(batch)
      const snapshot = (yield* second.scheduler.snapshots)[0]!
      assert.strictEqual(snapshot.history.lastRun?.outcome, "failed")
      assert.strictEqual(snapshot.history.consecutiveFailures, 1)
    }).pipe(Effect.provide(platform())))

  it.effect("run now goes through the guard as a manual run", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const { batch } = yield* testBatch(() => Effect.succeed({ repaired: 3 }))
      const { scheduler } = yield* startScheduler(batch)
      const result = yield* scheduler.runNow("test-batch")
      assert.strictEqual(result.outcome, "succeeded")
      assert.deepStrictEqual(result.summary, { repaired: 3 })
      assert.deepStrictEqual((yield* events("RunStarted")).map((e) => e.data.trigger), ["manual"])
      const unknown = yield* Effect.flip(scheduler.runNow("nope"))
      assert.strictEqual(unknown._tag, "UnknownBatch")
    }).pipe(Effect.provide(platform())))

  it.effect("shutdown: an in-flight run within the grace period finishes; no new runs start", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const { batch, runs } = yield* testBatch(() => Effect.sleep("10 seconds").pipe(Effect.as("done")))
      const { scope } = yield* startScheduler(batch)
      yield* TestClock.adjust("9 minutes") // run starts at 00:10
      const closing = yield* Effect.forkChild(Scope.close(scope, Exit.void))
      yield* TestClock.adjust("10 seconds")
      yield* Fiber.join(closing)
      const finished = yield* events("RunFinished")
      assert.deepStrictEqual(finished.map((e) => e.data.outcome), ["succeeded"])
      yield* TestClock.adjust("30 minutes")
      assert.strictEqual(yield* Ref.get(runs), 1)
    }).pipe(Effect.provide(platform({ shutdownGrace: Duration.seconds(25) }))))

  it.effect("shutdown: a run still going after the grace period is interrupted and its lease released", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const { batch } = yield* testBatch(() => Effect.sleep("10 minutes"), {
        lease: Option.some({ name: "test/lease", ttl: Duration.minutes(30) })
      })
      const { scope } = yield* startScheduler(batch)
      yield* TestClock.adjust("9 minutes")
      const redis = yield* MemoryRedis
      assert.isTrue(redis.exists(leaseKey("test/lease")))
      const closing = yield* Effect.forkChild(Scope.close(scope, Exit.void))
      yield* TestClock.adjust("5 seconds")
      yield* Fiber.join(closing)
      const finished = yield* events("RunFinished")
      assert.deepStrictEqual(finished.map((e) => [e.data.outcome, e.data.reason]), [["failed", "interrupted"]])
      assert.isFalse(redis.exists(leaseKey("test/lease")))
    }).pipe(Effect.provide(platform({ shutdownGrace: Duration.seconds(5) }))))

  it.effect("a tick claimed by another replica is not run here", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const redis = yield* MemoryRedis
      redis.set(leaseKey(`sweeper/tick/test-batch/${at("00:10:00")}`), "other-replica", { exSeconds: 3600 })
      const { batch, runs } = yield* testBatch(() => Effect.void)
      yield* startScheduler(batch)
      yield* TestClock.adjust("9 minutes")
      assert.strictEqual(yield* Ref.get(runs), 0)
      assert.lengthOf(yield* events("RunStarted"), 0)
      yield* TestClock.adjust("10 minutes")
      assert.strictEqual(yield* Ref.get(runs), 1)
    }).pipe(Effect.provide(platform())))

  it.effect("a tick's claim is kept two periods, then gone: claims do not pile up", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const redis = yield* MemoryRedis
      const { batch, runs } = yield* testBatch(() => Effect.void)
      yield* startScheduler(batch)
      yield* TestClock.adjust("9 minutes")
      assert.strictEqual(yield* Ref.get(runs), 1)
      const claim = leaseKey(`sweeper/tick/test-batch/${at("00:10:00")}`)
      assert.strictEqual(redis.pttl(claim), Duration.toMillis(Duration.minutes(20)))
      yield* TestClock.adjust("20 minutes")
      assert.isFalse(redis.exists(claim))
      assert.strictEqual(yield* Ref.get(runs), 3)
    }).pipe(Effect.provide(platform())))

  it.effect("configuration: SWEEPER_CRON_<BATCH> overrides; invalid cron and unknown disabled batches fail start-up", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const { batch, runs } = yield* testBatch(() => Effect.void)
      yield* startScheduler(batch, { SWEEPER_CRON_TEST_BATCH: "*/2 * * * *" })
      yield* TestClock.adjust("1 minute")
      assert.strictEqual(yield* Ref.get(runs), 1)
      const invalid = yield* Effect.flip(startScheduler(batch, { SWEEPER_CRON_TEST_BATCH: "61 * * * *" }))
      assert.strictEqual(invalid._tag, "InvalidConfig")
      assert.strictEqual((invalid as InvalidConfig).variable, "SWEEPER_CRON_TEST_BATCH")
      assert.include(invalid.message, "invalid cron")
    }).pipe(Effect.provide(platform())))

  it.effect("when the lease store is unreachable the tick does not run and is recorded as lease_unavailable", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const { batch, runs } = yield* testBatch(() => Effect.void)
      yield* startScheduler(batch)
      yield* TestClock.adjust("9 minutes")
      assert.strictEqual(yield* Ref.get(runs), 0)
      const missed = (yield* events("TickMissed")).map((e) => [e.data.scheduled_at, e.data.reason])
      assert.deepStrictEqual(missed, [[at("00:10:00"), "lease_unavailable"]])
    }).pipe(
      // The unreachable lease store replaces the platform's: the later layer of a merge wins.
      Effect.provide(Layer.merge(
        platform(),
        Layer.succeed(
          Lease,
          Lease.of({
            tryAcquire: () =>
              Effect.fail(new RedisError({ operation: "lease.acquire", cause: new Error("ECONNREFUSED") })),
            renew: () => Effect.succeed(false),
            release: () => Effect.succeed(false),
            isHeld: () => Effect.succeed(false),
            claim: () => Effect.fail(new RedisError({ operation: "lease.claim", cause: new Error("ECONNREFUSED") }))
          })
        )
      ))
    ))

  it.effect("a disabled batch never runs; its ticks are recorded as disabled", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const { batch, runs } = yield* testBatch(() => Effect.void)
      const { scheduler } = yield* startScheduler(batch)
      yield* TestClock.adjust("19 minutes")
      assert.strictEqual(yield* Ref.get(runs), 0)
      assert.deepStrictEqual((yield* events("TickMissed")).map((e) => e.data.reason), ["disabled", "disabled"])
      assert.strictEqual((yield* scheduler.snapshots)[0]!.status, "disabled")
    }).pipe(Effect.provide(platform({ disabledBatches: ["test-batch"] }))))

  it.effect("unknown names in SWEEPER_DISABLED_BATCHES fail start-up", () =>
    Effect.gen(function*() {
      const { batch } = yield* testBatch(() => Effect.void)
      const error = yield* Effect.flip(startScheduler(batch))
      assert.strictEqual(error._tag, "InvalidConfig")
      assert.include(error.message, "nope")
    }).pipe(Effect.provide(platform({ disabledBatches: ["nope"] }))))

  it.effect("a crashed actor is restarted with capped exponential backoff", () =>
    Effect.gen(function*() {
      const starts = yield* Ref.make(0)
      const crashing = Effect.gen(function*() {
        const n = yield* Ref.updateAndGet(starts, (k) => k + 1)
        if (n <= 3) return yield* Effect.die(new Error(`crash ${n}`))
        return yield* Effect.never
      })
      const fiber = yield* Effect.forkChild(supervise("test actor", crashing))
      yield* TestClock.adjust("0 millis")
      assert.strictEqual(yield* Ref.get(starts), 1)
      yield* TestClock.adjust("1 second") // first backoff 1 s
      assert.strictEqual(yield* Ref.get(starts), 2)
      yield* TestClock.adjust("1 second") // second backoff is 2 s
      assert.strictEqual(yield* Ref.get(starts), 2)
      yield* TestClock.adjust("1 second")
      assert.strictEqual(yield* Ref.get(starts), 3)
      yield* TestClock.adjust("4 seconds")
      assert.strictEqual(yield* Ref.get(starts), 4)
      yield* Fiber.interrupt(fiber)
    }))
})
