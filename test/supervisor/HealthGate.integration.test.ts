/**
 * The health gate's promise, end to end: Sweeper pointed at a primary whose streaming standby is
 * behind (replay paused, tens of MB of WAL unreplayed) runs `sweeper run drop-canceling-builds`
 * with SWEEPER_HEALTH's replicationLag; it holds at the threshold — nothing dropped while held —
 * and, once replay resumes and the standby catches up, releases and finishes: every stuck build
 * dropped exactly once, one RepairHeld and one RepairReleased in the batch's stream.
 *
 * Real parts only: a private primary + standby (test/support/pgStandby.ts), the shared test
 * Redis, the real CLI and supervisor as child processes. While held, `sweeper status`, the
 * supervisor's `/api/health` and its dashboard say what holds which batch.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, layer } from "@effect/vitest"
import { Context, Effect, Layer, Redacted } from "effect"
import { seedStuckCancelingBuilds } from "../../src/simulator/Fixtures.ts"
import { runCli } from "../support/cli.ts"
import { type ReplicatedPostgres, replicatedPostgres } from "../support/pgStandby.ts"
import { startSweeper, waitFor } from "../support/processes.ts"
import { freshRedisUrl } from "../support/redis.ts"

const STUCK = 3000
const DATABASE = "sweeper_health_e2e"
const TOKEN = "health-e2e-token"
const OTHER_BATCHES =
  "stuck-export-jobs,delete-stale-direct-uploads,reschedule-stuck-issue-rebalances,concurrency-limit-resume,prune-events," +
  "drop-pending-builds,drop-running-builds,drop-scheduled-builds"
// One database (no CI_DATABASE_URL): main, named in every line, event and metric of a PostgreSQL signal.
const HOLD_LINE = /drop-canceling-builds held by replicationLag on main: \d+(\.\d+)? MB > 32 MB since \d\d:\d\d:\d\d/
const HEALTH = JSON.stringify({ replicationLag: { stop: "32MB", resume: "1MB" } })

class Setup extends Context.Service<Setup, { readonly pair: ReplicatedPostgres; readonly redisUrl: string }>()(
  "test/HealthGateE2E/Setup"
) {}
const SetupLive = Layer.effect(
  Setup,
  Effect.gen(function*() {
    const pair = yield* replicatedPostgres
    const redisUrl = yield* freshRedisUrl
    return { pair, redisUrl }
  })
)

const count = async (pair: ReplicatedPostgres, sql: string, database = DATABASE) =>
  Number((await pair.primary(sql, database))[0]?.[0] ?? Number.NaN)

/** A database on the primary, migrated, with STUCK builds stuck in canceling; then the standby 40 MB behind. */
const prepare = (pair: ReplicatedPostgres, database: string, env: Record<string, string>) =>
  Effect.gen(function*() {
    yield* Effect.promise(() => pair.primary(`CREATE DATABASE ${database}`))
    const migrated = yield* Effect.promise(() => runCli(["migrate"], env))
    assert.strictEqual(migrated.code, 0, migrated.stderr)
    yield* seedStuckCancelingBuilds(STUCK).pipe(
      Effect.provide(PgClient.layer({ url: Redacted.make(pair.urlOf(database)) }))
    )
    // The standby stops replaying; 40 MB of WAL later it is well past the 32 MB stop.
    yield* Effect.promise(() => pair.pauseReplay())
    yield* Effect.promise(() =>
      pair.primary(
        `CREATE TABLE filler (pad text); INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 40000)`,
        database
      )
    )
    assert.isAbove(yield* Effect.promise(() => pair.lagBytes()), 40_000_000)
  })

