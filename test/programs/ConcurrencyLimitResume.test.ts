import { assert, describe, it } from "@effect/vitest"
import { Clock, DateTime, Duration, Effect, Fiber, Option } from "effect"
import { TestClock } from "effect/testing"
import { CurrentRun } from "../../src/domain/Batch.ts"
import { processWorkKey, workerKeys, workerLeaseName } from "../../src/domain/ConcurrencyLimit.ts"
import { leaseKey } from "../../src/domain/Lease.ts"
import { queueKey, type SidekiqJob } from "../../src/domain/Sidekiq.ts"
import { MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { ConcurrencyLimitResume, resumeWorker } from "../../src/programs/ConcurrencyLimitResume.ts"
import { HealthGate, openGate } from "../../src/services/HealthGate.ts"
import { Lease } from "../../src/services/Lease.ts"
import { runBatch } from "../../src/supervisor/RunGuard.ts"
import { MemoryPlatform } from "../support/memory.ts"

const NOW = DateTime.makeUnsafe("2026-03-01T12:00:00Z")
const NOW_S = DateTime.toEpochMillis(NOW) / 1000
const W = "Releases::CreateEvidenceWorker"
const K = workerKeys(W)

const platform = (limits: Record<string, number | { limit: number; queue: string }>) =>
  MemoryPlatform({
    concurrencyLimits: Object.fromEntries(
      Object.entries(limits).map((
        [worker, setting]
      ) => [worker, typeof setting === "number" ? { limit: setting, queue: "default" } : setting])
    )
  })

/** A deferred element as GitLab's middleware writes it. */
const element = (i: number) =>
  JSON.stringify({
    args: [i, `project/${i}`],
    context: { "meta.user": "root", correlation_id: `c${i}` },
    buffered_at: NOW_S - 300 + i / 4
  })

const elements = (from: number, to: number) => Array.from({ length: to - from }, (_, k) => element(from + k))

const seed = (worker: string, values: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
    const redis = yield* MemoryRedis
    if (values.length > 0) redis.rpush(workerKeys(worker).deferred, ...values)
  })

/** `n` running jobs of `worker`, started `ageSeconds` ago. */
const executing = (worker: string, n: number, ageSeconds = 5) =>
  Effect.map(MemoryRedis, (redis) => {
    for (let i = 0; i < n; i++) {
      redis.hset(workerKeys(worker).executing, { [`host-${i}:1:abc:tid:t${i}`]: String(NOW_S - ageSeconds) })
    }
  })

/** The queue in the order Sidekiq consumes it (BRPOP from the right). */
const consumed = (queue = "default") =>
  Effect.map(
    MemoryRedis,
    (redis) => redis.lrange(queueKey(queue), 0, -1).reverse().map((raw) => JSON.parse(raw) as SidekiqJob)
  )

/**
 * Forks `program` and returns once its first passes are done, at NOW. The program starts from a
 * TestClock wake-up, so this and every later `TestClock.adjust` wait for the woken passes (and the
 * fibers they fork) to finish before moving time on: each pass reads exactly the time it is due.
 */
const start = <A, E, R>(program: Effect.Effect<A, E, R>) =>
  Effect.gen(function*() {
    yield* TestClock.setTime(DateTime.toEpochMillis(NOW) - 1)
    const fiber = yield* Effect.forkChild(Effect.andThen(Effect.sleep(1), program))
    yield* TestClock.adjust(1)
    return fiber
  })

/** Runs a program whose passes sleep, advancing the TestClock past its budget. */
const toCompletion = <A, E, R>(program: Effect.Effect<A, E, R>, advance: Duration.Input = "2 minutes") =>
  Effect.gen(function*() {
    const fiber = yield* start(program)
    yield* TestClock.adjust(advance)
    return yield* Fiber.join(fiber)
  })

const run = toCompletion(ConcurrencyLimitResume.run)

/** Records, relative to NOW, when each renewal of a lease happens. */
const countingRenewals = (renewals: Array<number>) =>
  Effect.updateService(Lease, (lease) => ({
    ...lease,
    renew: (handle: Parameters<typeof lease.renew>[0]) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) => {
        renewals.push(now - DateTime.toEpochMillis(NOW))
        return lease.renew(handle)
      })
  }))

const withBudget = (budget: Duration.Input) =>
  Effect.provideService(CurrentRun, {
    runId: null,
    batch: null,
    dryRun: false,
    budget: Option.some(Duration.fromInputUnsafe(budget)),
    fence: Option.none()
  })

