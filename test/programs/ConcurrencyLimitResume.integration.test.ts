/**
 * concurrency-limit-resume end to end: GitLab-format concurrency-limit keys in a real Redis, the
 * event log in a real PostgreSQL, and the CLI run as an operator would
 * (`sweeper run concurrency-limit-resume --json --budget 3s`).
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { workerKeys } from "../../src/domain/ConcurrencyLimit.ts"
import type { SidekiqJob } from "../../src/domain/Sidekiq.ts"
import {
  QueuesMetadataRedis,
  QueuesRedis,
  type Redis,
  type RedisClient,
  SharedStateRedis
} from "../../src/layers/redis/Redis.ts"
import { runCli } from "../support/cli.ts"
import { PgTest, TestDatabaseUrl } from "../support/postgres.ts"
import {
  type RedisTopology,
  RedisTopologyTest,
  scanKeys,
  TestRedisStores,
  topologies
} from "../support/redisTopology.ts"

const Platform = (topology: RedisTopology = "single") => Layer.mergeAll(PgTest, RedisTopologyTest(topology))

const EVIDENCE = "Releases::CreateEvidenceWorker"
const SYNC = "Namespaces::ProcessSyncEventsWorker"
const BROKEN = "Geo::VerificationBatchWorker"
const UNKNOWN = "Some::UnconfiguredWorker"

const LIMITS = {
  [EVIDENCE]: { limit: 3 },
  [SYNC]: { limit: 0, queue: "low" },
  [BROKEN]: { limit: 5 }
}

const element = (i: number, bufferedAt: number) =>
  JSON.stringify({
    args: [i, `gid://gitlab/Release/${i}`],
    context: { "meta.project": "gitlab-org/gitlab" },
    buffered_at: bufferedAt
  })

/** A command on one GitLab store: lists in SharedState, queues in Queues, limits and trackers in QueuesMetadata. */
const storeCall =
  <R>(store: Effect.Effect<Redis["Service"], never, R>) => <A>(f: (client: RedisClient) => Promise<A>) =>
    Effect.flatMap(store, (r) => Effect.promise(() => f(r.client)))
const shared = storeCall(SharedStateRedis)
const queues = storeCall(QueuesRedis)
const metadata = storeCall(QueuesMetadataRedis)

const sweeper = (...extra: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const env = {
      DATABASE_URL: yield* TestDatabaseUrl,
      ...(yield* TestRedisStores).env,
      SWEEPER_CONCURRENCY_LIMITS: JSON.stringify(LIMITS)
    }
    const result = yield* Effect.promise(() =>
      runCli(["run", "concurrency-limit-resume", "--json", "--budget", "3s", ...extra], env)
    )
    assert.strictEqual(result.code, 0, `${result.stderr}\n${result.stdout}`)
    const lines = result.stdout.trim().split("\n")
    assert.lengthOf(lines, 1, result.stdout)
    const output = JSON.parse(lines[0]!) as { batch: string; runId: string; outcome: string; summary: unknown }
    assert.includeMembers(Object.keys(output), ["batch", "runId", "outcome", "dryRun", "summary"])
    return output
  })

const events = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  return yield* sql<{ stream: string; type: string; data: Record<string, unknown>; run_id: string }>`
    SELECT stream, type, data, run_id FROM sweeper_events ORDER BY id`
})

