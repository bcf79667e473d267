/**
 * One contract for both ConcurrencyLimits implementations: ConcurrencyLimitsMemory over MemoryRedis
 * and ConcurrencyLimitsRedis on one Redis, three Redis servers (one per GitLab store) and a Redis
 * Cluster. State is seeded and read through `Raw` in GitLab's key
 * formats, so the suite checks what GitLab and Sidekiq see, not just the service's own view; a last
 * suite runs the same scenario on both and compares every byte.
 */
import { assert, describe, it, layer, type Vitest } from "@effect/vitest"
import { Context, Effect, Layer, Logger, Option, Random, References } from "effect"
import { SweeperConfig } from "../../src/config/Config.ts"
import { MAX_RESUME_UNLIMITED, processWorkKey, workerKeys } from "../../src/domain/ConcurrencyLimit.ts"
import { queueKey, type SidekiqJob } from "../../src/domain/Sidekiq.ts"
import {
  type ConcurrencyLimitStore,
  makeConcurrencyLimits
} from "../../src/layers/protocols/ConcurrencyLimitsShared.ts"
import { ConcurrencyLimits } from "../../src/services/ConcurrencyLimits.ts"
import { at } from "../support/clock.ts"
import { ConcurrencyLimitsOn, type Deployment, RawStores } from "../support/concurrencyLimitsRaw.ts"
import { topologies } from "../support/redisTopology.ts"

const NOW = new Date("2026-03-01T12:00:00Z")
const NOW_S = NOW.getTime() / 1000
const W = "Releases::CreateEvidenceWorker"
const IDLE = "Projects::IdleWorker"
const CONFIG = { [W]: { limit: 5, queue: "default" }, [IDLE]: { limit: 2, queue: "low" } }
const K = workerKeys(W)

const element = (i: number) =>
  JSON.stringify({
    args: [i, { nested: [1.5, null, "x"] }, []],
    context: { "meta.user": "root" },
    buffered_at: NOW_S - 60 + i / 8
  })

interface Snapshot {
  readonly deferred: ReadonlyArray<string>
  readonly dead: ReadonlyArray<string>
  readonly queue: ReadonlyArray<string>
  readonly queues: ReadonlyArray<string>
  readonly pendingResumed: string | null
  readonly pendingResumedTtlMs: number
  readonly executing: ReadonlyArray<readonly [string, string]>
}

/**
 * A PTTL rounded up to 5 s: real time passes between the move and the read (seconds on a loaded
 * machine), so "set to 60 s by the move" reads as 60 000 on either backend. -1/-2 kept.
 */
const ttlBucket = (pttl: number) => pttl < 0 ? pttl : Math.ceil(pttl / 5000) * 5000

/** Direct access to the keys underneath the service. */
class Raw extends Context.Service<Raw, {
  readonly store: ConcurrencyLimitStore
  flush: Effect.Effect<void>
  rpush(key: string, ...values: ReadonlyArray<string>): Effect.Effect<void>
  lpop(key: string): Effect.Effect<string | null>
  hset(key: string, fields: Record<string, string>): Effect.Effect<void>
  set(key: string, value: string): Effect.Effect<void>
  snapshot(worker: string, queue: string): Effect.Effect<Snapshot>
}>()("test/layers/ConcurrencyLimits/Raw") {}

