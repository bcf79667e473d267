/**
 * `sweeper events prune --before T [--dry-run] [--json]` as an operator runs it: against a real
 * PostgreSQL (dry run counts, the real run deletes exactly what is older than T except what batch
 * state folds from, a T inside the retention period is refused with one line and exit 2), and on
 * the embedded default, where the running supervisor holds the database and does the prune.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { runCli } from "../support/cli.ts"
import { PgTest, TestDatabaseUrl } from "../support/postgres.ts"
import { startSweeper } from "../support/processes.ts"
import { RedisTest, TestRedisUrl } from "../support/redis.ts"

const DAY = 86_400_000
const NOW = Date.now()
const iso = (ms: number) => new Date(ms).toISOString()

const Platform = Layer.mergeAll(PgTest, RedisTest)

const sweeper = (args: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const env = { DATABASE_URL: yield* TestDatabaseUrl, REDIS_URL: yield* TestRedisUrl }
    return yield* Effect.promise(() => runCli(args, env))
  })

const errorLines = (stderr: string) => stderr.split("\n").filter((l) => l.startsWith("sweeper:"))

/**
 * 30 repair events 200 days old, 5 that are 50 days old, and stuck-export-jobs paused 300 days ago
 * (still paused: that BatchPaused must survive any prune).
 */
const seed = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  yield* sql`TRUNCATE sweeper_events, sweeper_lease_fences RESTART IDENTITY`
  yield* sql`INSERT INTO sweeper_events (stream, type, data, occurred_at)
    VALUES ('batch:stuck-export-jobs', 'BatchPaused', '{"batch": "stuck-export-jobs", "by": "cli:ops"}', ${new Date(
    NOW - 300 * DAY
  )})`
  yield* sql`INSERT INTO sweeper_events (stream, type, data, occurred_at)
    SELECT 'build:' || i, 'BuildDropped', jsonb_build_object('id', i), ${new Date(
    NOW - 200 * DAY
  )}::timestamptz + i * interval '1 second'
    FROM generate_series(1, 30) AS i`
  yield* sql`INSERT INTO sweeper_events (stream, type, data, occurred_at)
    SELECT 'build:' || i, 'BuildDropped', jsonb_build_object('id', i), ${new Date(NOW - 50 * DAY)}::timestamptz
    FROM generate_series(100, 104) AS i`
})

const count = (type: string) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const rows = yield* sql<{ n: string }>`SELECT count(*) AS n FROM sweeper_events WHERE type = ${type}`
    return Number(rows[0]!.n)
  })

layer(Platform, { excludeTestServices: true })("sweeper events prune (real PostgreSQL)", (it) => {
  it.effect("--dry-run --json counts; the real run deletes them, keeps the old pause (status still paused)", () =>
    Effect.gen(function*() {
      yield* seed
      const before = iso(NOW - 100 * DAY)
      const dry = yield* sweeper(["events", "prune", "--before", before, "--dry-run", "--json"])
      assert.strictEqual(dry.code, 0, dry.stderr)
      const planned = JSON.parse(dry.stdout)
      assert.strictEqual(planned.batch, "prune-events")
      assert.strictEqual(planned.dryRun, true)
      assert.deepStrictEqual(planned.summary, {
        before: new Date(before).toISOString(),
        pruned: 30,
        keptForState: 1,
        pages: 0,
        executionTimeout: false,
        skippedLocked: 0,
        heldMs: 0,
        heldBy: []
      })
      assert.strictEqual(yield* count("BuildDropped"), 35)

      const real = yield* sweeper(["events", "prune", "--before", before, "--json"])
      assert.strictEqual(real.code, 0, real.stderr)
      const done = JSON.parse(real.stdout)
      assert.strictEqual(done.outcome, "succeeded")
      assert.deepStrictEqual(done.summary, {
        before: new Date(before).toISOString(),
        pruned: 30,
        keptForState: 1,
        pages: 1,
        executionTimeout: false,
        skippedLocked: 0,
        heldMs: 0,
        heldBy: []
      })
      assert.strictEqual(yield* count("BuildDropped"), 5)
      assert.strictEqual(yield* count("BatchPaused"), 1)
      assert.strictEqual(yield* count("EventsPruned"), 1)

      const status = yield* sweeper(["status", "--json"])
      const rows = JSON.parse(status.stdout) as Array<{ name: string; state: string }>
      assert.strictEqual(rows.find((r) => r.name === "stuck-export-jobs")!.state, "paused")
      assert.include(rows.map((r) => r.name), "prune-events")
    }))

  it.effect("a --before inside the retention period is refused: one line naming --before, exit 2, nothing deleted", () =>
    Effect.gen(function*() {
      yield* seed
      for (const before of [iso(NOW - 89 * DAY), iso(NOW + DAY)]) {
        const result = yield* sweeper(["events", "prune", "--before", before, "--dry-run"])
        assert.strictEqual(result.code, 2, result.stderr)
        assert.strictEqual(result.stdout, "")
        const lines = errorLines(result.stderr)
        assert.lengthOf(lines, 1, result.stderr)
        assert.match(lines[0]!, /^sweeper: --before: .* is within the retention period \(SWEEPER_EVENT_RETENTION 90d\)/)
      }
      const bad = yield* sweeper(["events", "prune", "--before", "last year"])
      assert.strictEqual(bad.code, 2)
      assert.match(
        errorLines(bad.stderr)[0]!,
        /^sweeper: invalid flag: --before="last year": expected an ISO-8601 instant/
      )
      assert.strictEqual(yield* count("BuildDropped"), 35)
    }))
})

describe("sweeper events prune on the embedded default", () => {
  it.live("asks the running supervisor, which holds the database", () =>
    Effect.promise(async () => {
      const dataDir = mkdtempSync(join(tmpdir(), "sweeper-prune-"))
      const supervisor = startSweeper("prune-supervisor", { SWEEPER_DATA_DIR: dataDir })
      try {
        await supervisor.listening
        const env = { SWEEPER_DATA_DIR: dataDir }
        const result = await runCli(["events", "prune", "--before", "2020-01-01T00:00:00Z", "--json"], env)
        assert.strictEqual(result.code, 0, result.stderr)
        const done = JSON.parse(result.stdout)
        assert.strictEqual(done.outcome, "succeeded")
        assert.strictEqual(done.summary.before, "2020-01-01T00:00:00.000Z")
        // The supervisor ran it: its node name is on the run's RunStarted.
        const events = await runCli(["events", "--stream", "batch:prune-events", "--json"], env)
        const started = events.stdout.trim().split("\n").map((line) => JSON.parse(line)).find((e) =>
          e.type === "RunStarted"
        )
        assert.strictEqual(started.data.node, "prune-supervisor")
        assert.strictEqual(started.runId, done.runId)
        const refused = await runCli(["events", "prune", "--before", iso(Date.now() - DAY)], env)
        assert.strictEqual(refused.code, 2)
      } finally {
        supervisor.child.kill("SIGTERM")
        await supervisor.exited
        rmSync(dataDir, { recursive: true, force: true })
      }
    }), 120_000)
})
