/**
 * stuck-export-jobs end to end: GitLab-format rows in a real PostgreSQL, Sidekiq status keys in a
 * real Redis, and the CLI run as an operator would (`sweeper run stuck-export-jobs --json --now …`).
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { QueuesMetadataRedis } from "../../src/layers/redis/Redis.ts"
import { runCli } from "../support/cli.ts"
import { PgTest, TestDatabaseUrl } from "../support/postgres.ts"
import { type RedisTopology, RedisTopologyTest, TestRedisStores, topologies } from "../support/redisTopology.ts"

const NOW = "2026-03-01T12:30:00.000Z"
const SIX_HOURS_MS = 6 * 3600 * 1000
const ago = (ms: number) => new Date(Date.parse(NOW) - ms)

const Platform = (topology: RedisTopology = "single") => Layer.mergeAll(PgTest, RedisTopologyTest(topology))

interface Seeded {
  readonly id: number
  readonly jid: string
}

const seedProject = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  yield* sql`INSERT INTO namespaces (id, name, path, type) VALUES (10, 'gitlab-org', 'gitlab-org', 'Group')`
  yield* sql`INSERT INTO projects (id, namespace_id, name, path) VALUES (20, 10, 'gitlab', 'gitlab'), (21, 10, 'www', 'www')`
})

const insertJob = (job: { id: number; projectId: number; jid: string; status: number; createdAt: Date }) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    yield* sql`INSERT INTO project_export_jobs (id, project_id, jid, status, user_id, created_at, updated_at)
      VALUES (${job.id}, ${job.projectId}, ${job.jid}, ${job.status}, 1, ${job.createdAt}, ${job.createdAt})`
    return { id: job.id, jid: job.jid } satisfies Seeded
  })

const insertRelations = (job: Seeded, projectId: number, relations: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    for (const relation of relations) {
      yield* sql`INSERT INTO project_relation_exports (project_export_job_id, project_id, relation, status, jid)
        VALUES (${job.id}, ${projectId}, ${relation}, 1, ${`${job.jid}-${relation}`})`
    }
  })

/** The Sidekiq job is still queued or running: its status key exists (export TTL). */
const track = (jid: string) =>
  Effect.flatMap(
    QueuesMetadataRedis,
    (redis) => redis.use("test.track", (c) => c.set(`gitlab-sidekiq-status:${jid}`, "1", "EX", 21600))
  )

const sweeper = (...extra: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const env = { DATABASE_URL: yield* TestDatabaseUrl, ...(yield* TestRedisStores).env }
    const result = yield* Effect.promise(() =>
      runCli(["run", "stuck-export-jobs", "--json", "--now", NOW, ...extra], env)
    )
    assert.strictEqual(result.code, 0, `${result.stderr}\n${result.stdout}`)
    const lines = result.stdout.trim().split("\n")
    assert.lengthOf(lines, 1, result.stdout)
    return JSON.parse(lines[0]!) as { batch: string; runId: string; outcome: string; summary: unknown }
  })

const statuses = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  const rows = yield* sql<
    { id: string; status: number; updated_at: Date }
  >`SELECT id, status, updated_at FROM project_export_jobs ORDER BY id`
  return Object.fromEntries(
    rows.map((row) => [Number(row.id), { status: row.status, updatedAt: row.updated_at.toISOString() }])
  )
})

const events = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  return yield* sql<{ stream: string; type: string; data: Record<string, unknown>; run_id: string }>`
    SELECT stream, type, data, run_id FROM sweeper_events ORDER BY id`
})

