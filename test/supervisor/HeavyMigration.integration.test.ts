/**
 * Through the real CLI, on a ledger past the inline limit with the console rollup not yet migrated:
 * `sweeper start` refuses in one line before changing anything, `migrate --plan` lists the online
 * steps, and `sweeper migrate` applies them.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Redacted } from "effect"
import type { SqlClient } from "effect/sql"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { migrate, ONLINE_INLINE_MAX_EVENTS } from "../../src/layers/postgres/Migrations.ts"
import { layerServer } from "../../src/layers/postgres/Postgres.ts"
import { runCli } from "../support/cli.ts"
import { freshDatabase } from "../support/postgres.ts"
import { freshRedisUrl } from "../support/redis.ts"

const CLI_TIMEOUT = 150_000
const cli = (args: ReadonlyArray<string>, env: Record<string, string>) =>
  Effect.promise(() => runCli(args, env, CLI_TIMEOUT))

describe("a heavy pending migration", () => {
  it.live(
    "start refuses in one line and changes nothing; migrate --plan lists the steps; migrate applies them",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const { url } = yield* freshDatabase
        const redisUrl = yield* freshRedisUrl
        const env = { DATABASE_URL: url, REDIS_URL: redisUrl, SWEEPER_DATA_DIR: join(tmpdir(), "sweeper-heavy-it") }
        const onDatabase = <A, E>(effect: Effect.Effect<A, E, PgClient.PgClient | SqlClient.SqlClient>) =>
          Effect.provide(effect, layerServer(Redacted.make(url)))
        const state = onDatabase(Effect.gen(function*() {
          const sql = yield* PgClient.PgClient
          const latest = yield* sql<{ n: number }>`SELECT max(migration_id) AS n FROM sweeper_migrations`
          const runs = yield* sql<{ found: boolean }>`SELECT to_regclass('sweeper_runs') IS NOT NULL AS found`
          return { latest: Number(latest[0]!.n), runs: runs[0]!.found }
        }))
        // The schema of migration 4 (no rollup, no (run_id, id)) under a ledger past the inline limit.
        yield* onDatabase(Effect.gen(function*() {
          const sql = yield* PgClient.PgClient
          yield* migrate
          yield* sql`DROP TRIGGER sweeper_runs_fold ON sweeper_events`
          yield* sql`DROP TABLE sweeper_runs, sweeper_backfills`
          yield* sql`DROP INDEX index_sweeper_events_on_run_id_and_id`
          yield* sql`CREATE INDEX index_sweeper_events_on_run_id ON sweeper_events (run_id) WHERE run_id IS NOT NULL`
          yield* sql`DELETE FROM sweeper_migrations WHERE migration_id >= 5`
          yield* sql`INSERT INTO sweeper_events (stream, type, data, run_id)
          SELECT 'build:' || g, 'BuildDropped', '{}', md5((g / 100)::text)::uuid
          FROM generate_series(1, ${ONLINE_INLINE_MAX_EVENTS + 1000}) g`
        }))

        const start = yield* cli(["start"], env)
        assert.strictEqual(start.code, 2, start.stderr)
        // Past the start-up log line, the refusal: one line.
        const lines = start.stderr.trim().split("\n").filter((line) => !line.startsWith("{"))
        assert.lengthOf(lines, 1, start.stderr)
        assert.match(lines[0]!, /^sweeper: sweeper_events holds over 200,000 events .* run `sweeper migrate` first/)
        assert.deepStrictEqual(yield* state, { latest: 4, runs: false })

        const plan = yield* cli(["migrate", "--plan"], env)
        assert.strictEqual(plan.code, 0, plan.stderr)
        assert.include(plan.stdout, "0005_console_rollup, 0006_ledger_rollup, ")
        assert.include(plan.stdout, "0005_build index_sweeper_events_on_run_id_and_id concurrently (online)")
        assert.deepStrictEqual(yield* state, { latest: 4, runs: false })

        const migrated = yield* cli(["migrate"], env)
        assert.strictEqual(migrated.code, 0, migrated.stderr)
        assert.include(migrated.stdout, "0006_backfill sweeper_runs in id ranges")
        assert.deepStrictEqual(yield* state, { latest: 13, runs: true })
        assert.strictEqual(
          (yield* cli(["migrate", "--plan"], env)).stdout.trim(),
          "Schema is up to date (standalone mode, detected)"
        )
      })),
    600_000
  )
})
