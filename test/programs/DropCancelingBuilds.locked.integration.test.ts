/**
 * A run never waits on a row another transaction holds, end to end: 10 of 1,000 stuck builds held `FOR UPDATE` by another
 * connection's open transaction while `sweeper run drop-canceling-builds --budget 10s` runs on the
 * real PostgreSQL and Redis. Before the fix the page holding them waited for that transaction until
 * the guard's hard timeout (budget + 30 s: `timed_out`, half the free builds left), and so did
 * every later run. Now the run succeeds well inside its budget, drops every free build exactly once,
 * counts and logs the held ones and leaves them untouched; once the lock is gone the next run
 * drops them.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { runCli } from "../support/cli.ts"
import { holdLocks, PgTest, TestDatabaseUrl } from "../support/postgres.ts"
import { RedisTopologyTest, TestRedisStores } from "../support/redisTopology.ts"

const NOW = "2026-01-01T05:00:00Z"
const STUCK = 1000
/** Every 100th build from 50: one in each page of the default 100. */
const HELD = Array.from({ length: 10 }, (_, i) => 50 + 100 * i)
const BUDGET_MS = 10_000
/** A CLI start (Node, migrations check, lease) on a loaded 2-core machine. */
const MARGIN_MS = 5_000

const childEnv = Effect.gen(function*() {
  return {
    DATABASE_URL: yield* TestDatabaseUrl,
    ...(yield* TestRedisStores).env,
    SWEEPER_DATA_DIR: join(tmpdir(), "sweeper-it-data")
  }
})

const run = Effect.gen(function*() {
  const env = yield* childEnv
  const started = Date.now()
  const result = yield* Effect.promise(() =>
    runCli(["run", "drop-canceling-builds", "--json", "--now", NOW, "--budget", "10s"], env, 120_000)
  )
  const wallMs = Date.now() - started
  const lines = result.stdout.split("\n").filter((line) => line.length > 0)
  assert.lengthOf(lines, 1, `${result.stderr}\n${result.stdout}`)
  const output = JSON.parse(lines[0]!) as { outcome: string; summary: unknown; durationMs: number }
  return { ...output, code: result.code, wallMs, stderr: result.stderr }
})

const droppedPerBuild = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  const rows = yield* sql<{ id: number; n: string }>`
    SELECT (data->>'id')::int AS id, count(*) AS n FROM sweeper_events WHERE type = 'BuildDropped' GROUP BY 1`
  return new Map(rows.map((row) => [row.id, Number(row.n)]))
})

const statuses = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  const rows = yield* sql<{ id: number; status: string }>`SELECT id::int AS id, status FROM ci_builds ORDER BY id`
  return new Map(rows.map((row) => [row.id, row.status]))
})

layer(Layer.mergeAll(PgTest, RedisTopologyTest("single")), { excludeTestServices: true })(
  "drop-canceling-builds with rows held by another transaction (real PostgreSQL + Redis, CLI)",
  (it) => {
    it.effect(
      "skips the 10 held builds within its budget, drops the 990 others once; drops the 10 once released",
      () =>
        Effect.gen(function*() {
          const sql = yield* PgClient.PgClient
          yield* sql`INSERT INTO ci_builds (id, project_id, runner_id, status, lock_version, created_at, updated_at)
          SELECT i, 100 + i % 9, 40, 'canceling', i % 4,
            '2026-01-01 01:00:00'::timestamp + (i * interval '1 second'), '2026-01-01 03:30:00'::timestamp
          FROM generate_series(1, ${STUCK}) AS i`
          const release = yield* holdLocks((other) =>
            other`SELECT 1 FROM ci_builds WHERE id = ANY(${HELD}::int[]) FOR UPDATE`
          )

          const first = yield* run
          assert.strictEqual(first.code, 0, first.stderr)
          assert.strictEqual(first.outcome, "succeeded", first.stderr)
          assert.isBelow(first.wallMs, BUDGET_MS + MARGIN_MS, "the run waited for the held rows")
          assert.deepStrictEqual(first.summary, {
            dropped: STUCK - HELD.length,
            doomed: 0,
            batches: 10,
            skippedLocked: HELD.length,
            heldMs: 0,
            heldBy: []
          })
          const afterFirst = yield* droppedPerBuild
          assert.strictEqual(afterFirst.size, STUCK - HELD.length)
          assert.isTrue([...afterFirst.values()].every((n) => n === 1), "a build was dropped twice")
          const rows = yield* statuses
          for (const id of HELD) {
            assert.isFalse(afterFirst.has(id), `held build ${id} got an event`)
            assert.strictEqual(rows.get(id), "canceling")
          }
          // One warning per page that held some, with the ids (pages of 100: one each).
          const warnings = first.stderr.split("\n").filter((line) =>
            line.includes("Skipped builds locked by another transaction")
          )
          assert.lengthOf(warnings, HELD.length, first.stderr)
          for (const [i, id] of HELD.entries()) assert.include(warnings[i]!, String(id))

          yield* release
          const second = yield* run
          assert.strictEqual(second.outcome, "succeeded", second.stderr)
          assert.deepStrictEqual(second.summary, {
            dropped: HELD.length,
            doomed: 0,
            batches: 1,
            skippedLocked: 0,
            heldMs: 0,
            heldBy: []
          })
          const afterSecond = yield* droppedPerBuild
          assert.strictEqual(afterSecond.size, STUCK)
          assert.isTrue([...afterSecond.values()].every((n) => n === 1), "a build was dropped twice")
          assert.isTrue([...(yield* statuses).values()].every((status) => status === "failed"))
        }),
      { timeout: 180_000 }
    )
  }
)
