/**
 * One contract for JobQueue, run against the in-memory Redis and a real Redis server:
 * what a Sidekiq consumer finds in `queue:<queue>` and `queues`, and the until_executed claims.
 */
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Layer, Random, Schema } from "effect"
import { TestClock } from "effect/testing"
import { RedisError } from "../../src/domain/Errors.ts"
import { queueKey, QUEUES_SET } from "../../src/domain/Sidekiq.ts"
import { pushedMarkerKey } from "../../src/domain/TransitionJobs.ts"
import { JobQueueMemory } from "../../src/layers/memory/JobQueueMemory.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import {
  type ClaimHolder,
  duplicateKey,
  type JobQueueStore,
  makeJobQueue,
  type PreparedJob
} from "../../src/layers/protocols/JobQueueShared.ts"
import { JobQueueRedis } from "../../src/layers/redis/JobQueueRedis.ts"
import { QueuesMetadataRedis, QueuesRedis } from "../../src/layers/redis/Redis.ts"
import { type EnqueueOutcome, JobQueue } from "../../src/services/JobQueue.ts"
import { RedisTopologyTest, topologies } from "../support/redisTopology.ts"

/** Direct access to the keys, as the Sidekiq consumer (or an operator with redis-cli) sees them. */
class Keys extends Context.Service<Keys, {
  list(key: string): Effect.Effect<ReadonlyArray<string>>
  members(key: string): Effect.Effect<ReadonlyArray<string>>
  get(key: string): Effect.Effect<string | null>
  /** Remaining TTL in seconds (fractional), -2 missing, -1 none. */
  ttl(key: string): Effect.Effect<number>
  del(key: string): Effect.Effect<void>
  setString(key: string, value: string): Effect.Effect<void>
}>()("test/layers/JobQueue/Keys") {}

/** Each key in its GitLab store: claims in QueuesMetadata, the rest in Queues. */
const RedisKeys = Layer.effect(
  Keys,
  Effect.gen(function*() {
    const queues = yield* QueuesRedis
    const metadata = yield* QueuesMetadataRedis
    const store = (key: string) => (key.startsWith("resque:gitlab:duplicate:") ? metadata : queues)
    return Keys.of({
      list: (key) => Effect.orDie(store(key).use("LRANGE", (c) => c.lrange(key, 0, -1))),
      members: (key) => Effect.orDie(store(key).use("SMEMBERS", (c) => c.smembers(key))),
      get: (key) => Effect.orDie(store(key).use("GET", (c) => c.get(key))),
      ttl: (key) =>
        Effect.orDie(store(key).use("PTTL", (c) => c.pttl(key))).pipe(Effect.map((ms) => (ms < 0 ? ms : ms / 1000))),
      del: (key) => Effect.orDie(store(key).use("DEL", (c) => c.del(key))),
      setString: (key, value) => Effect.orDie(store(key).use("SET", (c) => c.set(key, value)))
    })
  })
)

const backends: Record<string, Layer.Layer<JobQueue | Keys>> = {
  memory: JobQueueMemory.pipe(
    Layer.merge(Layer.effect(
      Keys,
      Effect.map(MemoryRedis, (store) =>
        Keys.of({
          list: (key) => Effect.sync(() => store.lrange(key, 0, -1)),
          members: (key) => Effect.sync(() => store.smembers(key)),
          get: (key) => Effect.sync(() => store.get(key)),
          ttl: (key) =>
            Effect.sync(() => {
              const pttl = store.pttl(key)
              return pttl < 0 ? pttl : pttl / 1000
            }),
          del: (key) => Effect.sync(() => void store.del(key)),
          setString: (key, value) => Effect.sync(() => void store.set(key, value))
        }))
    )),
    Layer.provideMerge(MemoryRedis.layer)
  ),
  ...Object.fromEntries(topologies.map((topology) => [
    `redis ${topology}`,
    Layer.mergeAll(JobQueueRedis, RedisKeys).pipe(Layer.provideMerge(RedisTopologyTest(topology)))
  ]))
}

