/**
 * A run never waits on a row another transaction holds, end to end: 10 of 1,000 stuck builds held `FOR UPDATE` by another
 * connection's open transaction while `sweeper run drop-canceling-builds --budget 10s` runs on the
 * real PostgreSQL and Redis. Before the fix the page holding them waited for that transaction until
 * the guard's hard timeout (budget + 30 s: `timed_out`, half the free builds left), and so did
 * every later run. Now the run succeeds without ever waiting on the holder (no backend is seen
 * blocked by its transaction while the run goes on), drops every free build exactly once, counts and
 * logs the held ones and leaves them untouched; once the lock is gone the next run drops them.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, layer } from "@effect/vitest"
import { Deferred, Effect, Fiber, Layer, Ref } from "effect"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { runCli } from "../support/cli.ts"
import { holdLocks, PgTest, TestDatabaseUrl } from "../support/postgres.ts"
import { RedisTopologyTest, TestRedisStores } from "../support/redisTopology.ts"

const NOW = "2026-01-01T05:00:00Z"
const STUCK = 1000
/** Every 100th build from 50: one in each page of the default 100. */
const HELD = Array.from({ length: 10 }, (_, i) => 50 + 100 * i)

const childEnv = Effect.gen(function*() {
  return {
    DATABASE_URL: yield* TestDatabaseUrl,
    ...(yield* TestRedisStores).env,
    SWEEPER_DATA_DIR: join(tmpdir(), "sweeper-it-data")
  }
})

const run = Effect.gen(function*() {
  const env = yield* childEnv
  const result = yield* Effect.promise(() =>
    runCli(["run", "drop-canceling-builds", "--json", "--now", NOW, "--budget", "10s"], env, 120_000)
  )
  const lines = result.stdout.split("\n").filter((line) => line.length > 0)
  assert.lengthOf(lines, 1, `${result.stderr}\n${result.stdout}`)
  const output = JSON.parse(lines[0]!) as { outcome: string; summary: unknown; durationMs: number }
  return { ...output, code: result.code, stderr: result.stderr }
})

/**
 * `effect`, and every backend seen blocked by session `holder` (pg_blocking_pids) while it ran,
 * sampled every 20 ms. A statement that waits on a held row waits for the holder's transaction
 * (until lock_timeout, 10 s by default), so a run that waits is seen however slow the machine;
 * a run that skips the held rows is never blocked by it, however long it takes.
 */
const blockedBy = <A, E, R>(holder: number, effect: Effect.Effect<A, E, R>) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const seen = yield* Ref.make<ReadonlyArray<string>>([])
    const sampler = yield* Effect.gen(function*() {
      const rows = yield* sql<{ pid: number; application: string; wait: string; query: string }>`
        SELECT pid, application_name AS application, wait_event_type || ':' || wait_event AS wait, query
        FROM pg_stat_activity WHERE ${holder} = ANY(pg_blocking_pids(pid))`
      if (rows.length > 0) {
        yield* Ref.update(
          seen,
          (all) => [...all, ...rows.map((r) => `${r.pid} ${r.application} ${r.wait}: ${r.query}`)]
        )
      }
      yield* Effect.sleep("20 millis")
    }).pipe(Effect.orDie, Effect.forever, Effect.forkChild)
    const result = yield* effect
    yield* Fiber.interrupt(sampler)
    return { result, blocked: yield* Ref.get(seen) }
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
          const holder = yield* Deferred.make<number>()
          const release = yield* holdLocks((other) =>
            Effect.gen(function*() {
              yield* other`SELECT 1 FROM ci_builds WHERE id = ANY(${HELD}::int[]) FOR UPDATE`
              const [session] = yield* other<{ pid: number }>`SELECT pg_backend_pid() AS pid`
              yield* Deferred.succeed(holder, session!.pid)
            })
          )

          const { result: first, blocked } = yield* blockedBy(yield* Deferred.await(holder), run)
          assert.deepStrictEqual(blocked.slice(0, 3), [], "the run waited on the rows another transaction holds")
          assert.strictEqual(first.code, 0, first.stderr)
          assert.strictEqual(first.outcome, "succeeded", first.stderr)
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
          // One warning per page that held some, with the ids (pages of 100: one each). Two pages are
          // written at once, so two pages' lines may come in either order.
          const warnings = first.stderr.split("\n").filter((line) =>
            line.includes("Skipped builds locked by another transaction")
          )
          assert.lengthOf(warnings, HELD.length, first.stderr)
          for (const id of HELD) {
            const named = new RegExp(`"build_ids":\\[(?:[^\\]]*,)?${id}[,\\]]`)
            assert.lengthOf(warnings.filter((line) => named.test(line)), 1, `build ${id}: ${warnings}`)
          }

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