describe("concurrency-limit-resume against Redis and PostgreSQL", () => {
  // The whole batch on each Redis deployment GitLab runs (one server, a server per store, a cluster).
  for (const topology of topologies) {
    it.live(`resumes within each worker's limit, FIFO; dead-letters garbage; leaves unknown and breaker-open workers alone (redis ${topology})`, () =>
      Effect.gen(function*() {
        const nowS = Date.now() / 1000
        const evidence = workerKeys(EVIDENCE)
        const sync = workerKeys(SYNC)
        yield* shared((c) =>
          c.rpush(
            evidence.deferred,
            element(0, nowS - 50),
            "{not json",
            element(1, nowS - 40),
            element(2, nowS - 30),
            element(3, nowS - 20)
          )
        )
        // One job of the worker is running (its tracker is fresh).
        yield* metadata((c) => c.hset(evidence.executing, { "gitlab-sidekiq-0:41:ab12:tid:owq": String(nowS - 5) }))
        yield* shared((c) => c.rpush(sync.deferred, element(10, nowS - 9), element(11, nowS - 8)))
        yield* shared((c) => c.rpush(workerKeys(BROKEN).deferred, element(20, nowS - 7), element(21, nowS - 6)))
        yield* metadata((c) => c.set(workerKeys(BROKEN).currentLimit, "-1"))
        yield* shared((c) => c.rpush(workerKeys(UNKNOWN).deferred, element(30, nowS - 5)))

        const started = Date.now()
        const output = yield* sweeper()
        assert.strictEqual(output.batch, "concurrency-limit-resume")
        assert.strictEqual(output.outcome, "succeeded")
        assert.deepStrictEqual(output.summary, {
          workers: [
            { worker: EVIDENCE, limit: 3, queueSize: 5, current: 1, resumed: 2, effectiveLimit: 3 },
            { worker: SYNC, limit: 0, queueSize: 2, current: 0, resumed: 2, effectiveLimit: 0 },
            { worker: BROKEN, limit: -1, queueSize: 2, current: 0, resumed: 0, effectiveLimit: -1 }
          ],
          resumedJobs: 4,
          failedWorkers: [],
          heldMs: 0,
          heldBy: []
        })
        // The budget was 3 s: passes at 0, 1 and 2 s, then the run ended (the next tick carries on).
        assert.isAtLeast(Date.now() - started, 2_000)

        // Sidekiq consumes with BRPOP from the right: the first buffered job runs first.
        const defaultQueue = (yield* queues((c) => c.lrange("queue:default", 0, -1))).reverse().map((raw) =>
          JSON.parse(raw) as SidekiqJob
        )
        assert.deepStrictEqual(defaultQueue.map((job) => job.args), [[0, "gid://gitlab/Release/0"], [
          1,
          "gid://gitlab/Release/1"
        ]])
        const first = defaultQueue[0]!
        assert.strictEqual(first.class, EVIDENCE)
        assert.strictEqual(first.queue, "default")
        assert.strictEqual(first.retry, true)
        assert.match(first.jid, /^[0-9a-f]{24}$/)
        assert.closeTo(first.created_at, nowS, 30)
        assert.strictEqual(first.enqueued_at, first.created_at)
        assert.strictEqual(first["meta.project"], "gitlab-org/gitlab")
        assert.strictEqual(first.concurrency_limit_resume, true)
        assert.strictEqual(first.concurrency_limit_buffered_at, nowS - 50)
        const lowQueue = (yield* queues((c) => c.lrange("queue:low", 0, -1))).reverse().map((raw) =>
          JSON.parse(raw) as SidekiqJob
        )
        assert.deepStrictEqual(lowQueue.map((job) => [job.class, job.args[0]]), [[SYNC, 10], [SYNC, 11]])
        assert.deepStrictEqual((yield* queues((c) => c.smembers("queues"))).sort(), ["default", "low"])

        assert.deepStrictEqual(yield* shared((c) => c.lrange(evidence.deferred, 0, -1)), [
          element(2, nowS - 30),
          element(3, nowS - 20)
        ])
        assert.deepStrictEqual(yield* shared((c) => c.lrange(evidence.dead, 0, -1)), ["{not json"])
        assert.strictEqual(yield* metadata((c) => c.get(evidence.pendingResumed)), "2")
        const ttl = yield* metadata((c) => c.ttl(evidence.pendingResumed))
        assert.isAbove(ttl, 50)
        assert.isAtMost(ttl, 60)
        assert.strictEqual(yield* shared((c) => c.exists(sync.deferred)), 0)
        assert.strictEqual(yield* shared((c) => c.llen(workerKeys(BROKEN).deferred)), 2)
        assert.strictEqual(yield* shared((c) => c.llen(workerKeys(UNKNOWN).deferred)), 1)
        // Per-worker leases were released.
        assert.deepStrictEqual(yield* shared((c) => scanKeys(c, "gitlab:exclusive_lease:*")), [])

        const log = yield* events
        assert.isTrue(log.every((e) => e.run_id === output.runId))
        assert.deepStrictEqual(log[0]!.type, "RunStarted")
        assert.deepStrictEqual(log[log.length - 1]!.type, "RunFinished")
        assert.deepStrictEqual(log[log.length - 1]!.data.summary, output.summary)
        // Workers run concurrently: their events may interleave, so compare per stream.
        const repairs = log.slice(1, -1).map((e) => [e.stream, e.type, e.data] as const)
        assert.deepStrictEqual(repairs.filter(([stream]) => stream === `concurrency_limit:${EVIDENCE}`), [
          [`concurrency_limit:${EVIDENCE}`, "ConcurrencyLimitJobsResumed", {
            worker: EVIDENCE,
            queue: "default",
            count: 2,
            limit: 3,
            jids: defaultQueue.map((job) => job.jid)
          }],
          [`concurrency_limit:${EVIDENCE}`, "ConcurrencyLimitJobsDead", { worker: EVIDENCE, count: 1 }]
        ])
        assert.deepStrictEqual(repairs.filter(([stream]) => stream === `concurrency_limit:${SYNC}`), [
          [`concurrency_limit:${SYNC}`, "ConcurrencyLimitJobsResumed", {
            worker: SYNC,
            queue: "low",
            count: 2,
            limit: 0,
            jids: lowQueue.map((job) => job.jid)
          }]
        ])
        assert.lengthOf(repairs, 3)
        // No move journal or batch marker left behind.
        assert.deepStrictEqual(yield* shared((c) => scanKeys(c, "sidekiq:concurrency_limit:{*}:sweeper_moving")), [])
        assert.deepStrictEqual(yield* queues((c) => scanKeys(c, "sweeper:resume_batch:*")), [])
      }).pipe(Effect.provide(Platform(topology))))
  }

  it.live("dry run: the same report, nothing moved, no events but the run's own", () =>
    Effect.gen(function*() {
      const nowS = Date.now() / 1000
      const evidence = workerKeys(EVIDENCE)
      yield* shared((c) => c.rpush(evidence.deferred, element(0, nowS - 50), element(1, nowS - 40)))
      const output = yield* sweeper("--dry-run")
      assert.strictEqual(output.outcome, "succeeded")
      assert.deepStrictEqual(output.summary, {
        workers: [{ worker: EVIDENCE, limit: 3, queueSize: 2, current: 0, resumed: 2, effectiveLimit: 3 }],
        resumedJobs: 2,
        failedWorkers: [],
        heldMs: 0,
        heldBy: []
      })
      assert.strictEqual(yield* shared((c) => c.llen(evidence.deferred)), 2)
      assert.strictEqual(yield* queues((c) => c.exists("queue:default")), 0)
      assert.deepStrictEqual((yield* events).map((e) => e.type), ["RunStarted", "RunFinished"])
    }).pipe(Effect.provide(Platform())))
})