/** The job as a Sidekiq consumer parses it. */
const SidekiqJobJson = Schema.fromJsonString(Schema.Struct({
  class: Schema.String,
  args: Schema.Array(Schema.Unknown),
  jid: Schema.String,
  queue: Schema.String,
  retry: Schema.Literal(true),
  created_at: Schema.Number,
  enqueued_at: Schema.Number
}))
const parseJob = Schema.decodeUnknownSync(SidekiqJobJson)

const WORKER = "Issues::RebalancingWorker"
const QUEUE = "issues_rebalancing"
const NOW_MILLIS = Date.parse("2026-03-01T12:00:00.123Z")

const jidOf = (outcome: EnqueueOutcome) => {
  assert.strictEqual(outcome._tag, "Enqueued")
  return outcome._tag === "Enqueued" ? outcome.jid : ""
}

for (const [name, backend] of Object.entries(backends)) {
  describe(`JobQueue contract (${name})`, () => {
    it.effect("no jobs: no outcomes, nothing written", () =>
      Effect.gen(function*() {
        const queue = yield* JobQueue
        const keys = yield* Keys
        assert.deepStrictEqual(yield* queue.bulkEnqueue({ workerClass: WORKER, queue: QUEUE, args: [] }), [])
        assert.deepStrictEqual(yield* keys.members(QUEUES_SET), [])
        assert.deepStrictEqual(yield* keys.list(queueKey(QUEUE)), [])
      }).pipe(Effect.provide(backend)))

    it.effect("job JSON: class, args, 24-hex jid, queue, retry true, float epoch seconds from the Clock", () =>
      Effect.gen(function*() {
        yield* TestClock.setTime(NOW_MILLIS)
        const queue = yield* JobQueue
        const keys = yield* Keys
        const [outcome] = yield* queue.bulkEnqueue({ workerClass: WORKER, queue: QUEUE, args: [[null, 42, null]] })
        const jid = jidOf(outcome!)
        assert.match(jid, /^[0-9a-f]{24}$/)
        const [payload] = yield* keys.list(queueKey(QUEUE))
        const raw = JSON.parse(payload!) as Record<string, unknown>
        assert.deepStrictEqual(Object.keys(raw).sort(), [
          "args",
          "class",
          "created_at",
          "enqueued_at",
          "jid",
          "queue",
          "retry"
        ])
        assert.deepStrictEqual(parseJob(payload), {
          class: WORKER,
          args: [null, 42, null],
          jid,
          queue: QUEUE,
          retry: true,
          created_at: 1772366400.123,
          enqueued_at: 1772366400.123
        })
        assert.deepStrictEqual(yield* keys.members(QUEUES_SET), [QUEUE])
      }).pipe(Effect.provide(backend)))

    it.effect("LPUSH in order: the consumer (RPOP end) sees the first job first; queues lists every queue", () =>
      Effect.gen(function*() {
        const queue = yield* JobQueue
        const keys = yield* Keys
        const outcomes = yield* queue.bulkEnqueue({ workerClass: WORKER, queue: QUEUE, args: [[1], [2], [3]] })
        yield* queue.bulkEnqueue({ workerClass: "OtherWorker", queue: "default", args: [["x"]] })
        const listed = (yield* keys.list(queueKey(QUEUE))).map((payload) => parseJob(payload))
        assert.deepStrictEqual(listed.map((job) => job.args), [[3], [2], [1]])
        assert.deepStrictEqual(listed.map((job) => job.jid), outcomes.map(jidOf).reverse())
        assert.strictEqual(new Set(outcomes.map(jidOf)).size, 3)
        assert.deepStrictEqual([...(yield* keys.members(QUEUES_SET))].sort(), ["default", QUEUE])
        assert.deepStrictEqual((yield* keys.list(queueKey("default"))).map((p) => parseJob(p).class), ["OtherWorker"])
      }).pipe(Effect.provide(backend)))

    it.effect("2500 jobs (three slices): every job present once, in order", () =>
      Effect.gen(function*() {
        const queue = yield* JobQueue
        const keys = yield* Keys
        const args = Array.from({ length: 2500 }, (_, i) => [null, i + 1, null])
        const outcomes = yield* queue.bulkEnqueue({
          workerClass: WORKER,
          queue: QUEUE,
          args,
          deduplicate: "until_executed"
        })
        assert.lengthOf(outcomes, 2500)
        assert.deepStrictEqual(outcomes.map((o) => o.args), args)
        const jids = outcomes.map(jidOf)
        assert.strictEqual(new Set(jids).size, 2500)
        const listed = (yield* keys.list(queueKey(QUEUE))).map((payload) => parseJob(payload))
        assert.lengthOf(listed, 2500)
        assert.deepStrictEqual(listed.map((job) => job.jid), [...jids].reverse())
        assert.strictEqual(yield* keys.get(duplicateKey(QUEUE, WORKER, [null, 2500, null])), jids[2499])
      }).pipe(Effect.provide(backend)))

    it.effect("until_executed: claim set NX EX 600 to the jid; a held claim drops the job as a duplicate", () =>
      Effect.gen(function*() {
        const queue = yield* JobQueue
        const keys = yield* Keys
        const request = {
          workerClass: WORKER,
          queue: QUEUE,
          args: [[null, null, 5]],
          deduplicate: "until_executed"
        } as const
        const key = duplicateKey(QUEUE, WORKER, [null, null, 5])
        assert.match(key, /^resque:gitlab:duplicate:issues_rebalancing:[0-9a-f]{64}$/)

        const [first] = yield* queue.bulkEnqueue(request)
        const jid = jidOf(first!)
        assert.strictEqual(yield* keys.get(key), jid)
        const ttl = yield* keys.ttl(key)
        assert.isAbove(ttl, 590)
        assert.isAtMost(ttl, 600)

        const [second] = yield* queue.bulkEnqueue(request)
        assert.deepStrictEqual(second, { _tag: "Duplicate", args: [null, null, 5], existingJid: jid })
        assert.lengthOf(yield* keys.list(queueKey(QUEUE)), 1)
        assert.strictEqual(yield* keys.get(key), jid, "a duplicate does not take over the claim")

        // The consumer deletes the claim once the job ran: the next enqueue goes through.
        yield* keys.del(key)
        const [third] = yield* queue.bulkEnqueue(request)
        assert.notStrictEqual(jidOf(third!), jid)
        assert.strictEqual(yield* keys.get(key), jidOf(third!))
        assert.lengthOf(yield* keys.list(queueKey(QUEUE)), 2)
      }).pipe(Effect.provide(backend)))

    it.effect("claimHolder reads a job's until_executed claim; peek the queue's first jobs as bytes; extra keys ride along", () =>
      Effect.gen(function*() {
        const queue = yield* JobQueue
        assert.isNull(yield* queue.claimHolder(QUEUE, WORKER, [null, null, 5]))
        assert.deepStrictEqual(yield* queue.peek(QUEUE, 10), [])
        const [pushed] = yield* queue.bulkEnqueue({
          workerClass: WORKER,
          queue: QUEUE,
          args: [[null, null, 5], [null, 6, null]],
          deduplicate: "until_executed",
          extra: { "meta.caller_id": "Issues::RescheduleStuckIssueRebalancesWorker" }
        })
        assert.strictEqual(yield* queue.claimHolder(QUEUE, WORKER, [null, null, 5]), jidOf(pushed!))
        assert.isNull(yield* queue.claimHolder(QUEUE, "IssueRebalancingWorker", [null, null, 5]))
        const [head] = yield* queue.peek(QUEUE, 1)
        const job = JSON.parse(Buffer.from(head!).toString("utf8")) as Record<string, unknown>
        // LPUSH: the last pushed is at the head.
        assert.deepStrictEqual(job.args, [null, 6, null])
        assert.strictEqual(job["meta.caller_id"], "Issues::RescheduleStuckIssueRebalancesWorker")
        assert.lengthOf(yield* queue.peek(QUEUE, 10), 2)
        yield* (yield* Keys).setString(duplicateKey(QUEUE, WORKER, [1]), "x")
        assert.strictEqual(yield* queue.claimHolder(QUEUE, WORKER, [1]), "x")
      }).pipe(Effect.provide(backend)))

    it.effect("the same args twice in one bulk push: the second is a duplicate of the first", () =>
      Effect.gen(function*() {
        const queue = yield* JobQueue
        const keys = yield* Keys
        const outcomes = yield* queue.bulkEnqueue({
          workerClass: WORKER,
          queue: QUEUE,
          args: [[null, 1, null], [null, 1, null], [null, 2, null]],
          deduplicate: "until_executed"
        })
        assert.deepStrictEqual(outcomes.map((o) => o._tag), ["Enqueued", "Duplicate", "Enqueued"])
        assert.deepStrictEqual(outcomes[1], {
          _tag: "Duplicate",
          args: [null, 1, null],
          existingJid: jidOf(outcomes[0]!)
        })
        assert.lengthOf(yield* keys.list(queueKey(QUEUE)), 2)
      }).pipe(Effect.provide(backend)))

    it.effect("claims are per class, queue and args; without de-duplication nothing is claimed", () =>
      Effect.gen(function*() {
        const queue = yield* JobQueue
        const keys = yield* Keys
        yield* queue.bulkEnqueue({
          workerClass: WORKER,
          queue: QUEUE,
          args: [[null, null, 5]],
          deduplicate: "until_executed"
        })
        const others = [
          yield* queue.bulkEnqueue({
            workerClass: WORKER,
            queue: QUEUE,
            args: [[null, 5, null]],
            deduplicate: "until_executed"
          }),
          yield* queue.bulkEnqueue({
            workerClass: "Other",
            queue: QUEUE,
            args: [[null, null, 5]],
            deduplicate: "until_executed"
          }),
          yield* queue.bulkEnqueue({
            workerClass: WORKER,
            queue: "default",
            args: [[null, null, 5]],
            deduplicate: "until_executed"
          }),
          yield* queue.bulkEnqueue({ workerClass: WORKER, queue: QUEUE, args: [[null, null, 5]] }),
          yield* queue.bulkEnqueue({ workerClass: WORKER, queue: QUEUE, args: [[null, null, 5]], deduplicate: "none" })
        ]
        assert.deepStrictEqual(others.map(([o]) => o!._tag), [
          "Enqueued",
          "Enqueued",
          "Enqueued",
          "Enqueued",
          "Enqueued"
        ])
        assert.lengthOf(yield* keys.list(queueKey(QUEUE)), 5)
      }).pipe(Effect.provide(backend)))

    it.effect("a push that fails (WRONGTYPE) leaves no claim behind and fails with RedisError", () =>
      Effect.gen(function*() {
        const queue = yield* JobQueue
        const keys = yield* Keys
        yield* keys.setString(queueKey("broken"), "not a list")
        const error = yield* Effect.flip(queue.bulkEnqueue({
          workerClass: WORKER,
          queue: "broken",
          args: [[null, null, 9]],
          deduplicate: "until_executed"
        }))
        assert.instanceOf(error, RedisError)
        assert.strictEqual(yield* keys.get(duplicateKey("broken", WORKER, [null, null, 9])), null)
        assert.strictEqual(yield* keys.get(queueKey("broken")), "not a list")
      }).pipe(Effect.provide(backend)))

    it.effect("pushOnce: a batch pushed whole with its marker (TTL), refused whole the second time", () =>
      Effect.gen(function*() {
        yield* TestClock.setTime(NOW_MILLIS)
        const queue = yield* JobQueue
        const keys = yield* Keys
        const marker = pushedMarkerKey("default", "5d2c1f0e-8b7a-4c3d-9e6f-0a1b2c3d4e5f")
        const batch = {
          queue: "default",
          marker,
          ttlSeconds: 600,
          jobs: [
            { workerClass: "PipelineProcessWorker", args: [700], createdAtMillis: NOW_MILLIS - 1500, retry: 3 },
            { workerClass: "Ci::BuildFinishedWorker", args: [1], createdAtMillis: NOW_MILLIS - 1500, retry: 3 }
          ]
        }
        assert.strictEqual(yield* queue.pushOnce(batch), "pushed")
        assert.strictEqual(yield* queue.pushOnce(batch), "already")
        const jobs = (yield* keys.list(queueKey("default"))).map((raw) => JSON.parse(raw) as Record<string, unknown>)
        // LPUSH: the consumer pops from the right, so the first job of the batch is at the end.
        assert.deepStrictEqual(jobs.map((j) => [j.class, j.args, j.queue, j.retry]).toReversed(), [
          ["PipelineProcessWorker", [700], "default", 3],
          ["Ci::BuildFinishedWorker", [1], "default", 3]
        ])
        for (const job of jobs) {
          assert.strictEqual(job.created_at, (NOW_MILLIS - 1500) / 1000)
          assert.strictEqual(job.enqueued_at, NOW_MILLIS / 1000)
          assert.match(String(job.jid), /^[0-9a-f]{24}$/)
        }
        assert.include(yield* keys.members(QUEUES_SET), "default")
        const ttl = yield* keys.ttl(marker)
        assert.isAbove(ttl, 590)
        assert.isAtMost(ttl, 600)
      }).pipe(Effect.provide(backend)))
  })
}

