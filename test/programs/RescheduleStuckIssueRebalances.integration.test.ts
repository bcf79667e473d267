/**
 * reschedule-stuck-issue-rebalances end to end: namespaces and projects rows in a real PostgreSQL,
 * GitLab's running-rebalances set in a real Redis, and the CLI run as an operator would
 * (`sweeper run reschedule-stuck-issue-rebalances --json`). What lands in `queue:issues_rebalancing`
 * is checked the way a Sidekiq consumer would read it.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Schema } from "effect"
import { createHash } from "node:crypto"
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

const NOW = "2026-03-01T12:15:00.000Z"
const BATCH = "reschedule-stuck-issue-rebalances"
const RUNNING = "gitlab:issues-position-rebalances:running_rebalances"
const QUEUE_KEY = "queue:issues_rebalancing"
const HELD_JID = "0123456789abcdef01234567"

const Platform = (topology: RedisTopology = "single") => Layer.mergeAll(PgTest, RedisTopologyTest(topology))

const Job = Schema.fromJsonString(Schema.Struct({
  class: Schema.Literal("Issues::RebalancingWorker"),
  args: Schema.Array(Schema.NullOr(Schema.Number)),
  jid: Schema.String.check(Schema.isPattern(/^[0-9a-f]{24}$/)),
  queue: Schema.Literal("issues_rebalancing"),
  retry: Schema.Literal(true),
  created_at: Schema.Number,
  enqueued_at: Schema.Number
}))

const Output = Schema.fromJsonString(Schema.Struct({
  batch: Schema.String,
  runId: Schema.String,
  outcome: Schema.String,
  summary: Schema.Unknown
}))

/** GitLab's de-duplication key, computed independently of src/ (sha256 of "<class>:<JSON args>"). */
const claimKey = (args: string) =>
  `resque:gitlab:duplicate:issues_rebalancing:${
    createHash("sha256").update(`Issues::RebalancingWorker:${args}`).digest("hex")
  }`

const seedRows = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  yield* sql`INSERT INTO namespaces (id, name, path, type) VALUES
    (10, 'gitlab-org', 'gitlab-org', 'Group'), (11, 'gitlab-com', 'gitlab-com', 'Group'), (12, 'alice', 'alice', 'User')`
  yield* sql`INSERT INTO projects (id, namespace_id, name, path) VALUES (20, 10, 'gitlab', 'gitlab'), (21, 12, 'dotfiles', 'dotfiles')`
})

/** A command on one GitLab store: the set in SharedState, jobs in Queues, claims in QueuesMetadata. */
const storeCall =
  <R>(store: Effect.Effect<Redis["Service"], never, R>) => <A>(f: (client: RedisClient) => Promise<A>) =>
    Effect.flatMap(store, (redis) => Effect.orDie(redis.use("test", f)))
const shared = storeCall(SharedStateRedis)
const queues = storeCall(QueuesRedis)
const metadata = storeCall(QueuesMetadataRedis)
/** EXISTS per key: on a cluster one EXISTS of keys in several slots is refused. */
const existing = <R>(
  call: (f: (client: RedisClient) => Promise<number>) => Effect.Effect<number, never, R>,
  ...keys: ReadonlyArray<string>
) => call(async (c) => (await Promise.all(keys.map((key) => c.exists(key)))).reduce((a, b) => a + b, 0))

const queued = queues((c) => c.lrange(QUEUE_KEY, 0, -1)).pipe(
  Effect.map((payloads) => payloads.reverse().map((payload) => Schema.decodeUnknownSync(Job)(payload)))
)

const events = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  return yield* sql<{ stream: string; type: string; data: Record<string, unknown>; run_id: string }>`
    SELECT stream, type, data, run_id FROM sweeper_events ORDER BY id`
})

const sweeper = (...extra: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const env = { DATABASE_URL: yield* TestDatabaseUrl, ...(yield* TestRedisStores).env }
    const result = yield* Effect.promise(() => runCli(["run", BATCH, "--json", "--now", NOW, ...extra], env))
    assert.strictEqual(result.code, 0, `${result.stderr}\n${result.stdout}`)
    const lines = result.stdout.trim().split("\n")
    assert.lengthOf(lines, 1, result.stdout)
    return Schema.decodeUnknownSync(Output)(lines[0]!)
  })

