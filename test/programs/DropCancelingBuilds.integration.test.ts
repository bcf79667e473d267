/**
 * drop-canceling-builds end to end: GitLab-format ci_builds rows in a real PostgreSQL, the lease in
 * a real Redis, and the CLI run as an operator would (`sweeper run drop-canceling-builds --json --now …`).
 * Also the CLI's own failure modes: unknown batch, bad configuration, bad flags.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { tmpdir } from "node:os"
import { join } from "node:path"
// The lease lives in SharedState, which `Redis` is in Sweeper's composition.
import { leaseKey } from "../../src/domain/Lease.ts"
import { SharedStateRedis as Redis } from "../../src/layers/redis/Redis.ts"
import { runCli } from "../support/cli.ts"
import { PgTest, TestDatabaseUrl } from "../support/postgres.ts"
import { type RedisTopology, RedisTopologyTest, TestRedisStores, topologies } from "../support/redisTopology.ts"

const NOW = "2026-01-01T05:00:00Z"
const LEASE = leaseKey("ci/stuck_builds/drop_canceling_worker")
const STUCK = 250

const Platform = (topology: RedisTopology) => Layer.mergeAll(PgTest, RedisTopologyTest(topology))

/** One database and Redis db for the file; every test starts from empty tables and keys. */
const reset = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  yield* sql`TRUNCATE ci_builds, sweeper_events, sweeper_lease_fences RESTART IDENTITY`
  yield* (yield* TestRedisStores).flush
})

/** Env for a child process: the test's database and Redis, and a scratch data dir (never `.sweeper`). */
const childEnv = Effect.gen(function*() {
  return {
    DATABASE_URL: yield* TestDatabaseUrl,
    ...(yield* TestRedisStores).env,
    SWEEPER_DATA_DIR: join(tmpdir(), "sweeper-it-data")
  }
})

/**
 * 250 stuck canceling builds (ids 1–250) at fixed 2026-01-01 times between 01:00 and 03:59, several
 * per created_at, plus controls that must not change: a recent canceling build (1001), a running
 * one (1002), a canceling Ci::Bridge (1003), one touched recently (1004).
 */
const seed = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  yield* sql`INSERT INTO ci_builds (id, project_id, commit_id, name, runner_id, status, lock_version, created_at, updated_at, started_at)
    SELECT i, 100 + i % 9, 5000 + i, 'rspec ' || i, CASE WHEN i % 5 = 0 THEN NULL ELSE 40 + i % 3 END, 'canceling', i % 4,
      '2026-01-01 01:00:00'::timestamp + ((i % 60) * interval '3 minutes'),
      '2026-01-01 03:30:00'::timestamp,
      '2026-01-01 01:00:00'::timestamp
    FROM generate_series(1, ${STUCK}) AS i`
  yield* sql`INSERT INTO ci_builds (id, project_id, type, status, created_at, updated_at) VALUES
    (1001, 1, 'Ci::Build', 'canceling', '2026-01-01 04:30:00', '2026-01-01 04:30:00'),
    (1002, 1, 'Ci::Build', 'running', '2026-01-01 01:00:00', '2026-01-01 01:00:00'),
    (1003, 1, 'Ci::Bridge', 'canceling', '2026-01-01 01:00:00', '2026-01-01 01:00:00'),
    (1004, 1, 'Ci::Build', 'canceling', '2026-01-01 01:00:00', '2026-01-01 04:59:00')`
})

interface Snapshot {
  readonly id: string
  readonly status: string
  readonly failure_reason: number | null
  readonly lock_version: number
  readonly finished_at: Date | null
  readonly updated_at: Date
}

const snapshot = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  return yield* sql<Snapshot>`SELECT id::text AS id, status, failure_reason, lock_version, finished_at, updated_at
    FROM ci_builds ORDER BY id`
})

const events = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  return yield* sql<{ stream: string; type: string; data: Record<string, unknown>; run_id: string | null }>`
    SELECT stream, type, data, run_id FROM sweeper_events ORDER BY id`
})

const sweeper = (args: ReadonlyArray<string>, extraEnv: Record<string, string> = {}) =>
  Effect.gen(function*() {
    const env = { ...(yield* childEnv), ...extraEnv }
    return yield* Effect.promise(() => runCli(args, env))
  })