describe("makeJobQueue", () => {
  /** A store that records every step: claims held for args [7], every push kept. */
  const recordingStore = () => {
    const steps: Array<string> = []
    const pushed: Array<ReadonlyArray<PreparedJob>> = []
    const store: JobQueueStore = {
      checkClaims: (keys) =>
        Effect.sync(() => {
          steps.push(`check ${keys.length}`)
          return keys.map((key): ClaimHolder =>
            key === duplicateKey(QUEUE, WORKER, [7]) ? { held: true, jid: "held" } : { held: false }
          )
        }),
      push: (_, jobs) =>
        Effect.sync(() => {
          steps.push(`push ${jobs.length}`)
          pushed.push(jobs)
        }),
      pushOnce: () => Effect.succeed(true),
      peek: () => Effect.succeed([])
    }
    return { steps, pushed, store }
  }

  it.effect("slices bulk pushes at 1000 jobs, in order, and maps replies back to args", () =>
    Effect.gen(function*() {
      const { pushed, store } = recordingStore()
      const queue = makeJobQueue(store)
      const args = Array.from({ length: 2500 }, (_, i) => [i])
      const outcomes = yield* queue.bulkEnqueue({
        workerClass: WORKER,
        queue: QUEUE,
        args,
        deduplicate: "until_executed"
      })
      assert.deepStrictEqual(pushed.map((slice) => slice.length), [999, 1000, 500], "the duplicate [7] is not pushed")
      assert.deepStrictEqual(pushed.flat().map((job) => JSON.parse(job.payload).args), args.filter(([i]) => i !== 7))
      assert.isTrue(pushed.flat().every((job) => job.duplicateKey !== undefined))
      assert.deepStrictEqual(outcomes[7], { _tag: "Duplicate", args: [7], existingJid: "held" })
      assert.strictEqual(outcomes.filter((o) => o._tag === "Duplicate").length, 1)
    }))

  it.effect("beforePush sees each slice's decided outcomes (jids as pushed) before that slice is pushed", () =>
    Effect.gen(function*() {
      const { pushed, steps, store } = recordingStore()
      const queue = makeJobQueue(store)
      const args = Array.from({ length: 1500 }, (_, i) => [i])
      const seen: Array<ReadonlyArray<EnqueueOutcome>> = []
      const outcomes = yield* queue.bulkEnqueue({
        workerClass: WORKER,
        queue: QUEUE,
        args,
        deduplicate: "until_executed"
      }, (slice) =>
        Effect.sync(() => {
          steps.push(`before ${slice.length}`)
          seen.push(slice)
        }))
      assert.deepStrictEqual(steps, ["check 1000", "before 1000", "push 999", "check 500", "before 500", "push 500"])
      assert.deepStrictEqual(seen.flat(), outcomes)
      const enqueuedJids = outcomes.flatMap((o) => (o._tag === "Enqueued" ? [o.jid] : []))
      assert.deepStrictEqual(
        pushed.flat().map((job) => job.jid),
        enqueuedJids,
        "the jids seen before the push are the jids pushed"
      )
      assert.deepStrictEqual(pushed.flat().map((job) => JSON.parse(job.payload).jid), enqueuedJids)
    }))

  it.effect("a failing beforePush stops the enqueue before its slice is pushed", () =>
    Effect.gen(function*() {
      const { pushed, store } = recordingStore()
      const queue = makeJobQueue(store)
      let calls = 0
      const error = yield* Effect.flip(
        queue.bulkEnqueue(
          { workerClass: WORKER, queue: QUEUE, args: Array.from({ length: 1500 }, (_, i) => [i]) },
          () => ++calls === 2 ? Effect.fail("event log down" as const) : Effect.void
        )
      )
      assert.strictEqual(error, "event log down")
      assert.deepStrictEqual(pushed.map((slice) => slice.length), [1000], "the second slice was never pushed")
    }))

  it.effect("jids come from effect's Random: 24 lowercase hex, the same under the same seed", () =>
    Effect.gen(function*() {
      const enqueue = Effect.suspend(() =>
        makeJobQueue(recordingStore().store).bulkEnqueue({ workerClass: WORKER, queue: QUEUE, args: [[1], [2], [3]] })
      )
      const jids = (outcomes: ReadonlyArray<EnqueueOutcome>) => outcomes.map(jidOf)
      const first = jids(yield* enqueue.pipe(Random.withSeed("job-queue")))
      const again = jids(yield* enqueue.pipe(Random.withSeed("job-queue")))
      for (const jid of first) assert.match(jid, /^[0-9a-f]{24}$/)
      assert.strictEqual(new Set(first).size, 3)
      assert.deepStrictEqual(again, first)
    }))

  it.effect("empty args: no Redis call at all", () =>
    Effect.gen(function*() {
      const { steps, store } = recordingStore()
      const queue = makeJobQueue(store)
      yield* queue.bulkEnqueue({ workerClass: WORKER, queue: QUEUE, args: [] })
      assert.deepStrictEqual(steps, [])
    }))
})