layer(SetupLive, { excludeTestServices: true, timeout: "360 seconds" })(
  "health gate end to end (primary + lagging standby, CLI)",
  (it) => {
    it.effect("drop-canceling-builds holds while the standby is behind and finishes once it catches up, each build dropped once", () =>
      Effect.gen(function*() {
        const { pair, redisUrl } = yield* Setup
        const env = { DATABASE_URL: pair.urlOf(DATABASE), REDIS_URL: redisUrl, SWEEPER_HEALTH: HEALTH }
        yield* prepare(pair, DATABASE, env)

        const run = runCli(["run", "drop-canceling-builds", "--json"], env, 100_000)
        const held = yield* Effect.promise(() =>
          waitFor(
            "RepairHeld",
            async () =>
              (await count(pair, "SELECT count(*) FROM sweeper_events WHERE type = 'RepairHeld'")) > 0
                ? true
                : undefined,
            30_000
          )
        )
        assert.isTrue(held)
        // Held: two re-checks later, still nothing dropped.
        yield* Effect.sleep("2500 millis")
        assert.strictEqual(
          yield* Effect.promise(() => count(pair, "SELECT count(*) FROM ci_builds WHERE status = 'failed'")),
          0
        )
        assert.strictEqual(
          yield* Effect.promise(() => count(pair, "SELECT count(*) FROM sweeper_events WHERE type = 'RepairReleased'")),
          0
        )
        // `sweeper status` (another process, reading the event log) says what holds the batch.
        const status = yield* Effect.promise(() => runCli(["status"], env))
        assert.strictEqual(status.code, 0, status.stderr)
        assert.match(status.stdout, HOLD_LINE)
        const statusJson = yield* Effect.promise(() => runCli(["status", "--json"], env))
        const views = JSON.parse(statusJson.stdout) as ReadonlyArray<{ name: string; holds: ReadonlyArray<string> }>
        assert.match(views.find((v) => v.name === "drop-canceling-builds")!.holds[0]!, HOLD_LINE)
        assert.deepStrictEqual(views.find((v) => v.name === "stuck-export-jobs")!.holds, [])

        yield* Effect.promise(() => pair.resumeReplay())
        const result = yield* Effect.promise(() => run)
        assert.strictEqual(result.code, 0, `${result.stderr}\n${result.stdout}`)
        const finished = JSON.parse(result.stdout.trim().split("\n").at(-1)!) as {
          outcome: string
          summary: { dropped: number }
        }
        assert.strictEqual(finished.outcome, "succeeded")
        assert.strictEqual(finished.summary.dropped, STUCK)

        // Every build dropped exactly once.
        assert.strictEqual(
          yield* Effect.promise(() => count(pair, "SELECT count(*) FROM ci_builds WHERE status = 'failed'")),
          STUCK
        )
        const [dropped, distinct] = (yield* Effect.promise(() =>
          pair.primary(
            "SELECT count(*), count(DISTINCT stream) FROM sweeper_events WHERE type = 'BuildDropped'",
            DATABASE
          )
        ))[0]!
        assert.deepStrictEqual([Number(dropped), Number(distinct)], [STUCK, STUCK])

        // One hold, one pair, beside the batch's stream (never in the one its state is folded from), the held value past the threshold.
        const gateEvents = yield* Effect.promise(() =>
          pair.primary(
            "SELECT type, stream, data::text, run_id IS NOT NULL FROM sweeper_events WHERE type IN ('RepairHeld', 'RepairReleased') ORDER BY id",
            DATABASE
          )
        )
        assert.deepStrictEqual(gateEvents.map((row) => [row[0], row[1], row[3]]), [
          ["RepairHeld", "batch:drop-canceling-builds:health", "t"],
          ["RepairReleased", "batch:drop-canceling-builds:health", "t"]
        ])
        const heldData = JSON.parse(gateEvents[0]![2]!) as {
          signal: string
          value: number
          threshold: number
          database: string
        }
        assert.strictEqual(heldData.signal, "replicationLag")
        assert.strictEqual(heldData.database, "main")
        assert.strictEqual(heldData.threshold, 32_000_000)
        assert.isAbove(heldData.value, 32_000_000)
        const releasedData = JSON.parse(gateEvents[1]![2]!) as { heldMs: number; reason?: string }
        assert.isAtLeast(releasedData.heldMs, 2500)
        assert.isUndefined(releasedData.reason)
        // Released: status no longer shows a hold.
        assert.notMatch((yield* Effect.promise(() => runCli(["status"], env))).stdout, /held by/)
      }))

    it.effect("the supervisor's /api/health and dashboard show the hold while it lasts", () =>
      Effect.gen(function*() {
        const { pair, redisUrl } = yield* Setup
        const database = `${DATABASE}_supervisor`
        const env = {
          DATABASE_URL: pair.urlOf(database),
          REDIS_URL: redisUrl,
          SWEEPER_HEALTH: HEALTH,
          SWEEPER_API_TOKEN: TOKEN,
          // Only drop-canceling-builds, and only when asked (force): no cron tick interferes.
          SWEEPER_DISABLED_BATCHES: `drop-canceling-builds,${OTHER_BATCHES}`
        }
        yield* prepare(pair, database, env)
        const supervisor = startSweeper("health-e2e", env)
        try {
          const url = yield* Effect.promise(() => supervisor.listening)
          const health = () =>
            fetch(`${url}/api/health`).then((r) => r.json()) as Promise<{
              configured: boolean
              signals: ReadonlyArray<
                { signal: string; database: string; state: string; value: number; stop: string; resume: string }
              >
              holds: ReadonlyArray<{ batch: string; signal: string; text: string }>
            }>
          const before = yield* Effect.promise(health)
          assert.isTrue(before.configured)
          assert.deepStrictEqual(before.signals.map((s) => [s.signal, s.database, s.state, s.stop, s.resume]), [[
            "replicationLag",
            "main",
            "over",
            "32 MB",
            "1 MB"
          ]])
          assert.isAbove(before.signals[0]!.value, 40_000_000)
          assert.deepStrictEqual(before.holds, [])

          const run = fetch(`${url}/api/batches/drop-canceling-builds/run`, {
            method: "POST",
            headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" },
            body: JSON.stringify({ force: true })
          }).then((r) => r.json() as Promise<{ outcome: string; summary: { dropped: number } }>)
          // A failed assertion below stops the supervisor under it: that rejection is not the news.
          run.catch(() => {})
          const held = yield* Effect.promise(() =>
            waitFor("a hold on /api/health", async () => (await health()).holds[0], 30_000)
          )
          assert.strictEqual(held.batch, "drop-canceling-builds")
          assert.match(held.text, HOLD_LINE)
          // The page escapes ">" as HTML does.
          const dashboard = (yield* Effect.promise(() => fetch(`${url}/`).then((r) => r.text()))).replaceAll(
            "&gt;",
            ">"
          )
          assert.match(dashboard, HOLD_LINE)
          assert.include(dashboard, "Held by the health gate")
          const metrics = yield* Effect.promise(() => fetch(`${url}/metrics`).then((r) => r.text()))
          assert.include(
            metrics,
            `sweeper_repair_held{batch="drop-canceling-builds",signal="replicationLag",database="main"} 1`
          )
          assert.match(metrics, /sweeper_health_signal\{signal="replicationLag",database="main"\} \d/)

          yield* Effect.promise(() => pair.resumeReplay())
          const finished = yield* Effect.promise(() => run)
          assert.strictEqual(finished.outcome, "succeeded")
          assert.strictEqual(finished.summary.dropped, STUCK)
          const after = yield* Effect.promise(health)
          assert.deepStrictEqual(after.holds, [])
          assert.notInclude(
            yield* Effect.promise(() => fetch(`${url}/`).then((r) => r.text())),
            "Held by the health gate"
          )
        } finally {
          supervisor.child.kill("SIGTERM")
          yield* Effect.promise(() => supervisor.exited)
        }
      }))

    it.effect("sweeper doctor says which signals this database lets Sweeper read, and what each reads now", () =>
      Effect.gen(function*() {
        const { pair, redisUrl } = yield* Setup
        const database = `${DATABASE}_doctor`
        const asPostgres = { DATABASE_URL: pair.urlOf(database), REDIS_URL: redisUrl }
        yield* Effect.promise(() => pair.primary(`CREATE DATABASE ${database}`))
        assert.strictEqual((yield* Effect.promise(() => runCli(["migrate"], asPostgres))).code, 0)
        const superuser = yield* Effect.promise(() => runCli(["doctor"], asPostgres))
        assert.match(superuser.stdout, /Health signals as role postgres: superuser/)
        assert.match(superuser.stdout, /replicationLag\s+readable\s+1 standby; largest replay lag/)
        assert.match(superuser.stdout, /longTransactions\s+readable/)
        // The shared test Redis has no maxmemory: unreadable, but not configured, so not a problem.
        assert.match(superuser.stdout, /redisMemory\s+UNREADABLE\s+sharedState: maxmemory is 0/)
        assert.strictEqual(superuser.code, 0, superuser.stdout)

        // A role with what the batches need on the tables (doctor counts a missing UPDATE as a
        // problem of its own) but not other backends' statistics.
        yield* Effect.promise(() =>
          pair.primary(
            `DROP ROLE IF EXISTS sweeper_doctor; CREATE ROLE sweeper_doctor LOGIN; GRANT SELECT, UPDATE ON ALL TABLES IN SCHEMA public TO sweeper_doctor`,
            database
          )
        )
        const asRole = {
          ...asPostgres,
          DATABASE_URL: pair.urlOf(database).replace("postgres://postgres@", "postgres://sweeper_doctor@"),
          SWEEPER_HEALTH: HEALTH
        }
        const limited = yield* Effect.promise(() => runCli(["doctor", "--json"], asRole))
        const report = JSON.parse(limited.stdout) as {
          ok: boolean
          problems: ReadonlyArray<string>
          health: {
            readAllStats: boolean
            signals: ReadonlyArray<{ signal: string; readable: boolean; configured: boolean; reading: string }>
          }
        }
        assert.isFalse(report.health.readAllStats)
        const lag = report.health.signals.find((s) => s.signal === "replicationLag")!
        assert.deepStrictEqual([lag.configured, lag.readable], [true, false])
        assert.include(lag.reading, "pg_monitor")
        assert.isFalse(report.ok, "a configured signal that cannot be read is a problem")
        assert.include(report.problems.join("\n"), "SWEEPER_HEALTH replicationLag cannot be read")
        assert.strictEqual(limited.code, 1)

        yield* Effect.promise(() => pair.primary("GRANT pg_monitor TO sweeper_doctor", database))
        const granted = JSON.parse(
          (yield* Effect.promise(() => runCli(["doctor", "--json"], asRole))).stdout
        ) as typeof report
        assert.isTrue(granted.health.readAllStats)
        assert.isTrue(granted.health.signals.find((s) => s.signal === "replicationLag")!.readable)
        assert.isTrue(granted.ok, granted.problems.join("\n"))
      }))

    it.effect("a budget that ends while held: the run ends succeeded with nothing dropped, the hold closed with reason budget", () =>
      Effect.gen(function*() {
        const { pair, redisUrl } = yield* Setup
        const database = `${DATABASE}_budget`
        const env = { DATABASE_URL: pair.urlOf(database), REDIS_URL: redisUrl, SWEEPER_HEALTH: HEALTH }
        yield* prepare(pair, database, env)
        try {
          const result = yield* Effect.promise(() =>
            runCli(["run", "drop-canceling-builds", "--json", "--budget", "3s"], env)
          )
          assert.strictEqual(result.code, 0, result.stderr)
          const finished = JSON.parse(result.stdout.trim().split("\n").at(-1)!) as {
            outcome: string
            summary: { dropped: number }
          }
          assert.strictEqual(
            finished.outcome,
            "succeeded",
            "held to the end of its budget is not a failure: the next tick carries on"
          )
          assert.strictEqual(finished.summary.dropped, 0)
          const rows = yield* Effect.promise(() =>
            pair.primary(
              "SELECT type, data->>'reason' FROM sweeper_events WHERE type IN ('RepairHeld', 'RepairReleased') ORDER BY id",
              database
            )
          )
          assert.deepStrictEqual(rows, [["RepairHeld", ""], ["RepairReleased", "budget"]])
        } finally {
          yield* Effect.promise(() => pair.resumeReplay())
        }
      }))
  }
)