/** The suite's view, over the raw stores of whichever deployment runs it. */
const RawOverStores = Layer.effect(
  Raw,
  Effect.gen(function*() {
    const raw = yield* RawStores
    const text = (bytes: ReadonlyArray<Buffer>) => bytes.map((b) => b.toString("utf8"))
    return Raw.of({
      store: raw.store,
      flush: raw.flush,
      rpush: (key, ...values) => raw.rpush("sharedState", key, ...values),
      lpop: (key) => raw.lpop("sharedState", key),
      // Trackers live in QueuesMetadata, Sidekiq's work hashes in Queues.
      hset: (key, fields) => raw.hset(key.endsWith(":work") ? "queues" : "queuesMetadata", key, fields),
      set: (key, value) =>
        raw.set(/:(current_limit|pending_resumed)$/.test(key) ? "queuesMetadata" : "sharedState", key, value),
      snapshot: (worker, queue) =>
        Effect.gen(function*() {
          const keys = workerKeys(worker)
          return {
            deferred: text(yield* raw.list("sharedState", keys.deferred)),
            dead: text(yield* raw.list("sharedState", keys.dead)),
            queue: text(yield* raw.list("queues", queueKey(queue))),
            queues: [...(yield* raw.smembers("queues", "queues"))].sort(),
            pendingResumed: yield* raw.get("queuesMetadata", keys.pendingResumed),
            pendingResumedTtlMs: ttlBucket(yield* raw.pttl("queuesMetadata", keys.pendingResumed)),
            executing: Object.entries(yield* raw.hgetall("queuesMetadata", keys.executing)).sort()
          }
        })
    })
  })
)

const Config = SweeperConfig.layerWith({ concurrencyLimits: CONFIG })
const UnderTest = (deployment: Deployment) =>
  RawOverStores.pipe(Layer.provideMerge(ConcurrencyLimitsOn(deployment)), Layer.provideMerge(Config))
const MemoryUnderTest = UnderTest("memory")
const RedisUnderTest = UnderTest("single")

const text = (bytes: Uint8Array) => Buffer.from(bytes).toString("utf8")

const consumed = (snapshot: Snapshot) => [...snapshot.queue].reverse().map((raw) => JSON.parse(raw) as SidekiqJob)

/** A scenario touching every key: trackers (stale and live), pending slots, good and bad elements. */
const seedScenario = Effect.gen(function*() {
  const raw = yield* Raw
  yield* raw.flush
  yield* raw.rpush(
    K.deferred,
    element(0),
    "{broken",
    element(1),
    element(2),
    JSON.stringify({ args: {} }),
    element(3),
    element(4)
  )
  yield* raw.set(K.pendingResumed, "1")
  const work = JSON.stringify({
    queue: "default",
    payload: JSON.stringify({ class: W, args: [] }),
    run_at: NOW_S - 900
  })
  yield* raw.hset(processWorkKey("alive:1:a"), { t1: work })
  yield* raw.hset(K.executing, {
    "alive:1:a:tid:t1": String(NOW_S - 900),
    "dead:1:a:tid:t1": String(NOW_S - 900),
    "fresh:1:a:tid:t1": String(NOW_S - 10),
    "malformed": String(NOW_S - 900)
  })
})

const runScenario = Effect.gen(function*() {
  const limits = yield* ConcurrencyLimits
  const removed = yield* limits.cleanupStaleTrackers(W)
  const current = yield* limits.currentConcurrency(W)
  const result = yield* limits.resume({ worker: W, queue: "default", max: 5 - current, dryRun: false })
  return { removed, current, result }
}).pipe(Random.withSeed("concurrency-limits-contract"), at(NOW))