/**
 * The cross-store order (JobQueueRedis): push on Queues, then claim on QueuesMetadata. A failure
 * (or crash) between the two must leave the job pushed — at worst duplicated later, never lost.
 */
const failingClaims = Layer.effect(
  QueuesMetadataRedis,
  Effect.map(QueuesMetadataRedis, (redis) =>
    QueuesMetadataRedis.of({
      ...redis,
      use: (operation, f) =>
        operation === "jobQueue.claim"
          ? Effect.fail(new RedisError({ operation, cause: new Error("injected: died before claiming") }))
          : redis.use(operation, f)
    }))
)

for (const topology of topologies) {
  describe(`JobQueueRedis across stores (${topology})`, () => {
    it.effect("interrupted between push and claim: the job is in the queue without its claim, and re-enqueueing duplicates rather than loses", () =>
      Effect.gen(function*() {
        const keys = yield* Keys
        const args = [[null, null, 77]]
        const error = yield* Effect.flip(
          Effect.gen(function*() {
            const queue = yield* JobQueue
            return yield* queue.bulkEnqueue({ workerClass: WORKER, queue: QUEUE, args, deduplicate: "until_executed" })
          }).pipe(Effect.provide(Layer.fresh(JobQueueRedis).pipe(Layer.provide(failingClaims))))
        )
        assert.instanceOf(error, RedisError)
        assert.lengthOf(yield* keys.list(queueKey(QUEUE)), 1)
        assert.isNull(yield* keys.get(duplicateKey(QUEUE, WORKER, [null, null, 77])))
        const queue = yield* JobQueue
        const [outcome] = yield* queue.bulkEnqueue({
          workerClass: WORKER,
          queue: QUEUE,
          args,
          deduplicate: "until_executed"
        })
        assert.strictEqual(outcome?._tag, "Enqueued")
        assert.lengthOf(yield* keys.list(queueKey(QUEUE)), 2)
        assert.strictEqual(yield* keys.get(duplicateKey(QUEUE, WORKER, [null, null, 77])), jidOf(outcome!))
      }).pipe(
        Effect.provide(Layer.mergeAll(JobQueueRedis, RedisKeys).pipe(Layer.provideMerge(RedisTopologyTest(topology))))
      ))
  })
}
