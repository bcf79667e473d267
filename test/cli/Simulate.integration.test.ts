/**
 * `sweeper simulate` against real servers, as a process: it writes GitLab's own rows and keys for the
 * scenarios asked for (and only those), prints its ledger as one JSON line, and refuses bad flags
 * with one line and exit 2.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, layer } from "@effect/vitest"
import { Effect, Layer, Redacted } from "effect"
import { Redis as IORedis } from "ioredis"
import { layerServer } from "../../src/layers/postgres/Postgres.ts"
import { runCli } from "../support/cli.ts"
import { createGitLabSchema } from "../support/gitlabSchema.ts"
import { freshDatabase, PgTest, TestDatabaseUrl } from "../support/postgres.ts"
import { RedisTest, TestRedisUrl } from "../support/redis.ts"

const Platform = Layer.mergeAll(PgTest, RedisTest)

const simulate = (args: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const env = { DATABASE_URL: yield* TestDatabaseUrl, REDIS_URL: yield* TestRedisUrl }
    return yield* Effect.promise(() => runCli(["simulate", ...args], env))
  })

layer(Platform, { excludeTestServices: true })("sweeper simulate (real processes)", (it) => {
  it.effect(
    "makes stuck builds and abandoned uploads in GitLab's formats, nothing else, and prints its ledger",
    () =>
      Effect.gen(function*() {
        const result = yield* simulate(["--scenario", "builds,uploads", "--rate", "2", "--duration", "2s"])
        assert.strictEqual(result.code, 0, result.stderr)
        const lines = result.stdout.trim().split("\n")
        assert.lengthOf(lines, 1, result.stdout)
        const made = JSON.parse(lines[0]!) as Record<string, number>
        assert.isAtLeast(made.ticks!, 1)
        // Per tick: `rate` stuck canceling builds, one pending for two days, one running stale, one
        // delayed build two hours past its time.
        assert.strictEqual(made.stuckBuilds, 5 * made.ticks!)
        assert.strictEqual(made.staleUploads, 2 * made.ticks!)
        assert.strictEqual(made.stuckExports, 0)
        assert.strictEqual(made.stalledRebalances, 0)

        const sql = yield* PgClient.PgClient
        // Stuck: canceling or running, created and updated more than an hour ago; pending, more than a
        // day ago (UTC, without time zone). The running controls were updated ten minutes ago.
        const [builds] = yield* sql<{ stuck: string; total: string }>`
        SELECT count(*) FILTER (WHERE
          (status IN ('canceling', 'running') AND updated_at < (now() AT TIME ZONE 'utc') - interval '1 hour'
            AND created_at < (now() AT TIME ZONE 'utc') - interval '1 hour')
          OR (status = 'pending' AND updated_at < (now() AT TIME ZONE 'utc') - interval '1 day'
            AND created_at < (now() AT TIME ZONE 'utc') - interval '1 day')
          OR (status = 'scheduled' AND scheduled_at < now() - interval '1 hour')) AS stuck,
               count(*) AS total FROM ci_builds`
        assert.strictEqual(Number(builds!.stuck), made.stuckBuilds)
        assert.strictEqual(Number(builds!.total), made.stuckBuilds! + made.healthyBuilds!)
        const [exports] = yield* sql<{ n: string }>`SELECT count(*) AS n FROM project_export_jobs`
        assert.strictEqual(Number(exports!.n), 0)

        const redis = new IORedis(yield* TestRedisUrl)
        const uploads = yield* Effect.promise(() => redis.hgetall("pending_direct_uploads"))
        yield* Effect.promise(() => redis.quit())
        const nowSeconds = Date.now() / 1000
        const values = Object.entries(uploads)
        assert.strictEqual(values.length, made.staleUploads! + made.freshUploads!)
        for (const [field, value] of values) {
          assert.match(field, /^uploads:tmp\/uploads\/[0-9a-f-]{36}$/)
          assert.match(value, /^\d+$/)
        }
        // Stale is strictly older than 3 h; fresh well inside it.
        assert.strictEqual(values.filter(([, v]) => Number(v) < nowSeconds - 3 * 3600).length, made.staleUploads)
      }),
    60_000
  )

  it.effect("an unknown scenario or a rate below 1 is one line on stderr, exit 2", () =>
    Effect.gen(function*() {
      const unknown = yield* simulate(["--scenario", "builds,bogus", "--duration", "1s"])
      assert.strictEqual(unknown.code, 2, unknown.stderr)
      assert.strictEqual(unknown.stdout, "")
      const lines = unknown.stderr.split("\n").filter((l) => l.startsWith("sweeper:"))
      assert.lengthOf(lines, 1, unknown.stderr)
      assert.include(lines[0], `unknown scenario "bogus"`)
      const zero = yield* simulate(["--rate", "0", "--duration", "1s"])
      assert.strictEqual(zero.code, 2, zero.stderr)
      assert.include(zero.stderr, "--rate")
    }), 60_000)

  it.effect(
    "refuses a real GitLab's database (gitlab schema mode) before writing anything",
    () =>
      Effect.gen(function*() {
        const { url } = yield* freshDatabase
        const tables = Effect.gen(function*() {
          const sql = yield* PgClient.PgClient
          return (yield* sql<
            { name: string }
          >`SELECT table_name AS name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1`).map((
            r
          ) => r.name)
        })
        const onGitLab = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
          Effect.scoped(Effect.provide(effect, layerServer(Redacted.make(url))))
        yield* onGitLab(createGitLabSchema({ partitioned: true }))
        const before = yield* onGitLab(tables)
        const result = yield* Effect.promise(() =>
          runCli(["simulate", "--duration", "1s"], { DATABASE_URL: url, REDIS_URL: "redis://127.0.0.1:1/0" })
        )
        assert.strictEqual(result.code, 2, result.stderr)
        const lines = result.stderr.split("\n").filter((l) => l.startsWith("sweeper:"))
        assert.lengthOf(lines, 1, result.stderr)
        assert.include(lines[0], "DATABASE_URL")
        assert.include(lines[0], "gitlab schema mode")
        assert.deepStrictEqual(yield* onGitLab(tables), before, "no table created")
      }).pipe(Effect.scoped),
    60_000
  )
})