describe("stuck-export-jobs against PostgreSQL and Redis", () => {
  // The whole batch on each Redis deployment GitLab runs (one server, a server per store, a cluster).
  for (const topology of topologies) {
    it.live(
      `fails completed exports still queued/started, spares running, finished and young parallel ones (redis ${topology})`,
      () =>
        Effect.gen(function*() {
          yield* seedProject
          const stuckQueued = yield* insertJob({
            id: 1,
            projectId: 20,
            jid: "a1b2c3d4e5f6a7b8c9d0e1f2",
            status: 0,
            createdAt: ago(3600_000)
          })
          const stuckStarted = yield* insertJob({
            id: 2,
            projectId: 21,
            jid: "0123456789abcdef01234567",
            status: 1,
            createdAt: ago(7200_000)
          })
          const running = yield* insertJob({
            id: 3,
            projectId: 20,
            jid: "fedcba9876543210fedcba98",
            status: 1,
            createdAt: ago(3600_000)
          })
          yield* insertJob({
            id: 4,
            projectId: 20,
            jid: "ffffffffffffffffffffffff",
            status: 2,
            createdAt: ago(3600_000)
          })
          // Young by two minutes: the run's clock starts at --now, and a loaded machine takes seconds to reach the check.
          const parallelYoung = yield* insertJob({
            id: 5,
            projectId: 21,
            jid: "aaaaaaaaaaaaaaaaaaaaaaaa",
            status: 1,
            createdAt: ago(SIX_HOURS_MS - 120_000)
          })
          const parallelExpired = yield* insertJob({
            id: 6,
            projectId: 21,
            jid: "bbbbbbbbbbbbbbbbbbbbbbbb",
            status: 1,
            createdAt: ago(SIX_HOURS_MS)
          })
          yield* insertRelations(parallelYoung, 21, ["issues", "merge_requests"])
          yield* insertRelations(parallelExpired, 21, ["issues"])
          yield* track(running.jid)

          const output = yield* sweeper()
          assert.strictEqual(output.batch, "stuck-export-jobs")
          assert.strictEqual(output.outcome, "succeeded")
          assert.deepStrictEqual(output.summary, {
            checked: 5,
            completed: 4,
            failed: 3,
            skippedParallel: 1,
            skippedRequeued: 0,
            skippedLocked: 0,
            heldMs: 0,
            heldBy: [],
            failedJids: [stuckQueued.jid, stuckStarted.jid, parallelExpired.jid]
          })

          const rows = yield* statuses
          assert.deepStrictEqual(
            Object.fromEntries(Object.entries(rows).map(([id, row]) => [id, row.status])),
            { 1: 3, 2: 3, 3: 1, 4: 2, 5: 1, 6: 3 }
          )
          // updated_at is the real time of the write (--now only sets the decision instant); untouched rows keep theirs.
          assert.isBelow(Math.abs(Date.parse(rows[1]!.updatedAt) - Date.now()), 60_000)
          assert.strictEqual(rows[3]!.updatedAt, ago(3600_000).toISOString())

          const log = yield* events
          assert.deepStrictEqual(log.map((e) => [e.stream, e.type]), [
            ["batch:stuck-export-jobs", "RunStarted"],
            ["export_job:1", "ExportJobFailed"],
            ["export_job:2", "ExportJobFailed"],
            ["export_job:6", "ExportJobFailed"],
            ["batch:stuck-export-jobs", "RunFinished"]
          ])
          assert.deepStrictEqual(log.filter((e) => e.type === "ExportJobFailed").map((e) => e.data), [
            { id: 1, jid: stuckQueued.jid, project_id: 20 },
            { id: 2, jid: stuckStarted.jid, project_id: 21 },
            { id: 6, jid: parallelExpired.jid, project_id: 21 }
          ])
          assert.isTrue(log.every((e) => e.run_id === output.runId))
          assert.deepStrictEqual(log[4]!.data.summary, output.summary)
          assert.strictEqual(log[4]!.data.outcome, "succeeded")

          // A second run finds nothing left to fail: the running job and the young parallel export stay.
          const again = yield* sweeper()
          assert.deepStrictEqual(again.summary, {
            checked: 2,
            completed: 1,
            failed: 0,
            skippedParallel: 1,
            skippedRequeued: 0,
            skippedLocked: 0,
            heldMs: 0,
            heldBy: [],
            failedJids: []
          })
        }).pipe(Effect.provide(Platform(topology))),
      180_000
    )
  }

  it.live("dry run: reports the stuck jobs, changes no row and records no repair", () =>
    Effect.gen(function*() {
      yield* seedProject
      const stuck = yield* insertJob({
        id: 1,
        projectId: 20,
        jid: "c0ffeec0ffeec0ffeec0ffee",
        status: 1,
        createdAt: ago(3600_000)
      })
      const output = yield* sweeper("--dry-run")
      assert.strictEqual(output.outcome, "succeeded")
      assert.deepStrictEqual(output.summary, {
        checked: 1,
        completed: 1,
        failed: 1,
        skippedParallel: 0,
        skippedRequeued: 0,
        skippedLocked: 0,
        heldMs: 0,
        heldBy: [],
        failedJids: [stuck.jid]
      })
      assert.strictEqual((yield* statuses)[1]!.status, 1)
      assert.deepStrictEqual((yield* events).map((e) => e.type), ["RunStarted", "RunFinished"])
    }).pipe(Effect.provide(Platform())))
})