describe("reschedule-stuck-issue-rebalances against PostgreSQL and Redis", () => {
  // The whole batch on each Redis deployment GitLab runs (one server, a server per store, a cluster).
  for (const topology of topologies) {
    it.live(
      `re-enqueues existing namespaces and projects, drops deleted and invalid ones, respects pending jobs (redis ${topology})`,
      () =>
        Effect.gen(function*() {
          yield* seedRows
          yield* shared((c) => c.sadd(RUNNING, "1/10", "1/11", "1/99", "2/20", "2/98", "3/12", "2/abc", "junk"))
          yield* shared((c) => c.expire(RUNNING, 864000))
          // Namespace 11's rebalancing job is still pending: its until_executed claim is held.
          yield* metadata((c) => c.set(claimKey("[null,null,11]"), HELD_JID, "EX", 300))

          const output = yield* sweeper()
          const summary = {
            namespaceIds: [10, 11, 99],
            projectIds: [20, 98],
            enqueuedNamespaces: 1,
            enqueuedProjects: 1,
            duplicates: 1,
            invalidMembers: 3,
            heldMs: 0,
            heldBy: []
          }
          assert.deepStrictEqual({ batch: output.batch, outcome: output.outcome, summary: output.summary }, {
            batch: BATCH,
            outcome: "succeeded",
            summary
          })
          assert.match(output.runId, /^[0-9a-f-]{36}$/)

          const jobs = yield* queued
          assert.deepStrictEqual(jobs.map((job) => job.args), [[null, null, 10], [null, 20, null]])
          for (const job of jobs) {
            assert.strictEqual(job.created_at, job.enqueued_at)
            // --now only sets the instant decisions are made at; what the run writes carries the real time.
            assert.isBelow(Math.abs(job.created_at - Date.now() / 1000), 60)
          }
          assert.deepStrictEqual(yield* queues((c) => c.smembers("queues")), ["issues_rebalancing"])
          assert.strictEqual(yield* metadata((c) => c.get(claimKey("[null,null,10]"))), jobs[0]!.jid)
          assert.strictEqual(yield* metadata((c) => c.get(claimKey("[null,20,null]"))), jobs[1]!.jid)
          assert.strictEqual(yield* metadata((c) => c.get(claimKey("[null,null,11]"))), HELD_JID)
          const ttl = yield* metadata((c) => c.ttl(claimKey("[null,20,null]")))
          assert.isAbove(ttl, 540)
          assert.isAtMost(ttl, 600)
          // Deleted containers get no job and no claim; the running set itself is left to GitLab.
          assert.strictEqual(yield* existing(metadata, claimKey("[null,null,99]"), claimKey("[null,98,null]")), 0)
          assert.strictEqual(yield* shared((c) => c.scard(RUNNING)), 8)

          const log = yield* events
          assert.deepStrictEqual(log.map((e) => [e.stream, e.type]), [
            [`batch:${BATCH}`, "RunStarted"],
            ["rebalance:1/10", "RebalanceRescheduled"],
            ["rebalance:1/11", "RebalanceRescheduled"],
            ["rebalance:2/20", "RebalanceRescheduled"],
            [`batch:${BATCH}`, "RunFinished"]
          ])
          assert.deepStrictEqual(log.slice(1, 4).map((e) => e.data), [
            { type: 1, id: 10, jid: jobs[0]!.jid, duplicate: false },
            { type: 1, id: 11, jid: HELD_JID, duplicate: true },
            { type: 2, id: 20, jid: jobs[1]!.jid, duplicate: false }
          ])
          assert.isTrue(log.every((e) => e.run_id === output.runId))
          assert.deepStrictEqual(log[4]!.data.summary, summary)

          // A second run within 600 s: every job is still pending, nothing is pushed twice.
          const again = yield* sweeper()
          assert.deepStrictEqual(again.summary, {
            ...summary,
            enqueuedNamespaces: 0,
            enqueuedProjects: 0,
            duplicates: 3
          })
          assert.lengthOf(yield* queued, 2)
        }).pipe(Effect.provide(Platform(topology))),
      180_000
    )
  }

  it.live("empty set: succeeds with nothing enqueued", () =>
    Effect.gen(function*() {
      yield* seedRows
      const output = yield* sweeper()
      assert.strictEqual(output.outcome, "succeeded")
      assert.deepStrictEqual(output.summary, {
        namespaceIds: [],
        projectIds: [],
        enqueuedNamespaces: 0,
        enqueuedProjects: 0,
        duplicates: 0,
        invalidMembers: 0,
        heldMs: 0,
        heldBy: []
      })
      assert.strictEqual(yield* existing(queues, QUEUE_KEY, "queues"), 0)
      assert.deepStrictEqual((yield* events).map((e) => e.type), ["RunStarted", "RunFinished"])
    }).pipe(Effect.provide(Platform())))

  it.live("dry run: reports what would be enqueued, pushes and claims nothing", () =>
    Effect.gen(function*() {
      yield* seedRows
      yield* shared((c) => c.sadd(RUNNING, "1/12", "2/21"))
      const output = yield* sweeper("--dry-run")
      assert.strictEqual(output.outcome, "succeeded")
      assert.deepStrictEqual(output.summary, {
        namespaceIds: [12],
        projectIds: [21],
        enqueuedNamespaces: 1,
        enqueuedProjects: 1,
        duplicates: 0,
        invalidMembers: 0,
        heldMs: 0,
        heldBy: []
      })
      assert.strictEqual(yield* existing(queues, QUEUE_KEY, "queues"), 0)
      assert.deepStrictEqual(yield* metadata((c) => scanKeys(c, "resque:gitlab:duplicate:*")), [])
      assert.deepStrictEqual((yield* events).map((e) => e.type), ["RunStarted", "RunFinished"])
    }).pipe(Effect.provide(Platform())))
})
