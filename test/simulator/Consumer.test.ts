/**
 * The simulator's Sidekiq-style consumer plays GitLab's throttling middleware faithfully:
 * fresh jobs over the limit are deferred in GitLab's `{args, context, buffered_at}` form, in
 * arrival order; a fresh job is deferred while others wait even with a slot free; a resumed job
 * always runs, takes its reserved `pending_resumed` slot, and is tracked in `executing` while it
 * runs. And its Issues::RebalancingWorker really rebalances. In-memory Redis, real PostgreSQL, real
 * time (jobs last a few hundred milliseconds).
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber, Layer, Option } from "effect"
import { parseDeferred, resumedJob, workerKeys } from "../../src/domain/ConcurrencyLimit.ts"
import {
  RebalanceContainer,
  REBALANCING_QUEUE,
  REBALANCING_WORKER,
  RUNNING_REBALANCES_KEY
} from "../../src/domain/Rebalancing.ts"
import { queueKey } from "../../src/domain/Sidekiq.ts"
import { DEFAULT_ROUTING } from "../../src/domain/TransitionJobs.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { RebalancingStateMemory } from "../../src/layers/memory/RebalancingStateMemory.ts"
import { duplicateKey } from "../../src/layers/protocols/JobQueueShared.ts"
import { runConsumer } from "../../src/simulator/Consumer.ts"
import { emptyLedger } from "../../src/simulator/Ledger.ts"
import { compositeStatus, seedPipeline } from "../../src/simulator/Pipelines.ts"
import { pushJob, seedBuild, seedIssues, seedProject, stallRebalance } from "../../src/simulator/Seed.ts"
import { SimulatorStores, SimulatorStoresLive } from "../../src/simulator/Stores.ts"
import { PgTest } from "../support/postgres.ts"

const WORKER = "Releases::CreateEvidenceWorker"
/** A default install's routing, on Sweeper's own ci_builds. */
const TRANSITIONS = { transitionQueues: DEFAULT_ROUTING, builds: "ci_builds" as const }
const keys = workerKeys(WORKER)

const eventually = <A>(what: string, probe: Effect.Effect<A | undefined>) =>
  Effect.gen(function*() {
    for (let i = 0; i < 100; i++) {
      const value = yield* probe
      if (value !== undefined) return value
      yield* Effect.sleep("20 millis")
    }
    return assert.fail(`timed out waiting for ${what}`)
  })

