/**
 * The CLI's conventions, as real processes: exit codes (0 ok, 1 failed run, 2 bad input, 3
 * infrastructure unreachable), one line on stderr for every error (stdout stays clean for
 * `--json`), a failed run keeps its cause, `--now` is the exact decision instant and never a
 * written time, dry runs are marked and list their targets, disabled batches need --force.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { runCli } from "../support/cli.ts"
import { adminUrl, PgTest, TestDatabaseUrl } from "../support/postgres.ts"
import { RedisTest, TestRedisUrl } from "../support/redis.ts"

const T = "2026-01-01T05:00:00.000Z"
const HOUR = 3600_000

const Platform = Layer.mergeAll(PgTest, RedisTest)

const sweeper = (args: ReadonlyArray<string>, extraEnv: Record<string, string> = {}) =>
  Effect.gen(function*() {
    const env = { DATABASE_URL: yield* TestDatabaseUrl, REDIS_URL: yield* TestRedisUrl, ...extraEnv }
    return yield* Effect.promise(() => runCli(args, env))
  })

/** stderr without the log lines (JSON) and npm's own warnings. */
const errorLines = (stderr: string) => stderr.split("\n").filter((l) => l.startsWith("sweeper:"))

const resetBuilds = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  yield* sql`TRUNCATE ci_builds, sweeper_events`
})