const contract = (it: Vitest.MethodsNonLive<ConcurrencyLimits | Raw>) => {
  it.effect("finds configured and SCAN-discovered workers that have deferred jobs", () =>
    Effect.gen(function*() {
      const raw = yield* Raw
      const limits = yield* ConcurrencyLimits
      yield* raw.flush
      yield* raw.rpush(K.deferred, element(0))
      yield* raw.rpush(workerKeys("Namespaces::ProcessSyncEventsWorker").deferred, element(0))
      yield* raw.rpush(workerKeys("Gitlab::GithubImport::Stage::ImportRepositoryWorker").deferred, element(0))
      // Noise beyond SCAN's page size, including near-miss keys.
      for (let i = 0; i < 250; i++) yield* raw.set(`sidekiq:concurrency_limit:{noise_${i}}:executing_not`, "x")
      yield* raw.set("sidekiq:concurrency_limit:throttled_jobs_elsewhere", "x")
      const found = yield* limits.workersWithDeferredJobs
      assert.deepStrictEqual([...found].sort(), [
        "Gitlab::GithubImport::Stage::ImportRepositoryWorker",
        "Namespaces::ProcessSyncEventsWorker",
        W
      ])
      // IDLE is configured but has nothing deferred.
      assert.notInclude(found, IDLE)
    }))

  it.effect("limit: Redis override, else configuration, else None; the queue comes from configuration", () =>
    Effect.gen(function*() {
      const raw = yield* Raw
      const limits = yield* ConcurrencyLimits
      yield* raw.flush
      assert.deepStrictEqual(
        yield* limits.limitOf(W),
        Option.some({ limit: 5, queue: "default", source: "config" as const })
      )
      yield* raw.set(K.currentLimit, "-1")
      assert.deepStrictEqual(
        yield* limits.limitOf(W),
        Option.some({ limit: -1, queue: "default", source: "redis" as const })
      )
      yield* raw.set(workerKeys(IDLE).currentLimit, "0")
      assert.deepStrictEqual(
        yield* limits.limitOf(IDLE),
        Option.some({ limit: 0, queue: "low", source: "redis" as const })
      )
      yield* raw.set(workerKeys(IDLE).currentLimit, "1.5")
      assert.deepStrictEqual(
        yield* limits.limitOf(IDLE),
        Option.some({ limit: 2, queue: "low", source: "config" as const })
      )
      assert.isTrue(Option.isNone(yield* limits.limitOf("Unknown::Worker")))
      yield* raw.set(workerKeys("Unknown::Worker").currentLimit, "3")
      assert.deepStrictEqual(
        yield* limits.limitOf("Unknown::Worker"),
        Option.some({ limit: 3, queue: "default", source: "redis" as const })
      )
    }))

  it.effect("queue size is LLEN; current is HLEN(executing) + pending_resumed (garbage or negative counts as 0)", () =>
    Effect.gen(function*() {
      const raw = yield* Raw
      const limits = yield* ConcurrencyLimits
      yield* raw.flush
      assert.strictEqual(yield* limits.queueSize(W), 0)
      assert.strictEqual(yield* limits.currentConcurrency(W), 0)
      yield* raw.rpush(K.deferred, element(0), element(1), "junk")
      yield* raw.hset(K.executing, { "a:tid:1": String(NOW_S), "b:tid:2": String(NOW_S) })
      yield* raw.set(K.pendingResumed, "3")
      assert.strictEqual(yield* limits.queueSize(W), 3)
      assert.strictEqual(yield* limits.currentConcurrency(W), 5)
      yield* raw.set(K.pendingResumed, "-2")
      assert.strictEqual(yield* limits.currentConcurrency(W), 2)
      yield* raw.set(K.pendingResumed, "many")
      assert.strictEqual(yield* limits.currentConcurrency(W), 2)
    }))

  it.effect("stale trackers: removed when old and not backed by this worker's running job, or malformed", () =>
    Effect.gen(function*() {
      yield* seedScenario
      const { removed, current } = yield* runScenario
      assert.strictEqual(removed, 2)
      assert.strictEqual(current, 3) // alive + fresh + 1 pending
      const after = yield* (yield* Raw).snapshot(W, "default")
      assert.deepStrictEqual(after.executing.map(([field]) => field), ["alive:1:a:tid:t1", "fresh:1:a:tid:t1"])
    }))

  it.effect("the move: FIFO Sidekiq jobs, args kept exactly, unparsable elements to the dead list, slots reserved", () =>
    Effect.gen(function*() {
      yield* seedScenario
      const { result } = yield* runScenario
      const after = yield* (yield* Raw).snapshot(W, "default")
      const jobs = consumed(after)
      assert.deepStrictEqual(jobs.map((job) => job.args[0]), [0, 1])
      assert.deepStrictEqual(jobs[0]!.args, [0, { nested: [1.5, null, "x"] }, []])
      assert.deepStrictEqual(result.jids, jobs.map((job) => job.jid))
      assert.deepStrictEqual(result.dead.map(text), ["{broken"])
      assert.deepStrictEqual(after.dead, ["{broken"])
      assert.deepStrictEqual(after.deferred, [element(2), JSON.stringify({ args: {} }), element(3), element(4)])
      assert.deepStrictEqual(after.queues, ["default"])
      assert.strictEqual(after.pendingResumed, "3")
      assert.strictEqual(after.pendingResumedTtlMs, 60_000)
      for (const job of jobs) {
        assert.match(job.jid, /^[0-9a-f]{24}$/)
        assert.strictEqual(job.created_at, NOW_S)
        assert.strictEqual(job.class, W)
        assert.strictEqual(job.concurrency_limit_resume, true)
      }
    }))

  it.effect("a full unlimited move (MAX_RESUME_UNLIMITED jobs of 1 KB) goes through in one move: each once, in order, slots reserved", () =>
    Effect.gen(function*() {
      // The largest move a limit-0 pass makes: the journal step gets 2 × 5000 arguments (≈ 10 MB
      // here) and the push step 5000, each in one script call on Redis.
      const raw = yield* Raw
      yield* raw.flush
      const pad = "x".repeat(1000)
      const big = (i: number) => JSON.stringify({ args: [i, pad], buffered_at: NOW_S - 60 })
      yield* raw.rpush(K.deferred, ...Array.from({ length: MAX_RESUME_UNLIMITED + 1 }, (_, i) => big(i)))
      const result = yield* (yield* ConcurrencyLimits).resume({
        worker: W,
        queue: "default",
        max: MAX_RESUME_UNLIMITED,
        dryRun: false
      })
      assert.lengthOf(result.jids, MAX_RESUME_UNLIMITED)
      const after = yield* raw.snapshot(W, "default")
      const jobs = consumed(after)
      assert.deepStrictEqual(jobs.map((job) => job.args[0]), Array.from({ length: MAX_RESUME_UNLIMITED }, (_, i) => i))
      assert.strictEqual(new Set(jobs.map((job) => job.jid)).size, MAX_RESUME_UNLIMITED)
      assert.deepStrictEqual(after.deferred, [big(MAX_RESUME_UNLIMITED)])
      assert.strictEqual(after.pendingResumed, String(MAX_RESUME_UNLIMITED))
    }).pipe(at(NOW)))

  it.effect("a dry run reads and decides, writes nothing", () =>
    Effect.gen(function*() {
      yield* seedScenario
      const raw = yield* Raw
      const before = yield* raw.snapshot(W, "default")
      const limits = yield* ConcurrencyLimits
      const result = yield* limits.resume({ worker: W, queue: "default", max: 3, dryRun: true })
      assert.lengthOf(result.jids, 3)
      assert.deepStrictEqual(result.dead.map(text), ["{broken"])
      assert.deepStrictEqual(yield* raw.snapshot(W, "default"), before)
      // Which elements it would take (the first four: three jobs and the broken one) and the one after.
      const digests = yield* limits.deferredDigests(W, 5)
      assert.lengthOf(digests, 5)
      for (const digest of digests) assert.match(digest, /^[0-9a-f]{16}$/)
      assert.strictEqual(new Set(digests).size, 5)
      assert.deepStrictEqual(result.preview, { first: digests[0], last: digests[3], next: digests[4] })
    }))

  it.effect("a list of only unparsable elements is emptied into the dead list without reserving slots", () =>
    Effect.gen(function*() {
      const raw = yield* Raw
      yield* raw.flush
      yield* raw.rpush(K.deferred, "a", "", "c")
      const logs: Array<{ level: string; message: string; annotations: unknown }> = []
      const collector = Logger.make((options) => {
        logs.push({
          level: options.logLevel,
          message: String(options.message),
          annotations: options.fiber.getRef(References.CurrentLogAnnotations)
        })
      })
      const limits = yield* ConcurrencyLimits
      yield* limits.resume({ worker: W, queue: "default", max: 1, dryRun: true }).pipe(
        Effect.provide(Logger.layer([collector]))
      )
      assert.deepStrictEqual(logs, [], "a dry run moves nothing to the dead list, so says nothing")
      const result = yield* limits.resume({ worker: W, queue: "default", max: 1, dryRun: false }).pipe(
        Effect.provide(Logger.layer([collector]))
      )
      assert.deepStrictEqual(result.jids, [])
      assert.deepStrictEqual(result.dead.map(text), ["a", "", "c"])
      // One warning for the move, with the dead list and a preview of the first element.
      assert.deepStrictEqual(logs.map((log) => [log.level, log.message, log.annotations]), [
        ["Warn", "Moved unparsable deferred jobs to the dead list", {
          worker: W,
          count: 3,
          dead_list: K.dead,
          sample: "a"
        }]
      ])
      const after = yield* raw.snapshot(W, "default")
      assert.deepStrictEqual(after.dead, ["a", "", "c"])
      assert.deepStrictEqual(after.deferred, [])
      assert.isNull(after.pendingResumed)
      assert.deepStrictEqual(after.queues, [])
    }))

  it.effect("jobs appended while a move is under way stay in the list, after the moved ones", () =>
    Effect.gen(function*() {
      const raw = yield* Raw
      yield* raw.flush
      yield* raw.rpush(K.deferred, element(0), element(1), element(2))
      // GitLab's middleware RPUSHes between our read of the head and the move itself.
      const racing: ConcurrencyLimitStore = {
        ...raw.store,
        beginMove: (prepared) =>
          Effect.andThen(raw.rpush(K.deferred, element(3), element(4)), raw.store.beginMove(prepared))
      }
      const result = yield* makeConcurrencyLimits(racing, CONFIG).resume({
        worker: W,
        queue: "default",
        max: 3,
        dryRun: false
      })
      assert.lengthOf(result.jids, 3)
      const after = yield* raw.snapshot(W, "default")
      assert.deepStrictEqual(consumed(after).map((job) => job.args[0]), [0, 1, 2])
      assert.deepStrictEqual(after.deferred, [element(3), element(4)])
    }))

  it.effect("another mover taking the head first: our move writes nothing, re-reads, and never duplicates a job", () =>
    Effect.gen(function*() {
      const raw = yield* Raw
      yield* raw.flush
      yield* raw.rpush(K.deferred, element(0), element(1), element(2), element(3))
      let stolen: string | null = null
      const contended: ConcurrencyLimitStore = {
        ...raw.store,
        beginMove: (prepared) =>
          Effect.gen(function*() {
            if (stolen === null) stolen = yield* raw.lpop(K.deferred)
            return yield* raw.store.beginMove(prepared)
          })
      }
      const result = yield* makeConcurrencyLimits(contended, CONFIG).resume({
        worker: W,
        queue: "default",
        max: 2,
        dryRun: false
      })
      assert.strictEqual(stolen, element(0))
      const after = yield* raw.snapshot(W, "default")
      assert.deepStrictEqual(consumed(after).map((job) => job.args[0]), [1, 2])
      assert.deepStrictEqual(result.jids, consumed(after).map((job) => job.jid))
      assert.deepStrictEqual(after.deferred, [element(3)])
      assert.strictEqual(after.pendingResumed, "2")
    }))

  it.effect("a mover that dies before its move leaves everything as it was", () =>
    Effect.gen(function*() {
      yield* seedScenario
      const raw = yield* Raw
      const before = yield* raw.snapshot(W, "default")
      const dying: ConcurrencyLimitStore = { ...raw.store, beginMove: () => Effect.interrupt }
      const exit = yield* Effect.exit(
        makeConcurrencyLimits(dying, CONFIG).resume({ worker: W, queue: "default", max: 3, dryRun: false })
      )
      assert.isTrue(exit._tag === "Failure")
      assert.deepStrictEqual(yield* raw.snapshot(W, "default"), before)
    }))

  /** A store whose move scripts are slowed (they yield first) and whose calls on the deferred list are logged. */
  const loggedStore = (log: Array<string>) =>
    Effect.map(Raw, (raw): ConcurrencyLimitStore => {
      const slowly = <A, E>(effect: Effect.Effect<A, E>) =>
        Effect.andThen(Effect.repeat(Effect.yieldNow, { times: 20 }), effect)
      return {
        ...raw.store,
        lrange: (key, start, stop) => {
          if (key === K.deferred) log.push(`lrange ${start}`)
          return raw.store.lrange(key, start, stop)
        },
        beginMove: (move) =>
          Effect.gen(function*() {
            log.push(`begin ${text(move.expected[0]!)}`)
            const outcome = yield* slowly(raw.store.beginMove(move))
            log.push(`began ${outcome}`)
            return outcome
          }),
        endMove: (journal, header) =>
          Effect.tap(slowly(raw.store.endMove(journal, header)), () => Effect.sync(() => log.push("ended")))
      }
    })

  it.effect("limit 0: the next head is read (past the move's elements) before the move's scripts run, and moved next", () =>
    Effect.gen(function*() {
      const raw = yield* Raw
      yield* raw.flush
      const total = 2 * MAX_RESUME_UNLIMITED + 3
      yield* raw.rpush(K.deferred, ...Array.from({ length: total }, (_, i) => element(i)))
      const log: Array<string> = []
      const limits = makeConcurrencyLimits(yield* loggedStore(log), CONFIG)
      const resume = limits.resume({ worker: W, queue: "default", max: MAX_RESUME_UNLIMITED, dryRun: false })
      const first = yield* resume
      // The head after this move, read from where the move's elements end, before BEGIN_MOVE is sent.
      assert.deepStrictEqual(log, [
        "lrange 0",
        `lrange ${MAX_RESUME_UNLIMITED}`,
        `begin ${element(0)}`,
        "began moved",
        "ended"
      ])
      log.length = 0
      const second = yield* resume
      // Moved as read ahead: no read of the head before its BEGIN_MOVE; it reads the one after it.
      assert.deepStrictEqual(log, [
        `lrange ${MAX_RESUME_UNLIMITED}`,
        `begin ${element(MAX_RESUME_UNLIMITED)}`,
        "began moved",
        "ended"
      ])
      log.length = 0
      const third = yield* resume
      // The last three, as read ahead: a move that found fewer than its max reads nothing ahead.
      assert.deepStrictEqual(log, [`begin ${element(2 * MAX_RESUME_UNLIMITED)}`, "began moved", "ended"])
      const after = yield* raw.snapshot(W, "default")
      assert.deepStrictEqual(consumed(after).map((job) => job.args[0]), Array.from({ length: total }, (_, i) => i))
      assert.deepStrictEqual(consumed(after).map((job) => job.jid), [...first.jids, ...second.jids, ...third.jids])
      assert.strictEqual(new Set(consumed(after).map((job) => job.jid)).size, total)
      assert.deepStrictEqual(after.deferred, [])
      assert.strictEqual(after.pendingResumed, String(total))
    }))

  it.effect("a head read ahead that another client changed is caught by the move's compare: re-read, nothing lost or twice", () =>
    Effect.gen(function*() {
      const raw = yield* Raw
      yield* raw.flush
      const total = 2 * MAX_RESUME_UNLIMITED + 2
      yield* raw.rpush(K.deferred, ...Array.from({ length: total }, (_, i) => element(i)))
      const log: Array<string> = []
      const limits = makeConcurrencyLimits(yield* loggedStore(log), CONFIG)
      const resume = limits.resume({ worker: W, queue: "default", max: MAX_RESUME_UNLIMITED, dryRun: false })
      const first = yield* resume
      // Between the read ahead and the next move, another mover takes the next head's first job.
      assert.strictEqual(yield* raw.lpop(K.deferred), element(MAX_RESUME_UNLIMITED))
      log.length = 0
      const second = yield* resume
      assert.deepStrictEqual(log.filter((entry) => !entry.startsWith("lrange")), [
        `begin ${element(MAX_RESUME_UNLIMITED)}`,
        "began changed",
        `begin ${element(MAX_RESUME_UNLIMITED + 1)}`,
        "began moved",
        "ended"
      ])
      assert.include(log, "lrange 0", "the changed head is read again")
      // A max other than the read-ahead head's (the limit changed between passes): that head is dropped.
      const third = yield* limits.resume({ worker: W, queue: "default", max: 1, dryRun: false })
      const after = yield* raw.snapshot(W, "default")
      const taken = MAX_RESUME_UNLIMITED
      const expected = Array.from({ length: total }, (_, i) => i).filter((i) => i !== taken).slice(0, 2 * taken + 1)
      assert.deepStrictEqual(consumed(after).map((job) => job.args[0]), expected)
      assert.deepStrictEqual(consumed(after).map((job) => job.jid), [...first.jids, ...second.jids, ...third.jids])
      assert.strictEqual(new Set(consumed(after).map((job) => job.jid)).size, expected.length)
      assert.deepStrictEqual(after.deferred, [])
      assert.strictEqual(after.pendingResumed, String(expected.length))
    }))

  it.effect("moves racing with appends: every job ends up exactly once, in buffering order", () =>
    Effect.gen(function*() {
      const raw = yield* Raw
      const limits = yield* ConcurrencyLimits
      yield* raw.flush
      const total = 150
      const appender = Effect.forEach(
        Array.from({ length: total }, (_, i) => i),
        (i) => Effect.andThen(raw.rpush(K.deferred, i % 10 === 7 ? `junk-${i}` : element(i)), Effect.yieldNow),
        { discard: true }
      )
      const mover = Effect.forEach(
        Array.from({ length: 40 }, (_, i) => i),
        () => Effect.andThen(limits.resume({ worker: W, queue: "default", max: 3, dryRun: false }), Effect.yieldNow),
        { discard: true }
      )
      yield* Effect.all([appender, mover], { concurrency: 2, discard: true })
      const after = yield* raw.snapshot(W, "default")
      const all = Array.from({ length: total }, (_, i) => i)
      const resumed = consumed(after).map((job) => job.args[0] as number)
      const deferredGood = after.deferred.filter((e) => !e.startsWith("junk-")).map((e) =>
        (JSON.parse(e) as { args: [number] }).args[0]
      )
      const deferredJunk = after.deferred.filter((e) => e.startsWith("junk-"))
      assert.isAbove(resumed.length, 0)
      // Resumed first, then what is still deferred: every parsable job exactly once, in buffering order.
      assert.deepStrictEqual([...resumed, ...deferredGood], all.filter((i) => i % 10 !== 7))
      // Likewise every unparsable element: dead list first, then still deferred.
      assert.deepStrictEqual([...after.dead, ...deferredJunk], all.filter((i) => i % 10 === 7).map((i) => `junk-${i}`))
      assert.strictEqual(after.pendingResumed, String(resumed.length))
    }))
}

describe("ConcurrencyLimits contract", () => {
  layer(MemoryUnderTest)("ConcurrencyLimitsMemory (MemoryRedis)", (it) => {
    contract(it)
  })

  // Every key in its GitLab store: one server, three servers (one per store), a cluster.
  for (const topology of topologies) {
    layer(UnderTest(topology), { excludeTestServices: true, timeout: "180 seconds" })(
      `ConcurrencyLimitsRedis (${topology})`,
      (it) => {
        contract(it)
      }
    )
  }
})

describe("ConcurrencyLimits: memory and Redis write the same bytes", () => {
  it.live("same seeded state, same clock, same random seed → identical keys afterwards", () =>
    Effect.gen(function*() {
      const outcome = (implementation: Layer.Layer<ConcurrencyLimits | Raw>) =>
        Effect.gen(function*() {
          yield* seedScenario
          const result = yield* runScenario
          return { result, snapshot: yield* (yield* Raw).snapshot(W, "default") }
        }).pipe(Effect.provide(implementation))
      const memory = yield* outcome(MemoryUnderTest)
      const redis = yield* outcome(RedisUnderTest)
      assert.deepStrictEqual(redis, memory)
      assert.lengthOf(memory.result.result.jids, 2)
    }))
})