describe("concurrency-limit-resume", () => {
  it.effect("nothing deferred: nothing resumed, nothing written", () =>
    Effect.gen(function*() {
      yield* seed(W, [])
      const summary = yield* run
      assert.deepStrictEqual(summary, { workers: [], resumedJobs: 0, failedWorkers: [], heldMs: 0, heldBy: [] })
      const redis = yield* MemoryRedis
      assert.deepStrictEqual(redis.keys("*"), [])
      assert.lengthOf(yield* MemoryEvents, 0)
    }).pipe(Effect.provide(platform({ [W]: 5 }))))

  it.effect("limit 5 with 2 executing: resumes 3, FIFO, as Sidekiq jobs carrying args, context and the resume marker", () =>
    Effect.gen(function*() {
      yield* seed(W, elements(0, 10))
      yield* executing(W, 2)
      const redis = yield* MemoryRedis
      const fiber = yield* start(ConcurrencyLimitResume.run)
      // Slots reserved for the resumed jobs until they start, for at most 60 s.
      assert.strictEqual(redis.get(K.pendingResumed), "3")
      assert.strictEqual(redis.pttl(K.pendingResumed), 60_000)
      yield* TestClock.adjust("2 minutes")
      const summary = yield* Fiber.join(fiber)
      assert.deepStrictEqual(summary, {
        workers: [{ worker: W, limit: 5, queueSize: 10, current: 2, resumed: 3, effectiveLimit: 5 }],
        resumedJobs: 3,
        failedWorkers: [],
        heldMs: 0,
        heldBy: []
      })
      const jobs = yield* consumed()
      assert.deepStrictEqual(jobs.map((job) => job.args), [[0, "project/0"], [1, "project/1"], [2, "project/2"]])
      const first = jobs[0]!
      assert.match(first.jid, /^[0-9a-f]{24}$/)
      assert.strictEqual(new Set(jobs.map((job) => job.jid)).size, 3)
      assert.deepStrictEqual({ ...first, jid: "x" }, {
        class: W,
        args: [0, "project/0"],
        jid: "x",
        queue: "default",
        retry: true,
        created_at: NOW_S,
        enqueued_at: NOW_S,
        "meta.user": "root",
        correlation_id: "c0",
        concurrency_limit_resume: true,
        concurrency_limit_buffered_at: NOW_S - 300
      })
      assert.deepStrictEqual(redis.lrange(K.deferred, 0, -1), elements(3, 10))
      assert.deepStrictEqual(redis.smembers("queues"), ["default"])
      // Nobody started them within 60 s: the reservation expired, so a lost decrement cannot leak slots.
      assert.isFalse(redis.exists(K.pendingResumed))
      const events = yield* MemoryEvents
      assert.deepStrictEqual(events.map((e) => [e.stream, e.type, e.data]), [
        [`concurrency_limit:${W}`, "ConcurrencyLimitJobsResumed", {
          worker: W,
          queue: "default",
          count: 3,
          limit: 5,
          jids: jobs.map((j) => j.jid)
        }]
      ])
    }).pipe(Effect.provide(platform({ [W]: 5 }))))

  it.effect("the worker's configured queue is used", () =>
    Effect.gen(function*() {
      yield* seed(W, elements(0, 2))
      yield* run
      assert.lengthOf(yield* consumed("default"), 0)
      assert.deepStrictEqual((yield* consumed("releases")).map((job) => job.queue), ["releases", "releases"])
    }).pipe(Effect.provide(platform({ [W]: { limit: 5, queue: "releases" } }))))

  it.effect("resumed-but-not-started jobs (pending_resumed) count as current", () =>
    Effect.gen(function*() {
      yield* seed(W, elements(0, 10))
      yield* executing(W, 1)
      const redis = yield* MemoryRedis
      redis.set(K.pendingResumed, "2", { exSeconds: 30 })
      const fiber = yield* start(ConcurrencyLimitResume.run)
      assert.strictEqual(redis.get(K.pendingResumed), "4")
      assert.strictEqual(redis.pttl(K.pendingResumed), 60_000) // the move refreshed the TTL
      yield* TestClock.adjust("2 minutes")
      const summary = yield* Fiber.join(fiber)
      assert.deepStrictEqual(summary.workers, [{
        worker: W,
        limit: 5,
        queueSize: 10,
        current: 3,
        resumed: 2,
        effectiveLimit: 5
      }])
    }).pipe(Effect.provide(platform({ [W]: 5 }))))

  it.effect("limit 0 is unlimited: moves of up to 5000, back to back with no sleep, until the list is empty", () =>
    Effect.gen(function*() {
      yield* seed(W, elements(0, 10_001))
      yield* executing(W, 50)
      const renewals: Array<number> = []
      const fiber = yield* start(ConcurrencyLimitResume.run.pipe(countingRenewals(renewals)))
      // Finishes without the TestClock moving past NOW: no pass waits for the clock. (The passes
      // yield to the scheduler on their own; a sleeping pass would never finish here.)
      for (let i = 0; i < 10_000 && fiber.pollUnsafe() === undefined; i++) yield* Effect.yieldNow
      assert.isDefined(fiber.pollUnsafe())
      assert.strictEqual(yield* Clock.currentTimeMillis, DateTime.toEpochMillis(NOW))
      const summary = yield* Fiber.join(fiber)
      assert.deepStrictEqual(summary.workers, [{
        worker: W,
        limit: 0,
        queueSize: 10_001,
        current: 50,
        resumed: 10_001,
        effectiveLimit: 0
      }])
      const events = yield* MemoryEvents
      assert.deepStrictEqual(events.map((e) => [e.data.count, e.occurredAt.getTime() - DateTime.toEpochMillis(NOW)]), [
        [5000, 0],
        [5000, 0],
        [1, 0]
      ])
      const jobs = yield* consumed()
      assert.deepStrictEqual(jobs.map((job) => job.args[0]), Array.from({ length: 10_001 }, (_, i) => i))
      assert.strictEqual(new Set(jobs.map((job) => job.jid)).size, 10_001)
      assert.isFalse((yield* MemoryRedis).exists(K.deferred))
      // The worker lease is renewed before every back-to-back pass (its TTL is 15 s).
      assert.deepStrictEqual(renewals, [0, 0])
    }).pipe(Effect.provide(platform({ [W]: 0 }))))

  it.effect("a positive limit keeps the 1 s cadence: capacity frees as jobs finish, not with time", () =>
    Effect.gen(function*() {
      yield* seed(W, elements(0, 12))
      const redis = yield* MemoryRedis
      const renewals: Array<number> = []
      const fiber = yield* start(ConcurrencyLimitResume.run.pipe(countingRenewals(renewals)))
      redis.del(K.pendingResumed) // the resumed jobs started and finished at once
      // Capacity is free again, yet nothing more moves until a second has passed.
      assert.lengthOf(yield* consumed(), 5)
      assert.isUndefined(fiber.pollUnsafe())
      yield* TestClock.adjust("999 millis")
      assert.lengthOf(yield* consumed(), 5)
      yield* TestClock.adjust("1 millis")
      assert.lengthOf(yield* consumed(), 10)
      redis.del(K.pendingResumed)
      yield* TestClock.adjust("1 second")
      const summary = yield* Fiber.join(fiber)
      assert.deepStrictEqual(summary.workers, [{
        worker: W,
        limit: 5,
        queueSize: 12,
        current: 0,
        resumed: 12,
        effectiveLimit: 5
      }])
      const events = yield* MemoryEvents
      assert.deepStrictEqual(events.map((e) => [e.data.count, e.occurredAt.getTime() - DateTime.toEpochMillis(NOW)]), [
        [5, 0],
        [5, 1000],
        [2, 2000]
      ])
      assert.deepStrictEqual(renewals, [1000, 2000])
    }).pipe(Effect.provide(platform({ [W]: 5 }))))

  it.effect("limit −1 (circuit breaker open): nothing resumed and no second pass", () =>
    Effect.gen(function*() {
      yield* seed(W, elements(0, 3))
      const fiber = yield* start(ConcurrencyLimitResume.run)
      // Finished without waiting for the clock: it never scheduled another pass.
      const exit = fiber.pollUnsafe()
      assert.isDefined(exit)
      const summary = yield* Fiber.join(fiber)
      assert.deepStrictEqual(summary, {
        workers: [{ worker: W, limit: -1, queueSize: 3, current: 0, resumed: 0, effectiveLimit: -1 }],
        resumedJobs: 0,
        failedWorkers: [],
        heldMs: 0,
        heldBy: []
      })
      assert.lengthOf(yield* consumed(), 0)
      assert.lengthOf((yield* MemoryRedis).lrange(K.deferred, 0, -1), 3)
      assert.lengthOf(yield* MemoryEvents, 0)
    }).pipe(Effect.provide(platform({ [W]: -1 }))))

  it.effect("a breaker opened in Redis between passes stops the repetition", () =>
    Effect.gen(function*() {
      yield* seed(W, elements(0, 10))
      const redis = yield* MemoryRedis
      const fiber = yield* start(ConcurrencyLimitResume.run)
      redis.del(K.pendingResumed)
      redis.set(K.currentLimit, "-1")
      yield* TestClock.adjust("1 second")
      assert.isDefined(fiber.pollUnsafe())
      const summary = yield* Fiber.join(fiber)
      assert.deepStrictEqual(summary.workers, [{
        worker: W,
        limit: 2,
        queueSize: 10,
        current: 0,
        resumed: 2,
        effectiveLimit: 2
      }])
      assert.lengthOf(redis.lrange(K.deferred, 0, -1), 8)
    }).pipe(Effect.provide(platform({ [W]: 2 }))))

  it.effect("Redis current_limit overrides the configured limit", () =>
    Effect.gen(function*() {
      yield* seed(W, elements(0, 10))
      const redis = yield* MemoryRedis
      redis.set(K.currentLimit, "1")
      const summary = yield* run
      assert.deepStrictEqual(summary.workers, [{
        worker: W,
        limit: 1,
        queueSize: 10,
        current: 0,
        resumed: 1,
        effectiveLimit: 1
      }])
    }).pipe(Effect.provide(platform({ [W]: 5 }))))

  it.effect("a worker found only by SCAN with a Redis limit is resumed to the default queue; an unparsable override is ignored", () =>
    Effect.gen(function*() {
      const other = "Namespaces::ProcessSyncEventsWorker"
      yield* seed(other, elements(0, 5))
      yield* seed(W, elements(0, 5))
      const redis = yield* MemoryRedis
      redis.set(workerKeys(other).currentLimit, "2")
      redis.set(K.currentLimit, "lots")
      const summary = yield* run
      assert.deepStrictEqual(summary.workers, [
        { worker: W, limit: 1, queueSize: 5, current: 0, resumed: 1, effectiveLimit: 1 },
        { worker: other, limit: 2, queueSize: 5, current: 0, resumed: 2, effectiveLimit: 2 }
      ])
      assert.deepStrictEqual((yield* consumed()).map((job) => job.class).sort(), [other, other, W])
    }).pipe(Effect.provide(platform({ [W]: 1 }))))

  it.effect("unknown worker (no configured limit, no Redis limit): skipped, nothing moved", () =>
    Effect.gen(function*() {
      const unknown = "Some::UnknownWorker"
      yield* seed(unknown, elements(0, 4))
      yield* seed(W, elements(0, 1))
      const summary = yield* run
      assert.deepStrictEqual(summary, {
        workers: [{ worker: W, limit: 5, queueSize: 1, current: 0, resumed: 1, effectiveLimit: 5 }],
        resumedJobs: 1,
        failedWorkers: [],
        heldMs: 0,
        heldBy: []
      })
      const redis = yield* MemoryRedis
      assert.deepStrictEqual(redis.lrange(workerKeys(unknown).deferred, 0, -1), elements(0, 4))
      assert.isTrue((yield* consumed()).every((job) => job.class === W))
      // Asked for directly, it is the typed outcome, not an error.
      assert.deepStrictEqual(yield* resumeWorker(unknown), { _tag: "UnknownWorker", worker: unknown })
    }).pipe(Effect.provide(platform({ [W]: 5 }))))

  it.effect("a worker name from Redis keys that is not a class name is never pushed to Sidekiq, journal or not", () =>
    Effect.gen(function*() {
      yield* seed(W, elements(0, 1))
      const redis = yield* MemoryRedis
      // Key forms a writer of Redis can choose: camelized they are no class name GitLab has.
      for (const form of ["kernel.exec", "evil worker", "a;system"]) {
        redis.rpush(`sidekiq:concurrency_limit:throttled_jobs:{${form}}`, ...elements(0, 3))
        redis.set(`sidekiq:concurrency_limit:{${form}}:current_limit`, "5")
      }
      // A move journal left behind is finished before any limit is asked: it must not be either.
      redis.rpush(
        "sidekiq:concurrency_limit:{x.y}:sweeper_moving",
        JSON.stringify({ sweeper_move: 1, batch: "0123456789abcdef01234567", queue: "default", worker: "X.y" }),
        JSON.stringify({ class: "X.y", args: [], jid: "0123456789abcdef01234567", queue: "default" })
      )
      const summary = yield* run
      assert.deepStrictEqual(summary.workers.map((w) => w.worker), [W])
      assert.deepStrictEqual((yield* consumed()).map((job) => job.class), [W])
      for (const form of ["kernel.exec", "evil worker", "a;system"]) {
        assert.lengthOf(redis.lrange(`sidekiq:concurrency_limit:throttled_jobs:{${form}}`, 0, -1), 3)
      }
      assert.deepStrictEqual(yield* resumeWorker("Kernel.exec"), { _tag: "UnknownWorker", worker: "Kernel.exec" })
    }).pipe(Effect.provide(platform({ [W]: 5 }))))

  it.effect("stale trackers are cleaned before counting (older than 600 s, strictly, and not backed by a running job)", () =>
    Effect.gen(function*() {
      yield* seed(W, elements(0, 10))
      const redis = yield* MemoryRedis
      const work = (workerClass: string) =>
        JSON.stringify({
          queue: "default",
          payload: JSON.stringify({ class: workerClass, args: [] }),
          run_at: NOW_S - 700
        })
      redis.hset(processWorkKey("alive:1:a"), { t1: work(W) })
      redis.hset(processWorkKey("reused:1:b"), { t1: work("OtherWorker") })
      redis.hset(K.executing, {
        "gone:1:x:tid:t1": String(NOW_S - 601), // process gone: stale
        "alive:1:a:tid:t1": String(NOW_S - 601), // still running this worker's job: kept
        "reused:1:b:tid:t1": String(NOW_S - 601), // thread now runs another worker: stale
        "gone:2:x:tid:t1": String(NOW_S - 600), // exactly 600 s: not older, kept
        "garbage": String(NOW_S - 601), // malformed and old: stale
        "garbage-but-fresh": String(NOW_S - 1), // malformed but young: kept
        "gone:3:x:tid:t1": "not-a-time" // unreadable start counts as old; nothing runs it: stale
      })
      const fiber = yield* start(ConcurrencyLimitResume.run)
      assert.deepStrictEqual(Object.keys(redis.hgetall(K.executing)).sort(), [
        "alive:1:a:tid:t1",
        "garbage-but-fresh",
        "gone:2:x:tid:t1"
      ])
      assert.lengthOf(yield* consumed(), 2)
      // One second later the 600 s tracker is 601 s old: removed, and its slot is resumed.
      yield* TestClock.adjust("1 second")
      assert.deepStrictEqual(Object.keys(redis.hgetall(K.executing)).sort(), ["alive:1:a:tid:t1", "garbage-but-fresh"])
      assert.lengthOf(yield* consumed(), 3)
      yield* TestClock.adjust("2 minutes")
      const summary = yield* Fiber.join(fiber)
      assert.deepStrictEqual(summary.workers, [{
        worker: W,
        limit: 5,
        queueSize: 10,
        current: 3,
        resumed: 3,
        effectiveLimit: 5
      }])
    }).pipe(Effect.provide(platform({ [W]: 5 }))))

  it.effect("repeats every second while jobs remain, resuming as capacity frees", () =>
    Effect.gen(function*() {
      yield* seed(W, elements(0, 10))
      yield* executing(W, 2)
      const redis = yield* MemoryRedis
      const fiber = yield* start(ConcurrencyLimitResume.run) // t=0: both slots busy, nothing resumed
      assert.lengthOf(yield* consumed(), 0)
      redis.hdel(K.executing, "host-0:1:abc:tid:t0") // one job finished
      yield* TestClock.adjust("1 second") // t=1: one resumed
      assert.lengthOf(yield* consumed(), 1)
      yield* TestClock.adjust("1 second") // t=2: the resumed job has not started: still full
      assert.lengthOf(yield* consumed(), 1)
      redis.del(K.pendingResumed) // it started and finished
      redis.hdel(K.executing, "host-1:1:abc:tid:t1")
      yield* TestClock.adjust("1 second") // t=3: two resumed
      assert.lengthOf(yield* consumed(), 3)
      assert.isUndefined(fiber.pollUnsafe())
      yield* TestClock.adjust("2 minutes")
      const summary = yield* Fiber.join(fiber)
      assert.deepStrictEqual(summary.workers, [{
        worker: W,
        limit: 2,
        queueSize: 10,
        current: 2,
        resumed: 3,
        effectiveLimit: 2
      }])
      const events = yield* MemoryEvents
      assert.deepStrictEqual(events.map((e) => [e.data.count, e.occurredAt.getTime() - DateTime.toEpochMillis(NOW)]), [[
        1,
        1000
      ], [2, 3000]])
      assert.deepStrictEqual((yield* consumed()).map((job) => job.args[0]), [0, 1, 2])
    }).pipe(Effect.provide(platform({ [W]: 2 }))))

  it.effect("stops at the run budget even though jobs remain; never starts a pass at or past it", () =>
    Effect.gen(function*() {
      yield* seed(W, elements(0, 100))
      const redis = yield* MemoryRedis
      const fiber = yield* start(ConcurrencyLimitResume.run.pipe(withBudget("5 seconds")))
      for (let second = 1; second < 10; second++) {
        redis.del(K.pendingResumed) // every resumed job starts and finishes at once
        yield* TestClock.adjust("1 second")
      }
      const summary = yield* Fiber.join(fiber)
      // Passes at t = 0, 1, 2, 3, 4; the pass due at t = 5 would start at the budget.
      assert.deepStrictEqual(summary.workers, [{
        worker: W,
        limit: 1,
        queueSize: 100,
        current: 0,
        resumed: 5,
        effectiveLimit: 1
      }])
      assert.lengthOf(redis.lrange(K.deferred, 0, -1), 95)
    }).pipe(Effect.provide(platform({ [W]: 1 }))))

  it.effect("the default budget is 55 s: a worker with free capacity every second gets 55 passes", () =>
    Effect.gen(function*() {
      yield* seed(W, elements(0, 100))
      const redis = yield* MemoryRedis
      const fiber = yield* start(ConcurrencyLimitResume.run)
      for (let second = 1; second < 70; second++) {
        redis.del(K.pendingResumed)
        yield* TestClock.adjust("1 second")
      }
      const summary = yield* Fiber.join(fiber)
      assert.strictEqual(summary.resumedJobs, 55)
    }).pipe(Effect.provide(platform({ [W]: 1 }))))

  it.effect("unparsable elements go to the dead list in order, never dropped, and do not count against the limit", () =>
    Effect.gen(function*() {
      const bad1 = "not json at all"
      const bad2 = JSON.stringify({ args: "not-an-array" })
      yield* seed(W, [element(0), bad1, element(1), bad2, element(2)])
      const summary = yield* run
      assert.deepStrictEqual(summary.workers, [{
        worker: W,
        limit: 2,
        queueSize: 5,
        current: 0,
        resumed: 2,
        effectiveLimit: 2
      }])
      const redis = yield* MemoryRedis
      assert.deepStrictEqual((yield* consumed()).map((job) => job.args[0]), [0, 1])
      assert.deepStrictEqual(redis.lrange(K.dead, 0, -1), [bad1])
      assert.deepStrictEqual(redis.lrange(K.deferred, 0, -1), [bad2, element(2)])
      const events = yield* MemoryEvents
      assert.deepStrictEqual(events.map((e) => [e.type, e.data.count]), [["ConcurrencyLimitJobsResumed", 2], [
        "ConcurrencyLimitJobsDead",
        1
      ]])
    }).pipe(Effect.provide(platform({ [W]: 2 }))))

  it.effect("a list holding only unparsable elements is emptied into the dead list", () =>
    Effect.gen(function*() {
      yield* seed(W, ["a", "b", "c"])
      const summary = yield* run
      assert.deepStrictEqual(summary.resumedJobs, 0)
      const redis = yield* MemoryRedis
      assert.deepStrictEqual(redis.lrange(K.dead, 0, -1), ["a", "b", "c"])
      assert.isFalse(redis.exists(K.deferred))
      assert.isFalse(redis.exists(K.pendingResumed))
      assert.isFalse(redis.exists(queueKey("default")))
    }).pipe(Effect.provide(platform({ [W]: 2 }))))
})