layer(Platform, { excludeTestServices: true })("sweeper CLI conventions (real processes)", (it) => {
  it.effect("a usage error is one line on stderr, nothing on stdout, exit 2", () =>
    Effect.gen(function*() {
      const result = yield* sweeper(["run", "drop-canceling-builds", "--json", "--bogus"])
      assert.strictEqual(result.code, 2)
      assert.strictEqual(result.stdout, "")
      assert.lengthOf(errorLines(result.stderr), 1, result.stderr)
      assert.include(result.stderr, "--bogus")

      const badDuration = yield* sweeper(["run", "drop-canceling-builds", "--budget", "soon"])
      assert.strictEqual(badDuration.code, 2)
      assert.include(errorLines(badDuration.stderr)[0], "--budget")

      const noCommand = yield* sweeper([])
      assert.strictEqual(noCommand.code, 2)
      assert.strictEqual(noCommand.stdout, "")
    }), 180_000)

  it.effect(
    "unreachable or malformed infrastructure: one line naming the host, never the password, exit 3",
    () =>
      Effect.gen(function*() {
        // A reachable Redis beside it: DATABASE_URL alone is a configuration error (exit 2).
        const pg = yield* sweeper(["status"], { DATABASE_URL: "postgres://gitlab:hunter2@127.0.0.1:1/gitlab" })
        assert.strictEqual(pg.code, 3, pg.stderr)
        assert.strictEqual(pg.stdout, "")
        assert.lengthOf(errorLines(pg.stderr), 1, pg.stderr)
        assert.match(errorLines(pg.stderr)[0]!, /cannot reach PostgreSQL at 127\.0\.0\.1:1: .*ECONNREFUSED/)
        assert.notInclude(pg.stderr, "hunter2")

        // A server that answers, but not for this database: every command that opens it says so in one line.
        const absentDatabase = new URL(adminUrl)
        absentDatabase.pathname = "/sweeper_no_such_database"
        absentDatabase.password = "hunter2"
        for (const command of [["status"], ["doctor"], ["migrate"], ["run", "stuck-export-jobs"]]) {
          const absent = yield* sweeper(command, { DATABASE_URL: absentDatabase.toString() })
          assert.strictEqual(absent.code, 3, `${command.join(" ")}: ${absent.stderr}`)
          assert.lengthOf(errorLines(absent.stderr), 1, absent.stderr)
          assert.match(
            errorLines(absent.stderr)[0]!,
            new RegExp(`cannot reach PostgreSQL at ${absentDatabase.host}: .*"sweeper_no_such_database" does not exist`)
          )
          assert.notInclude(absent.stderr, "hunter2")
        }

        const malformed = yield* sweeper(["status"], { DATABASE_URL: "postgres://gitlab:hunter2@[nope" })
        assert.strictEqual(malformed.code, 3)
        assert.lengthOf(errorLines(malformed.stderr), 1, malformed.stderr)
        assert.notInclude(malformed.stderr, "hunter2")

        const redis = yield* sweeper(["status"], { REDIS_URL: "redis://:s3cret@127.0.0.1:1/0" })
        assert.strictEqual(redis.code, 3, redis.stderr)
        assert.match(errorLines(redis.stderr)[0]!, /cannot reach Redis at 127\.0\.0\.1:1: RedisError: .*connect/)
        assert.notInclude(redis.stderr, "s3cret")
      }),
    180_000
  )

  it.effect(
    "a failed run keeps its cause (SQL state and message) in --json, the log and the events; exit 1",
    () =>
      Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        yield* resetBuilds
        // The server refuses the repair mid-run (start-up checks pass): its own words must reach the operator.
        yield* sql`INSERT INTO ci_builds (id, project_id, status, created_at, updated_at)
        VALUES (1, 1, 'canceling', now() - interval '2 hours', now() - interval '2 hours')`
        yield* sql.unsafe(`CREATE FUNCTION refuse_build_updates() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN RAISE EXCEPTION 'relation "ci_builds" is frozen for maintenance' USING ERRCODE = '55000'; END $$`)
        yield* sql.unsafe(
          `CREATE TRIGGER refuse_build_updates BEFORE UPDATE ON ci_builds FOR EACH ROW EXECUTE FUNCTION refuse_build_updates()`
        )
        const result = yield* sweeper(["run", "drop-canceling-builds", "--json"]).pipe(
          Effect.ensuring(
            sql.unsafe(`DROP TRIGGER refuse_build_updates ON ci_builds`).pipe(
              Effect.andThen(sql.unsafe(`DROP FUNCTION refuse_build_updates()`)),
              Effect.orDie
            )
          )
        )
        assert.strictEqual(result.code, 1, result.stderr)
        const output = JSON.parse(result.stdout)
        assert.strictEqual(output.outcome, "failed")
        assert.include(output.error, "SqlError")
        assert.include(output.error, "relation \"ci_builds\" is frozen for maintenance")
        assert.include(output.error, "SQLSTATE 55000")
        assert.include(result.stderr, "relation \\\"ci_builds\\\" is frozen for maintenance")

        const events = yield* sweeper(["events", "--type", "RunFinished", "--json"])
        const finished = events.stdout.trim().split("\n").map((l) => JSON.parse(l))
        assert.include(finished.at(-1).data.error, "relation \"ci_builds\" is frozen for maintenance")
      }),
    180_000
  )

  it.effect(
    "--now T judges thresholds at exactly T and writes the real time; a future T needs --dry-run",
    () =>
      Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        yield* resetBuilds
        const t = Date.parse(T)
        // Build 1 is one millisecond past the one-hour threshold at T; build 2 is exactly at it (not stuck).
        yield* sql`INSERT INTO ci_builds (id, project_id, status, created_at, updated_at) VALUES
        (1, 1, 'canceling', ${new Date(t - HOUR - 1)}, ${new Date(t - HOUR - 1)}),
        (2, 1, 'canceling', ${new Date(t - HOUR)}, ${new Date(t - HOUR)})`

        const dry = yield* sweeper(["run", "drop-canceling-builds", "--json", "--dry-run", "--now", T])
        assert.strictEqual(dry.code, 0, dry.stderr)
        const planned = JSON.parse(dry.stdout)
        assert.strictEqual(planned.dryRun, true)
        assert.deepStrictEqual(planned.targets, ["build:1"])
        assert.strictEqual(planned.targetsTotal, 1)
        assert.include(dry.stderr, "\"dry_run\":true")

        const before = Date.now()
        const real = yield* sweeper(["run", "drop-canceling-builds", "--json", "--now", T])
        assert.strictEqual(real.code, 0, real.stderr)
        assert.strictEqual(JSON.parse(real.stdout).dryRun, false)
        assert.deepStrictEqual(JSON.parse(real.stdout).summary, {
          dropped: 1,
          doomed: 0,
          batches: 1,
          skippedLocked: 0,
          heldMs: 0,
          heldBy: []
        })
        const rows = yield* sql<
          { id: string; status: string; updated_at: Date }
        >`SELECT id::text AS id, status, updated_at FROM ci_builds ORDER BY id`
        assert.deepStrictEqual(rows.map((r) => [r.id, r.status]), [["1", "failed"], ["2", "canceling"]])
        assert.isAtLeast(rows[0]!.updated_at.getTime(), before - 5_000, "written with the real clock, not T")
        const dropped = yield* sql<
          { occurred_at: Date }
        >`SELECT occurred_at FROM sweeper_events WHERE type = 'BuildDropped'`
        assert.isAtLeast(dropped[0]!.occurred_at.getTime(), before - 5_000, "event time is the real clock")

        const future = new Date(Date.now() + 24 * HOUR).toISOString()
        const refused = yield* sweeper(["run", "drop-canceling-builds", "--now", future])
        assert.strictEqual(refused.code, 2)
        assert.include(errorLines(refused.stderr)[0], "in the future")
        const allowed = yield* sweeper(["run", "drop-canceling-builds", "--now", future, "--dry-run", "--json"])
        assert.strictEqual(allowed.code, 0, allowed.stderr)
      }),
    180_000
  )

  it.effect(
    "durations in both spellings; a disabled batch is refused without --force and shown as disabled",
    () =>
      Effect.gen(function*() {
        yield* resetBuilds
        const both = yield* sweeper(["run", "drop-canceling-builds", "--json", "--budget", "30 seconds"])
        assert.strictEqual(both.code, 0, both.stderr)
        const short = yield* sweeper(["run", "drop-canceling-builds", "--json", "--budget", "30s"])
        assert.strictEqual(short.code, 0, short.stderr)

        const disabled = { SWEEPER_DISABLED_BATCHES: "drop-canceling-builds" }
        const refused = yield* sweeper(["run", "drop-canceling-builds"], disabled)
        assert.strictEqual(refused.code, 2)
        assert.include(errorLines(refused.stderr)[0], "disabled")
        const forced = yield* sweeper(["run", "drop-canceling-builds", "--force", "--json"], disabled)
        assert.strictEqual(forced.code, 0, forced.stderr)

        const status = yield* sweeper(["status", "--json"], disabled)
        const views = JSON.parse(status.stdout) as Array<{ name: string; state: string; nextTick: string | null }>
        const drop = views.find((v) => v.name === "drop-canceling-builds")!
        assert.strictEqual(drop.state, "disabled")
        assert.isNull(drop.nextTick)
      }),
    180_000
  )

  it.effect("pause and resume; status has headers, the schedule in words and who paused", () =>
    Effect.gen(function*() {
      const paused = yield* sweeper(["pause", "stuck-export-jobs"])
      assert.strictEqual(paused.code, 0, paused.stderr)
      const status = yield* sweeper(["status"])
      assert.strictEqual(status.code, 0, status.stderr)
      const lines = status.stdout.split("\n")
      assert.match(lines[0]!, /^BATCH\s+STATE\s+SCHEDULE\s+NEXT TICK\s+LAST RUN\s+OUTCOME\s+FAILURES$/)
      assert.match(status.stdout, /stuck-export-jobs\s+paused by cli:\S+ at \d{4}-/)
      assert.match(status.stdout, /delete-stale-direct-uploads\s+idle\s+every 6 minutes \(UTC\)/)
      const json = JSON.parse((yield* sweeper(["status", "--json"])).stdout) as Array<
        { name: string; state: string; nextTick: string | null }
      >
      assert.isNull(json.find((v) => v.name === "stuck-export-jobs")!.nextTick, "a paused batch has no next tick")

      assert.strictEqual((yield* sweeper(["resume", "stuck-export-jobs"])).code, 0)
      const resumed = JSON.parse((yield* sweeper(["status", "--json"])).stdout) as Array<
        { name: string; state: string }
      >
      assert.strictEqual(resumed.find((v) => v.name === "stuck-export-jobs")!.state, "idle")
      assert.strictEqual((yield* sweeper(["pause", "nope"])).code, 2)
    }), 180_000)
})