describe("simulator consumer", () => {
  it.live(
    "defers over the limit in GitLab's format, runs resumed jobs in their reserved slots",
    () =>
      Effect.gen(function*() {
        const stores = yield* SimulatorStores
        const redis = yield* MemoryRedis
        const ledger = emptyLedger()
        const consumer = yield* Effect.forkChild(
          runConsumer({
            ledger,
            limited: { [WORKER]: { limit: 2, queue: "default" } },
            threads: 4,
            jobMillis: 400,
            ...TRANSITIONS
          })
        )

        // Five jobs arrive at once: two run, three wait in the order they came.
        for (let id = 1; id <= 5; id++) {
          yield* pushJob({ workerClass: WORKER, args: [id], queue: "default", nowMillis: 1_772_366_400_000 })
        }
        yield* eventually(
          "five jobs handled",
          Effect.sync(() => ledger.throttled.directRan + ledger.throttled.deferred === 5 || undefined)
        )
        assert.strictEqual(ledger.throttled.directRan, 2)
        assert.strictEqual(ledger.throttled.deferred, 3)
        assert.strictEqual(yield* stores.hlen("queuesMetadata", keys.executing), 2)
        const deferred = redis.lrange(keys.deferred, 0, -1).map((raw) => parseDeferred(raw))
        assert.isTrue(deferred.every(Option.isSome), "every deferred element is GitLab's {args, context, buffered_at}")
        assert.deepStrictEqual(
          deferred.map((d) => Option.getOrThrow(d).args),
          [[3], [4], [5]]
        )
        for (const d of deferred) assert.isNumber(Option.getOrThrow(d).buffered_at)

        // Both finish: nothing executing; a fresh job still waits behind the deferred ones.
        yield* eventually(
          "the two running jobs to finish",
          Effect.map(stores.hlen("queuesMetadata", keys.executing), (n) => n === 0 || undefined)
        )
        yield* pushJob({ workerClass: WORKER, args: [6], queue: "default", nowMillis: 1_772_366_401_000 })
        yield* eventually("job 6 deferred", Effect.sync(() => ledger.throttled.deferred === 4 || undefined))
        assert.strictEqual(ledger.throttled.directRan, 2, "a free slot does not let a fresh job jump the queue")

        // Play Sweeper's resume of two: reserve the slots, then push the resumed jobs.
        redis.set(keys.pendingResumed, "2", { exSeconds: 60 })
        for (const raw of redis.lpop(keys.deferred, 2)) {
          const job = resumedJob({
            worker: WORKER,
            queue: "default",
            deferred: Option.getOrThrow(parseDeferred(raw)),
            jid: `jid${raw.length}${Math.random()}`,
            nowMillis: 1_772_366_402_000
          })
          redis.lpush(queueKey("default"), JSON.stringify(job))
        }
        yield* eventually(
          "both resumed jobs started",
          Effect.sync(() => ledger.throttled.resumedRan === 2 || undefined)
        )
        assert.strictEqual(redis.get(keys.pendingResumed), "0", "each resumed job took its reserved slot")
        assert.strictEqual(yield* stores.hlen("queuesMetadata", keys.executing), 2)
        yield* eventually("the resumed jobs to finish", Effect.sync(() => ledger.throttled.ran[4] === 1 || undefined))
        assert.deepStrictEqual(ledger.throttled.ran, { 1: 1, 2: 1, 3: 1, 4: 1 })
        assert.strictEqual(ledger.throttled.maxExecuting[WORKER], 2)
        assert.strictEqual(ledger.unknownJobs, 0)
        yield* Fiber.interrupt(consumer)
      }).pipe(
        Effect.provide(
          Layer.mergeAll(SimulatorStoresLive, RebalancingStateMemory).pipe(
            Layer.provideMerge(MemoryRedis.layer),
            Layer.provideMerge(PgTest)
          )
        )
      ),
    30_000
  )

  it.live(
    "Issues::RebalancingWorker rebalances for real, then does the rebalancer's and until_executed's clean-up",
    () =>
      Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        const redis = yield* MemoryRedis
        const { projectId } = yield* seedProject("rebalance-me")
        yield* seedIssues(projectId, 12)
        const before = yield* sql<
          { id: string; relative_position: number | null }
        >`SELECT id, relative_position FROM issues WHERE project_id = ${projectId}`
        assert.isTrue(before.some((i) => i.relative_position === null), "seeded with nulls")
        assert.isBelow(new Set(before.map((i) => i.relative_position)).size, before.length, "and ties")
        yield* stallRebalance(RebalanceContainer.project, projectId)
        const args = [null, projectId, null]
        // What Sweeper's reschedule does: the until_executed claim, then the push.
        redis.set(duplicateKey(REBALANCING_QUEUE, REBALANCING_WORKER, args), "jid", { exSeconds: 600 })
        yield* pushJob({
          workerClass: REBALANCING_WORKER,
          args,
          queue: REBALANCING_QUEUE,
          nowMillis: 1_772_366_400_000
        })

        const ledger = emptyLedger()
        const consumer = yield* Effect.forkChild(
          runConsumer({ ledger, limited: {}, threads: 1, jobMillis: 10, ...TRANSITIONS })
        )
        yield* eventually(
          "the rebalance to run",
          Effect.sync(() => ledger.rebalances.ran[`2/${projectId}`] === 1 || undefined)
        )
        yield* Fiber.interrupt(consumer)

        const after = yield* sql<
          { id: string; relative_position: number }
        >`SELECT id, relative_position FROM issues WHERE project_id = ${projectId} ORDER BY relative_position`
        assert.strictEqual(
          new Set(after.map((i) => i.relative_position)).size,
          after.length,
          "every issue its own position"
        )
        assert.isTrue(after.every((i) => i.relative_position !== null))
        // Today's order kept: by position, nulls last, ties by id.
        const expected = [...before].sort((a, b) =>
          a.relative_position === b.relative_position ?
            Number(a.id) - Number(b.id)
            : a.relative_position === null
            ? 1
            : b.relative_position === null
            ? -1
            : a.relative_position - b.relative_position
        )
        assert.deepStrictEqual(after.map((i) => i.id), expected.map((i) => i.id))
        assert.deepStrictEqual(
          redis.smembers(RUNNING_REBALANCES_KEY),
          [],
          "the rebalancer removed itself from the running set"
        )
        assert.isNull(
          redis.get(duplicateKey(REBALANCING_QUEUE, REBALANCING_WORKER, args)),
          "the until_executed claim is released"
        )
      }).pipe(
        Effect.provide(
          Layer.mergeAll(SimulatorStoresLive, RebalancingStateMemory).pipe(
            Layer.provideMerge(MemoryRedis.layer),
            Layer.provideMerge(PgTest)
          )
        )
      ),
    30_000
  )

  it.live(
    "GitLab's pipeline workers, played: a dropped build's PipelineProcessWorker finishes its pipeline from its latest builds",
    () =>
      Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        const { projectId } = yield* seedProject("pipelines")
        const now = 1_772_366_400_000
        const failing = yield* seedPipeline({ projectId, nowMillis: now, builds: "ci_builds" })
        const waiting = yield* seedPipeline({ projectId, nowMillis: now, builds: "ci_builds" })
        const build = (status: string, pipelineId: number) =>
          seedBuild({ projectId, status, nowMillis: now, ageMillis: 600_000, pipelineId, table: "ci_builds" })
        // What a drop leaves: one failed build beside a successful one; a retried copy does not count.
        yield* build("success", failing)
        const dropped = yield* build("failed", failing)
        const retried = yield* build("running", failing)
        yield* sql`UPDATE ci_builds SET retried = true WHERE id = ${retried}`
        // A pipeline whose other build still runs stays running.
        yield* build("failed", waiting)
        yield* build("running", waiting)
        for (
          const [workerClass, args] of [
            ["PipelineProcessWorker", [failing]],
            ["PipelineProcessWorker", [waiting]],
            ["Ci::BuildFinishedWorker", [dropped]],
            ["Ci::ResourceGroups::AssignResourceFromResourceGroupWorker", [9]]
          ] as const
        ) yield* pushJob({ workerClass, args, queue: "default", nowMillis: now })

        const ledger = emptyLedger()
        const consumer = yield* Effect.forkChild(
          runConsumer({ ledger, limited: {}, threads: 1, jobMillis: 10, ...TRANSITIONS })
        )
        yield* eventually(
          "the four jobs to run",
          Effect.sync(() => ledger.transitionJobs.assignResource === 1 || undefined)
        )
        yield* Fiber.interrupt(consumer)
        assert.deepStrictEqual(ledger.pipelines.status, { [failing]: "failed", [waiting]: "running" })
        assert.deepStrictEqual(ledger.transitionJobs.buildFinished, { [dropped]: 1 })
        assert.strictEqual(ledger.unknownJobs, 0)
        const rows = yield* sql<{ id: string; status: string; finished: boolean }>`
          SELECT id::text, status, finished_at IS NOT NULL AS finished FROM ci_pipelines ORDER BY id`
        assert.deepStrictEqual(rows.map((r) => [Number(r.id), r.status, r.finished]), [
          [failing, "failed", true],
          [waiting, "running", false]
        ])
        const processed = yield* sql<{ id: string; processed: boolean | null }>`
          SELECT id::text, processed FROM ci_builds WHERE commit_id = ${failing} ORDER BY id`
        assert.deepStrictEqual(processed.map((r) => r.processed), [true, true, null])
      }).pipe(
        Effect.provide(
          Layer.mergeAll(SimulatorStoresLive, RebalancingStateMemory).pipe(
            Layer.provideMerge(MemoryRedis.layer),
            Layer.provideMerge(PgTest)
          )
        )
      ),
    30_000
  )

  it("GitLab's composite status of a pipeline's jobs, rule by rule", () => {
    const cases: ReadonlyArray<readonly [ReadonlyArray<string>, string]> = [
      [[], "success"],
      [["skipped"], "skipped"],
      [["success", "skipped"], "success"],
      [["canceled", "success"], "canceled"],
      [["pending", "created"], "pending"],
      [["failed", "running"], "running"],
      [["failed", "manual"], "manual"],
      [["failed", "created"], "running"],
      [["failed", "canceling"], "canceling"],
      [["failed", "success", "canceled"], "failed"]
    ]
    for (const [statuses, expected] of cases) {
      assert.strictEqual(compositeStatus(statuses), expected, statuses.join(","))
    }
  })
})