describe("concurrency-limit-resume under the run guard", () => {
  const OTHER = "Namespaces::ProcessSyncEventsWorker"

  it.effect("workers run concurrently; one whose lease is held elsewhere is skipped, the others are not", () =>
    Effect.gen(function*() {
      yield* seed(W, elements(0, 3))
      yield* seed(OTHER, elements(0, 3))
      const redis = yield* MemoryRedis
      redis.set(leaseKey(workerLeaseName(W)), "another-process", { exSeconds: 3600 })
      assert.strictEqual(
        leaseKey(workerLeaseName(W)),
        "gitlab:exclusive_lease:sweeper/concurrency_limit_resume/releases/create_evidence_worker"
      )
      const result = yield* toCompletion(runBatch(ConcurrencyLimitResume, { trigger: "manual" }))
      assert.strictEqual(result.outcome, "succeeded")
      assert.deepStrictEqual(result.summary, {
        workers: [{ worker: OTHER, limit: 0, queueSize: 3, current: 0, resumed: 3, effectiveLimit: 0 }],
        resumedJobs: 3,
        failedWorkers: [],
        heldMs: 0,
        heldBy: []
      })
      assert.lengthOf(redis.lrange(K.deferred, 0, -1), 3)
      // Our own lease was released, the other holder's is untouched.
      assert.isFalse(redis.exists(leaseKey(workerLeaseName(OTHER))))
      assert.strictEqual(redis.get(leaseKey(workerLeaseName(W))), "another-process")
    }).pipe(Effect.provide(platform({ [W]: 5, [OTHER]: 0 }))))

  it.effect("passes of different workers overlap in time (concurrently, not one after another)", () =>
    Effect.gen(function*() {
      yield* seed(W, elements(0, 3))
      yield* seed(OTHER, elements(0, 3))
      const redis = yield* MemoryRedis
      const fiber = yield* start(ConcurrencyLimitResume.run)
      // Both took their lease and resumed one job at t=0.
      assert.isTrue(redis.exists(leaseKey(workerLeaseName(W))))
      assert.isTrue(redis.exists(leaseKey(workerLeaseName(OTHER))))
      assert.lengthOf(yield* consumed(), 2)
      yield* TestClock.adjust("2 minutes")
      yield* Fiber.join(fiber)
    }).pipe(Effect.provide(platform({ [W]: 1, [OTHER]: 1 }))))

  it.effect("a pass that finds its lease taken over stops", () =>
    Effect.gen(function*() {
      yield* seed(W, elements(0, 10))
      const redis = yield* MemoryRedis
      const fiber = yield* start(ConcurrencyLimitResume.run)
      redis.set(leaseKey(workerLeaseName(W)), "usurper", { exSeconds: 15 })
      redis.del(K.pendingResumed)
      yield* TestClock.adjust("1 second")
      assert.isDefined(fiber.pollUnsafe())
      const summary = yield* Fiber.join(fiber)
      assert.strictEqual(summary.resumedJobs, 1)
      assert.strictEqual(redis.get(leaseKey(workerLeaseName(W))), "usurper")
    }).pipe(Effect.provide(platform({ [W]: 1 }))))

  it.effect("dry run: reports what would be resumed, moves nothing, takes no lease", () =>
    Effect.gen(function*() {
      yield* seed(W, [element(0), "junk", ...elements(1, 10)])
      yield* executing(W, 2)
      const redis = yield* MemoryRedis
      redis.hset(K.executing, { "gone:1:x:tid:t1": String(NOW_S - 3600) })
      const result = yield* toCompletion(runBatch(ConcurrencyLimitResume, { trigger: "manual", dryRun: true }))
      assert.strictEqual(result.outcome, "succeeded")
      // The stale tracker is not cleaned in a dry run, so it still counts.
      assert.deepStrictEqual(result.summary, {
        workers: [{ worker: W, limit: 5, queueSize: 11, current: 3, resumed: 2, effectiveLimit: 5 }],
        resumedJobs: 2,
        failedWorkers: [],
        heldMs: 0,
        heldBy: []
      })
      assert.deepStrictEqual(redis.lrange(K.deferred, 0, -1), [element(0), "junk", ...elements(1, 10)])
      assert.isFalse(redis.exists(queueKey("default")))
      assert.isFalse(redis.exists(K.dead))
      assert.isFalse(redis.exists(K.pendingResumed))
      assert.strictEqual(redis.hlen(K.executing), 3)
      assert.deepStrictEqual(redis.keys("gitlab:exclusive_lease:*"), [])
      const events = yield* MemoryEvents
      assert.deepStrictEqual(events.map((e) => e.type), ["RunStarted", "RunFinished"])
    }).pipe(Effect.provide(platform({ [W]: 5 }))))

  it.effect("a move left half done by a dead process is finished by the next run, also for a worker no longer configured", () =>
    Effect.gen(function*() {
      yield* seed(W, elements(0, 1))
      const redis = yield* MemoryRedis
      const GONE = "Old::GoneWorker"
      const header = (worker: string, batch: string) =>
        JSON.stringify({ sweeper_move: 1, batch, queue: "default", worker })
      const job = (worker: string, jid: string, i: number) =>
        JSON.stringify({
          class: worker,
          args: [i],
          jid,
          queue: "default",
          retry: true,
          created_at: NOW_S,
          enqueued_at: NOW_S,
          concurrency_limit_resume: true
        })
      // Journals as a process leaves them when it dies after BEGIN (jobs off the list, not yet pushed).
      redis.rpush(K.journal, header(W, "a".repeat(24)), job(W, "b".repeat(24), 100))
      redis.expire(K.journal, 3600)
      redis.rpush(workerKeys(GONE).journal, header(GONE, "c".repeat(24)), job(GONE, "d".repeat(24), 200))
      redis.expire(workerKeys(GONE).journal, 3600)

      const summary = yield* run
      assert.deepStrictEqual(summary.workers, [{
        worker: W,
        limit: 5,
        queueSize: 1,
        current: 1,
        resumed: 2,
        effectiveLimit: 5
      }])
      const jobs = yield* consumed()
      assert.deepStrictEqual(jobs.map((j) => j.class).toSorted(), [GONE, W, W])
      assert.deepStrictEqual(jobs.map((j) => j.args[0]).toSorted(), [0, 100, 200])
      assert.isFalse(redis.exists(K.journal))
      assert.isFalse(redis.exists(workerKeys(GONE).journal))
      // Every finished move has its event, the gone worker's too (it has no limit any more: null).
      const resumedEvents = (yield* MemoryEvents).filter((e) => e.type === "ConcurrencyLimitJobsResumed").map((e) =>
        [e.stream, e.data] as const
      )
      const byWorker = (worker: string) =>
        resumedEvents.filter(([stream]) => stream === `concurrency_limit:${worker}`).map(([, data]) => data)
      assert.deepStrictEqual(byWorker(GONE), [{
        worker: GONE,
        queue: "default",
        count: 1,
        limit: null,
        jids: ["d".repeat(24)]
      }])
      assert.deepStrictEqual(byWorker(W)[0], {
        worker: W,
        queue: "default",
        count: 1,
        limit: 5,
        jids: ["b".repeat(24)]
      })
      assert.deepStrictEqual(
        byWorker(W).flatMap((data) => data.jids as ReadonlyArray<string>).toSorted(),
        jobs.filter((j) => j.class === W).map((j) => j.jid).toSorted()
      )
    }).pipe(Effect.provide(platform({ [W]: 5 }))))

  it.effect("one deadline per run: with more busy workers than run at once, no pass starts after it", () =>
    Effect.gen(function*() {
      // 17 workers with capacity every second: 16 run at once, the 17th waits for a slot.
      const workers = Array.from({ length: 17 }, (_, i) => `Busy${i}Worker`)
      for (const worker of workers) yield* seed(worker, elements(0, 200))
      const redis = yield* MemoryRedis
      const fiber = yield* start(runBatch(ConcurrencyLimitResume, { trigger: "manual" }))
      for (let second = 1; second < 120; second++) {
        for (const worker of workers) redis.del(workerKeys(worker).pendingResumed)
        yield* TestClock.adjust("1 second")
      }
      const result = yield* Fiber.join(fiber)
      // Not timed out: the 17th worker's loop has no budget of its own to start at 55 s.
      assert.strictEqual(result.outcome, "succeeded")
      const summary = result.summary as { workers: ReadonlyArray<{ resumed: number }>; resumedJobs: number }
      // The first 16 pass at 0 … 54 s; the 17th gets the slot freed at 54 s, one pass, and no more.
      assert.deepStrictEqual(summary.workers.map((w) => w.resumed), [...Array(16).fill(55), 1])
      assert.isAtMost(result.durationMs, 55_000)
    }).pipe(Effect.provide(platform(Object.fromEntries(
      Array.from({ length: 17 }, (_, i) => [`Busy${i}Worker`, 1])
    )))))

  it.effect("the RunFinished summary is the program's summary", () =>
    Effect.gen(function*() {
      yield* seed(W, elements(0, 2))
      const result = yield* toCompletion(
        runBatch(ConcurrencyLimitResume, { trigger: "manual", budget: Duration.seconds(3) })
      )
      const events = yield* MemoryEvents
      assert.deepStrictEqual(events.map((e) => e.type), ["RunStarted", "ConcurrencyLimitJobsResumed", "RunFinished"])
      assert.deepStrictEqual(events[2]!.data.summary, result.summary)
      assert.deepStrictEqual(result.summary, {
        workers: [{ worker: W, limit: 5, queueSize: 2, current: 0, resumed: 2, effectiveLimit: 5 }],
        resumedJobs: 2,
        failedWorkers: [],
        heldMs: 0,
        heldBy: []
      })
    }).pipe(Effect.provide(platform({ [W]: 5 }))))
  it.effect("health gate: a throttled limit (HealthGate.effectiveLimit) resumes fewer, and is in the worker's summary", () =>
    Effect.gen(function*() {
      yield* seed(W, elements(0, 10))
      const asked: Array<string> = []
      const gate = {
        ...openGate,
        effectiveLimit: ({ batch, worker, limit }: { batch: string; worker: string; limit: number }) =>
          Effect.sync(() => (asked.push(`${batch} ${worker} ${limit}`), Math.floor(limit * 0.5)))
      }
      const fiber = yield* start(ConcurrencyLimitResume.run.pipe(Effect.provideService(HealthGate, gate)))
      // Half of 4: two moved (unthrottled, four), their slots reserved until they start.
      const redis = yield* MemoryRedis
      assert.lengthOf(redis.lrange(K.deferred, 0, -1), 8)
      yield* TestClock.adjust("2 minutes")
      const summary = yield* Fiber.join(fiber)
      assert.deepStrictEqual(summary.workers.map(({ limit, effectiveLimit }) => ({ limit, effectiveLimit })), [{
        limit: 4,
        effectiveLimit: 2
      }])
      assert.strictEqual(asked[0], `concurrency-limit-resume ${W} 4`)
    }).pipe(Effect.provide(platform({ [W]: 4 }))))

  it.effect("health gate: held past the deadline before the first pass → nothing moved, the hold in the summary", () =>
    Effect.gen(function*() {
      yield* seed(W, elements(0, 3))
      const gate = {
        ...openGate,
        beforeUnit: () => Effect.succeed({ proceed: false, heldMs: 55_000, heldBy: ["queueLatency"] })
      }
      const summary = yield* ConcurrencyLimitResume.run.pipe(Effect.provideService(HealthGate, gate))
      assert.deepStrictEqual(summary, {
        workers: [],
        resumedJobs: 0,
        failedWorkers: [],
        heldMs: 55_000,
        heldBy: ["queueLatency"]
      })
      assert.lengthOf((yield* MemoryRedis).lrange(K.deferred, 0, -1), 3)
    }).pipe(Effect.provide(platform({ [W]: 4 }))))
})
