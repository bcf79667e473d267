/**
 * A run never waits on a row another transaction holds, for stuck-export-jobs, end to end: 10 of 1,000 stuck export jobs
 * held `FOR UPDATE` by another connection's open transaction while `sweeper run stuck-export-jobs
 * --budget 10s` runs on the real PostgreSQL and Redis. Before the fix the slice holding them waited
 * for that transaction until the guard's hard timeout; now the run succeeds inside its budget, fails
 * every free job exactly once, counts and logs the held ones and leaves them untouched, and the
 * next run, once the lock is gone, fails them.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { runCli } from "../support/cli.ts"
import { holdLocks, PgTest, TestDatabaseUrl } from "../support/postgres.ts"
import { RedisTopologyTest, TestRedisStores } from "../support/redisTopology.ts"

const NOW = "2026-03-01T12:30:00.000Z"
const STUCK = 1000
/** Spread over the ids; FAIL_SLICE is 1,000, so all ten are in the one slice (one log line). */
const HELD = Array.from({ length: 10 }, (_, i) => 50 + 100 * i)
const BUDGET_MS = 10_000
const MARGIN_MS = 5_000

const run = Effect.gen(function*() {
  const env = { DATABASE_URL: yield* TestDatabaseUrl, ...(yield* TestRedisStores).env }
  const started = Date.now()
  const result = yield* Effect.promise(() =>
    runCli(["run", "stuck-export-jobs", "--json", "--now", NOW, "--budget", "10s"], env, 120_000)
  )
  const wallMs = Date.now() - started
  const lines = result.stdout.split("\n").filter((line) => line.length > 0)
  assert.lengthOf(lines, 1, `${result.stderr}\n${result.stdout}`)
  const output = JSON.parse(lines[0]!) as { outcome: string; summary: Record<string, unknown> }
  return { ...output, code: result.code, wallMs, stderr: result.stderr }
})

const failedPerJob = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  const rows = yield* sql<{ id: number; n: string }>`
    SELECT (data->>'id')::int AS id, count(*) AS n FROM sweeper_events WHERE type = 'ExportJobFailed' GROUP BY 1`
  return new Map(rows.map((row) => [row.id, Number(row.n)]))
})

const statuses = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  const rows = yield* sql<{ id: number; status: number }>`SELECT id::int AS id, status FROM project_export_jobs`
  return new Map(rows.map((row) => [row.id, row.status]))
})

layer(Layer.mergeAll(PgTest, RedisTopologyTest("single")), { excludeTestServices: true })(
  "stuck-export-jobs with rows held by another transaction (real PostgreSQL + Redis, CLI)",
  (it) => {
    it.effect(
      "skips the 10 held jobs within its budget, fails the 990 others once; fails the 10 once released",
      () =>
        Effect.gen(function*() {
          const sql = yield* PgClient.PgClient
          yield* sql`INSERT INTO namespaces (id, name, path) VALUES (10, 'g', 'g')`
          yield* sql`INSERT INTO projects (id, namespace_id, name, path) VALUES (20, 10, 'p', 'p')`
          // No Sidekiq status key for any jid: every job's worker has completed.
          yield* sql`INSERT INTO project_export_jobs (id, project_id, jid, status, user_id, created_at, updated_at)
          SELECT i, 20, 'jid-' || i, i % 2, 1, '2026-03-01 10:00:00', '2026-03-01 10:00:00' FROM generate_series(1, ${STUCK}) AS i`
          const release = yield* holdLocks((other) =>
            other`SELECT 1 FROM project_export_jobs WHERE id = ANY(${HELD}::int[]) FOR UPDATE`
          )

          const first = yield* run
          assert.strictEqual(first.code, 0, first.stderr)
          assert.strictEqual(first.outcome, "succeeded", first.stderr)
          assert.isBelow(first.wallMs, BUDGET_MS + MARGIN_MS, "the run waited for the held rows")
          assert.strictEqual(first.summary.failed, STUCK - HELD.length)
          assert.strictEqual(first.summary.skippedLocked, HELD.length)
          const afterFirst = yield* failedPerJob
          assert.strictEqual(afterFirst.size, STUCK - HELD.length)
          assert.isTrue([...afterFirst.values()].every((n) => n === 1), "a job was failed twice")
          const rows = yield* statuses
          for (const id of HELD) {
            assert.isFalse(afterFirst.has(id), `held job ${id} got an event`)
            assert.strictEqual(rows.get(id), id % 2)
          }
          const logged = first.stderr.split("\n").filter((line) =>
            line.includes("Export jobs locked by another transaction")
          )
          assert.lengthOf(logged, 1, first.stderr)
          assert.deepStrictEqual(JSON.parse(logged[0]!).export_job_ids, HELD)

          yield* release
          const second = yield* run
          assert.strictEqual(second.outcome, "succeeded", second.stderr)
          assert.strictEqual(second.summary.failed, HELD.length)
          assert.strictEqual(second.summary.skippedLocked, 0)
          const afterSecond = yield* failedPerJob
          assert.strictEqual(afterSecond.size, STUCK)
          assert.isTrue([...afterSecond.values()].every((n) => n === 1), "a job was failed twice")
          assert.isTrue([...(yield* statuses).values()].every((status) => status === 3))
        }),
      { timeout: 180_000 }
    )
  }
)