const runJson = (...extra: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const result = yield* sweeper(["run", "drop-canceling-builds", "--json", "--now", NOW, ...extra])
    assert.strictEqual(result.code, 0, `${result.stderr}\n${result.stdout}`)
    const lines = result.stdout.split("\n").filter((line) => line.length > 0)
    assert.lengthOf(lines, 1, result.stdout)
    const parsed = JSON.parse(lines[0]!) as Record<string, unknown>
    assert.includeMembers(Object.keys(parsed), ["batch", "runId", "outcome", "dryRun", "summary"])
    return parsed as { batch: string; runId: string; outcome: string; summary: unknown }
  })

// Every test on each Redis deployment GitLab runs: one server, a server per store, a cluster.
const suite = (topology: RedisTopology) =>
  layer(Platform(topology), { excludeTestServices: true })(
    `sweeper run drop-canceling-builds (real PostgreSQL + Redis ${topology}, CLI)`,
    (it) => {
      it.effect(
        "drops the 250 stuck builds in 3 batches, records every drop under the run id, releases the lease",
        () =>
          Effect.gen(function*() {
            yield* reset
            yield* seed
            const before = yield* snapshot
            const result = yield* runJson()
            assert.strictEqual(result.batch, "drop-canceling-builds")
            assert.strictEqual(result.outcome, "succeeded")
            assert.match(result.runId, /^[0-9a-f-]{36}$/)
            assert.deepStrictEqual(result.summary, {
              dropped: STUCK,
              doomed: 0,
              batches: 3,
              skippedLocked: 0,
              heldMs: 0,
              heldBy: []
            })

            const after = yield* snapshot
            const now = Date.parse(NOW)
            for (const row of after) {
              const id = Number(row.id)
              const old = before.find((b) => b.id === row.id)!
              if (id <= STUCK) {
                assert.strictEqual(row.status, "failed", `build ${id}`)
                assert.strictEqual(row.failure_reason, 3)
                assert.strictEqual(row.lock_version, old.lock_version + 1)
                // --now only sets the decision instant: the write carries the real time, never the fake one.
                const finished = row.finished_at!.getTime()
                assert.isAbove(finished, now, `build ${id} finished_at`)
                assert.isBelow(Math.abs(finished - Date.now()), 60_000)
                assert.strictEqual(row.updated_at.getTime(), finished)
              } else {
                assert.deepStrictEqual(row, old, `control build ${id} untouched`)
              }
            }

            const recorded = yield* events
            assert.strictEqual(recorded[0]!.type, "RunStarted")
            assert.strictEqual(recorded.at(-1)!.type, "RunFinished")
            assert.deepStrictEqual(recorded.at(-1)!.data.summary, {
              dropped: STUCK,
              doomed: 0,
              batches: 3,
              skippedLocked: 0,
              heldMs: 0,
              heldBy: []
            })
            assert.strictEqual(recorded.at(-1)!.data.outcome, "succeeded")
            const drops = recorded.filter((e) => e.type === "BuildDropped")
            assert.lengthOf(drops, STUCK)
            assert.lengthOf(recorded, STUCK + 2)
            assert.isTrue(recorded.every((e) => e.run_id === result.runId))
            assert.deepStrictEqual(
              new Set(drops.map((e) => e.stream)),
              new Set(Array.from({ length: STUCK }, (_, i) => `build:${i + 1}`))
            )
            const five = drops.find((e) => e.stream === "build:5")!
            assert.deepStrictEqual(five.data, {
              id: 5,
              project_id: 105,
              runner_id: null,
              pipeline_id: 5005,
              failure_reason: 3
            })

            const redis = yield* Redis
            assert.isNull(yield* redis.use("test.get", (c) => c.get(LEASE)))

            // Running again finds nothing left.
            const again = yield* runJson()
            assert.deepStrictEqual(again.summary, {
              dropped: 0,
              doomed: 0,
              batches: 0,
              skippedLocked: 0,
              heldMs: 0,
              heldBy: []
            })
          }),
        120_000
      )

      // The rest does not depend on where the stores are: one deployment is enough.
      if (topology !== "single") return
      it.effect("lease held by someone else → skipped, exit 0, nothing changed, their lease kept", () =>
        Effect.gen(function*() {
          yield* reset
          yield* seed
          const redis = yield* Redis
          yield* redis.use("test.set", (c) =>
            c.set(LEASE, "another-sidekiq-process", "EX", 1800))
          const before = yield* snapshot
          const result = yield* runJson()
          assert.strictEqual(result.outcome, "skipped")
          assert.isNull(result.summary)
          assert.deepStrictEqual(yield* snapshot, before)
          const recorded = yield* events
          assert.deepStrictEqual(recorded.map((e) => e.type), ["RunStarted", "RunFinished"])
          assert.strictEqual(recorded[1]!.data.outcome, "skipped")
          assert.strictEqual(recorded[1]!.data.reason, "lease held")
          assert.strictEqual(yield* redis.use("test.get", (c) => c.get(LEASE)), "another-sidekiq-process")
        }), 60_000)

      it.effect("--dry-run reports what it would drop and changes nothing", () =>
        Effect.gen(function*() {
          yield* reset
          yield* seed
          const before = yield* snapshot
          const result = yield* runJson("--dry-run")
          assert.strictEqual(result.outcome, "succeeded")
          assert.deepStrictEqual(result.summary, {
            dropped: STUCK,
            doomed: 0,
            batches: 3,
            skippedLocked: 0,
            heldMs: 0,
            heldBy: []
          })
          assert.deepStrictEqual(yield* snapshot, before)
          const recorded = yield* events
          assert.deepStrictEqual(
            recorded.map((e) =>
              e.type
            ),
            ["RunStarted", "RunFinished"]
          )
          assert.strictEqual(recorded[0]!.data.dryRun, true)
          assert.strictEqual(recorded[1]!.data.dryRun, true)
          const redis = yield* Redis
          assert.isNull(yield* redis.use("test.get", (c) => c.get(LEASE)))
        }), 60_000)

      it.effect("SWEEPER_DROP_BATCH_SIZE=60: 250 builds in 5 pages, each page one transaction", () =>
        Effect.gen(function*() {
          yield* reset
          yield* seed
          const result = yield* sweeper(["run", "drop-canceling-builds", "--json", "--now", NOW], {
            SWEEPER_DROP_BATCH_SIZE: "60"
          })
          assert.strictEqual(result.code, 0, result.stderr)
          const parsed = JSON.parse(result.stdout) as { outcome: string; summary: unknown }
          assert.strictEqual(parsed.outcome, "succeeded")
          assert.deepStrictEqual(parsed.summary, {
            dropped: STUCK,
            doomed: 0,
            batches: 5,
            skippedLocked: 0,
            heldMs: 0,
            heldBy: []
          })
          // Rows written by one transaction share its xmin: 60 + 60 + 60 + 60 + 10.
          const sql = yield* PgClient.PgClient
          const perTransaction = yield* sql<{ n: string }>`
        SELECT count(*) AS n FROM ci_builds WHERE status = 'failed' GROUP BY xmin::text ORDER BY count(*) DESC`
          assert.deepStrictEqual(
            perTransaction.map((r) =>
              Number(r.n)
            ),
            [60, 60, 60, 60, 10]
          )
          assert.lengthOf((yield* events).filter((e) => e.type === "BuildDropped"), STUCK)
        }), 60_000)

      it.effect(
        "usage errors: unknown batch → 2 naming the known batches; --budget garbage → 2; bad config → one line naming the variable",
        () =>
          Effect.gen(function*() {
            yield* reset
            const before = yield* snapshot
            // Three independent processes: run them side by side.
            const [unknown, budget, badPort] = yield* Effect.all([
              sweeper(["run", "no-such-batch"]),
              sweeper(["run", "drop-canceling-builds", "--budget", "soon-ish"]),
              sweeper(["run", "drop-canceling-builds", "--json"], { SWEEPER_HTTP_PORT: "abc" })
            ], { concurrency: "unbounded" })
            assert.strictEqual(unknown.code, 2, unknown.stderr)
            assert.include(unknown.stderr, "no-such-batch")
            assert.include(unknown.stderr, "drop-canceling-builds")
            assert.strictEqual(unknown.stdout, "")

            assert.strictEqual(budget.code, 2, budget.stderr)
            assert.include(budget.stderr, "--budget")

            assert.strictEqual(badPort.code, 2, badPort.stderr)
            const lines = badPort.stderr.split("\n").filter((line) =>
              line.trim().length > 0
            )
            assert.lengthOf(lines, 1, badPort.stderr)
            assert.include(lines[0]!, "SWEEPER_HTTP_PORT")
            assert.strictEqual(badPort.stdout, "")

            // None of them touched the database.
            assert.deepStrictEqual(yield* snapshot, before)
            assert.lengthOf(yield* events, 0)
          }),
        60_000
      )
    }
  )

for (const topology of topologies) suite(topology)
