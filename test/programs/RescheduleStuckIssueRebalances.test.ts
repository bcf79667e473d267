import { assert, describe, it } from "@effect/vitest"
import { Cause, DateTime, Effect, Option, Schema } from "effect"
import { TestClock } from "effect/testing"
import { CurrentRun } from "../../src/domain/Batch.ts"
import { LeaseLost, RedisError } from "../../src/domain/Errors.ts"
import { RUNNING_REBALANCES_KEY } from "../../src/domain/Rebalancing.ts"
import { queueKey, QUEUES_SET } from "../../src/domain/Sidekiq.ts"
import { MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { MemoryPlatformRecords } from "../../src/layers/memory/PlatformRecordsMemory.ts"
import { duplicateKey } from "../../src/layers/protocols/JobQueueShared.ts"
import { RescheduleStuckIssueRebalances } from "../../src/programs/RescheduleStuckIssueRebalances.ts"
import { prometheusText } from "../../src/services/Metrics.ts"
import { RebalancingState } from "../../src/services/RebalancingState.ts"
import { runBatch } from "../../src/supervisor/RunGuard.ts"
import { MemoryPlatform } from "../support/memory.ts"

const NOW = DateTime.makeUnsafe("2026-03-01T12:15:00Z")
const WORKER = "Issues::RebalancingWorker"
const QUEUE = "issues_rebalancing"

const Job = Schema.fromJsonString(Schema.Struct({
  class: Schema.String,
  args: Schema.Array(Schema.NullOr(Schema.Number)),
  jid: Schema.String,
  queue: Schema.String,
  retry: Schema.Literal(true),
  created_at: Schema.Number,
  enqueued_at: Schema.Number
}))

/** The running-rebalances set as GitLab writes it, plus the rows that exist in the database. */
const seed = (options: {
  readonly members: ReadonlyArray<string>
  readonly namespaces?: ReadonlyArray<number>
  readonly projects?: ReadonlyArray<number>
}) =>
  Effect.gen(function*() {
    yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
    const redis = yield* MemoryRedis
    if (options.members.length > 0) redis.sadd(RUNNING_REBALANCES_KEY, ...options.members)
    const records = yield* MemoryPlatformRecords
    for (const id of options.namespaces ?? []) records.namespaces.add(id)
    for (const id of options.projects ?? []) records.projects.add(id)
  })

/** The queue as a Sidekiq consumer sees it, oldest job (next to run) first. */
const queuedJobs = Effect.map(
  MemoryRedis,
  (redis) => redis.lrange(queueKey(QUEUE), 0, -1).reverse().map((payload) => Schema.decodeUnknownSync(Job)(payload))
)

const rescheduledEvents = Effect.map(
  MemoryEvents,
  (events) => events.filter((e) => e.type === "RebalanceRescheduled").map((e) => [e.stream, e.data] as const)
)

const program = RescheduleStuckIssueRebalances.run

describe("reschedule-stuck-issue-rebalances", () => {
  it.effect("nothing running: nothing looked up, nothing enqueued, no events", () =>
    Effect.gen(function*() {
      yield* seed({ members: [], namespaces: [1], projects: [2] })
      const summary = yield* program
      assert.deepStrictEqual(summary, {
        namespaceIds: [],
        projectIds: [],
        enqueuedNamespaces: 0,
        enqueuedProjects: 0,
        duplicates: 0,
        invalidMembers: 0,
        heldMs: 0,
        heldBy: []
      })
      const redis = yield* MemoryRedis
      assert.isFalse(redis.exists(queueKey(QUEUE)))
      assert.isFalse(redis.exists(QUEUES_SET))
      assert.deepStrictEqual((yield* MemoryPlatformRecords).lookups, [])
      assert.lengthOf(yield* MemoryEvents, 0)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("happy path: one Issues::RebalancingWorker per namespace and per project, exact args and queue", () =>
    Effect.gen(function*() {
      yield* seed({ members: ["2/20", "1/11", "1/10"], namespaces: [10, 11], projects: [20] })
      const summary = yield* program
      assert.deepStrictEqual(summary, {
        namespaceIds: [10, 11],
        projectIds: [20],
        enqueuedNamespaces: 2,
        enqueuedProjects: 1,
        duplicates: 0,
        invalidMembers: 0,
        heldMs: 0,
        heldBy: []
      })
      const jobs = yield* queuedJobs
      assert.deepStrictEqual(jobs.map((job) => [job.class, job.queue, job.args]), [
        [WORKER, QUEUE, [null, null, 10]],
        [WORKER, QUEUE, [null, null, 11]],
        [WORKER, QUEUE, [null, 20, null]]
      ])
      for (const job of jobs) {
        assert.match(job.jid, /^[0-9a-f]{24}$/)
        assert.strictEqual(job.created_at, DateTime.toEpochMillis(NOW) / 1000)
      }
      const redis = yield* MemoryRedis
      assert.deepStrictEqual(redis.smembers(QUEUES_SET), [QUEUE])
      assert.strictEqual(redis.get(duplicateKey(QUEUE, WORKER, [null, null, 10])), jobs[0]!.jid)
      assert.strictEqual(redis.get(duplicateKey(QUEUE, WORKER, [null, 20, null])), jobs[2]!.jid)
      assert.strictEqual(redis.pttl(duplicateKey(QUEUE, WORKER, [null, 20, null])), 600_000)
      assert.deepStrictEqual(yield* rescheduledEvents, [
        ["rebalance:1/10", { type: 1, id: 10, jid: jobs[0]!.jid, duplicate: false }],
        ["rebalance:1/11", { type: 1, id: 11, jid: jobs[1]!.jid, duplicate: false }],
        ["rebalance:2/20", { type: 2, id: 20, jid: jobs[2]!.jid, duplicate: false }]
      ])
      // The running set is GitLab's rebalancer's to maintain: read, never changed.
      assert.deepStrictEqual(redis.smembers(RUNNING_REBALANCES_KEY).sort(), ["1/10", "1/11", "2/20"])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("projects only: one bulk push for projects, no namespace look-up", () =>
    Effect.gen(function*() {
      yield* seed({ members: ["2/7"], projects: [7] })
      const summary = yield* program
      assert.strictEqual(summary.enqueuedProjects, 1)
      assert.strictEqual(summary.enqueuedNamespaces, 0)
      assert.deepStrictEqual((yield* queuedJobs).map((job) => job.args), [[null, 7, null]])
      assert.deepStrictEqual((yield* MemoryPlatformRecords).lookups, [{ table: "projects", ids: [7] }])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("ids no longer in the database are not rescheduled (but still reported as read)", () =>
    Effect.gen(function*() {
      yield* seed({ members: ["1/10", "1/99", "2/20", "2/98"], namespaces: [10], projects: [20] })
      const summary = yield* program
      assert.deepStrictEqual(summary, {
        namespaceIds: [10, 99],
        projectIds: [20, 98],
        enqueuedNamespaces: 1,
        enqueuedProjects: 1,
        duplicates: 0,
        invalidMembers: 0,
        heldMs: 0,
        heldBy: []
      })
      assert.deepStrictEqual((yield* queuedJobs).map((job) => job.args), [[null, null, 10], [null, 20, null]])
      assert.deepStrictEqual((yield* rescheduledEvents).map(([stream]) => stream), ["rebalance:1/10", "rebalance:2/20"])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("all containers deleted: nothing enqueued, queues untouched", () =>
    Effect.gen(function*() {
      yield* seed({ members: ["1/99", "2/98"] })
      const summary = yield* program
      assert.strictEqual(summary.enqueuedNamespaces + summary.enqueuedProjects + summary.duplicates, 0)
      const redis = yield* MemoryRedis
      assert.isFalse(redis.exists(queueKey(QUEUE)))
      assert.isFalse(redis.exists(QUEUES_SET))
      assert.lengthOf(yield* MemoryEvents, 0)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("invalid members (other type, non-numeric id, junk, empty) are counted, never fatal", () =>
    Effect.gen(function*() {
      yield* seed({ members: ["3/5", "2/abc", "junk", "", "1/10"], namespaces: [10, 5] })
      const summary = yield* program
      assert.deepStrictEqual(summary, {
        namespaceIds: [10],
        projectIds: [],
        enqueuedNamespaces: 1,
        enqueuedProjects: 0,
        duplicates: 0,
        invalidMembers: 4,
        heldMs: 0,
        heldBy: []
      })
      assert.deepStrictEqual((yield* queuedJobs).map((job) => job.args), [[null, null, 10]])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("only invalid members: counted, nothing looked up or enqueued", () =>
    Effect.gen(function*() {
      yield* seed({ members: ["3/5", "junk"], namespaces: [5] })
      const summary = yield* program
      assert.deepStrictEqual(summary, {
        namespaceIds: [],
        projectIds: [],
        enqueuedNamespaces: 0,
        enqueuedProjects: 0,
        duplicates: 0,
        invalidMembers: 2,
        heldMs: 0,
        heldBy: []
      })
      assert.deepStrictEqual((yield* MemoryPlatformRecords).lookups, [])
      assert.isFalse((yield* MemoryRedis).exists(queueKey(QUEUE)))
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("until_executed: a rerun within 600 s drops duplicates; once the claims expire it enqueues again", () =>
    Effect.gen(function*() {
      yield* seed({ members: ["1/10", "2/20"], namespaces: [10], projects: [20] })
      yield* program
      const first = yield* queuedJobs
      assert.lengthOf(first, 2)

      yield* TestClock.adjust("599 seconds")
      const again = yield* program
      assert.deepStrictEqual(again, {
        namespaceIds: [10],
        projectIds: [20],
        enqueuedNamespaces: 0,
        enqueuedProjects: 0,
        duplicates: 2,
        invalidMembers: 0,
        heldMs: 0,
        heldBy: []
      })
      assert.lengthOf(yield* queuedJobs, 2)
      assert.deepStrictEqual((yield* rescheduledEvents).slice(2), [
        ["rebalance:1/10", { type: 1, id: 10, jid: first[0]!.jid, duplicate: true }],
        ["rebalance:2/20", { type: 2, id: 20, jid: first[1]!.jid, duplicate: true }]
      ])

      yield* TestClock.adjust("1 second")
      const later = yield* program
      assert.strictEqual(later.enqueuedNamespaces, 1)
      assert.strictEqual(later.enqueuedProjects, 1)
      assert.strictEqual(later.duplicates, 0)
      const jobs = yield* queuedJobs
      assert.lengthOf(jobs, 4)
      assert.deepStrictEqual(jobs.slice(2).map((job) => job.args), [[null, null, 10], [null, 20, null]])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a claim released by the consumer (job ran) lets the next run reschedule at once", () =>
    Effect.gen(function*() {
      yield* seed({ members: ["1/10"], namespaces: [10] })
      yield* program
      const redis = yield* MemoryRedis
      redis.del(duplicateKey(QUEUE, WORKER, [null, null, 10]))
      assert.strictEqual((yield* program).enqueuedNamespaces, 1)
      assert.lengthOf(yield* queuedJobs, 2)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a Redis failure reading the set is a RedisError (retried by the run guard), nothing enqueued", () =>
    Effect.gen(function*() {
      yield* seed({ members: [], namespaces: [10] })
      const redis = yield* MemoryRedis
      redis.set(RUNNING_REBALANCES_KEY, "not a set")
      const error = yield* Effect.flip(program)
      assert.instanceOf(error, RedisError)
      assert.isFalse(redis.exists(queueKey(QUEUE)))
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("the rebalancer's own bookkeeping (RebalancingState.track) is what the batch reads", () =>
    Effect.gen(function*() {
      yield* seed({ members: [], namespaces: [3], projects: [4] })
      const state = yield* RebalancingState
      yield* state.track(1, 3)
      yield* state.track(2, 4)
      const redis = yield* MemoryRedis
      assert.strictEqual(redis.pttl(RUNNING_REBALANCES_KEY), 864_000_000)
      const summary = yield* program
      assert.deepStrictEqual([summary.enqueuedNamespaces, summary.enqueuedProjects], [1, 1])
    }).pipe(Effect.provide(MemoryPlatform())))
})

describe("reschedule-stuck-issue-rebalances under the run guard", () => {
  const guarded = (options: { dryRun?: boolean } = {}) =>
    Effect.gen(function*() {
      yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
      return yield* runBatch(RescheduleStuckIssueRebalances, { trigger: "manual", ...options })
    })

  it.effect("records RunStarted, one RebalanceRescheduled per container, RunFinished with the summary", () =>
    Effect.gen(function*() {
      yield* seed({ members: ["1/10", "2/20", "9/9"], namespaces: [10], projects: [20] })
      const result = yield* guarded()
      assert.strictEqual(result.outcome, "succeeded")
      const summary = {
        namespaceIds: [10],
        projectIds: [20],
        enqueuedNamespaces: 1,
        enqueuedProjects: 1,
        duplicates: 0,
        invalidMembers: 1,
        heldMs: 0,
        heldBy: []
      }
      assert.deepStrictEqual(result.summary, summary)
      const events = yield* MemoryEvents
      assert.deepStrictEqual(events.map((e) => e.type), [
        "RunStarted",
        "RebalanceRescheduled",
        "RebalanceRescheduled",
        "RunFinished"
      ])
      assert.isTrue(events.every((e) => e.runId === result.runId))
      assert.deepStrictEqual(events[3]!.data.summary, summary)
      const text = yield* prometheusText
      assert.match(text, /sweeper_issue_rebalances_rescheduled_total\{[^}]*type="namespace"[^}]*\} [1-9]/)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("dry run: reports what would be enqueued, enqueues nothing, records no repairs", () =>
    Effect.gen(function*() {
      yield* seed({ members: ["1/10", "1/99", "2/20", "junk"], namespaces: [10], projects: [20] })
      const result = yield* guarded({ dryRun: true })
      assert.strictEqual(result.outcome, "succeeded")
      assert.deepStrictEqual(result.summary, {
        namespaceIds: [10, 99],
        projectIds: [20],
        enqueuedNamespaces: 1,
        enqueuedProjects: 1,
        duplicates: 0,
        invalidMembers: 1,
        heldMs: 0,
        heldBy: []
      })
      const redis = yield* MemoryRedis
      assert.isFalse(redis.exists(queueKey(QUEUE)))
      assert.isFalse(redis.exists(QUEUES_SET))
      assert.deepStrictEqual(redis.keys("resque:gitlab:duplicate:*"), [])
      const events = yield* MemoryEvents
      assert.deepStrictEqual(events.map((e) => [e.type, e.data.dryRun]), [["RunStarted", true], ["RunFinished", true]])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("dry run with namespaces only: the empty project unit counts nothing (it has no container to read a type from)", () =>
    Effect.gen(function*() {
      yield* seed({ members: ["1/10"], namespaces: [10] })
      const result = yield* guarded({ dryRun: true })
      assert.strictEqual(result.outcome, "succeeded", result.error)
      assert.deepStrictEqual(result.summary, {
        namespaceIds: [10],
        projectIds: [],
        enqueuedNamespaces: 1,
        enqueuedProjects: 0,
        duplicates: 0,
        invalidMembers: 0,
        heldMs: 0,
        heldBy: []
      })
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("no overlapping runs: a run while the batch's lease is held elsewhere is skipped, nothing enqueued", () =>
    Effect.gen(function*() {
      yield* seed({ members: ["1/10"], namespaces: [10] })
      const redis = yield* MemoryRedis
      redis.set("gitlab:exclusive_lease:sweeper/reschedule_stuck_issue_rebalances", "another-replica", {
        exSeconds: 360
      })
      const result = yield* guarded()
      assert.strictEqual(result.outcome, "skipped")
      assert.strictEqual(result.reason, "lease held")
      assert.lengthOf(yield* queuedJobs, 0)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("concurrent runs enqueue each rebalance once, and release the lease afterwards", () =>
    Effect.gen(function*() {
      yield* seed({ members: ["1/10"], namespaces: [10] })
      const [a, b] = yield* Effect.all([guarded(), guarded()], { concurrency: 2 })
      assert.includeMembers([a.outcome, b.outcome], ["succeeded"])
      assert.lengthOf(yield* queuedJobs, 1)
      assert.deepStrictEqual((yield* MemoryRedis).keys("gitlab:exclusive_lease:*"), [])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a lost lease stops the run before its next push: nothing more is enqueued or recorded", () =>
    Effect.gen(function*() {
      yield* seed({ members: ["1/10", "2/20"], namespaces: [10], projects: [20] })
      // The lease is lost right after the namespaces are pushed (the second safe point).
      let checks = 0
      const lost = new LeaseLost({ lease: "sweeper/reschedule_stuck_issue_rebalances", epoch: 1 })
      const fence = {
        lease: lost.lease,
        epoch: 1,
        check: Effect.suspend(() => ++checks > 1 ? Effect.fail(lost) : Effect.void)
      }
      const defaults = yield* CurrentRun
      const exit = yield* Effect.exit(
        program.pipe(Effect.provideService(CurrentRun, { ...defaults, fence: Option.some(fence) }))
      )
      assert.isTrue(exit._tag === "Failure" && Option.getOrUndefined(Cause.findErrorOption(exit.cause)) === lost)
      assert.deepStrictEqual((yield* queuedJobs).map((job) => job.args), [[null, null, 10]])
      assert.deepStrictEqual((yield* rescheduledEvents).map(([stream]) => stream), ["rebalance:1/10"])
    }).pipe(Effect.provide(MemoryPlatform())))
})
