/**
 * A decomposed GitLab: the real CLI with DATABASE_URL (main) and CI_DATABASE_URL (ci), two real
 * PostgreSQL databases. Migrations put each platform table in the database GitLab keeps it in,
 * drop-canceling-builds fails builds in ci and records their events in main's ledger, and a kill -9
 * between the ci write and its event in main — before main's commit, and after it but before the
 * outbox is cleared — loses and doubles nothing when the batch runs again.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Layer, Redacted } from "effect"
import { Redis as IORedis } from "ioredis"
import { layerServer } from "../../src/layers/postgres/Postgres.ts"
import { seedStuckCancelingBuilds } from "../../src/simulator/Fixtures.ts"
import { runCli } from "../support/cli.ts"
import { assertLedgerOrder, blockRepairEvents, holdAdvisory, refuseRepairEvents } from "../support/decomposed.ts"
import { createGitLabSchema, lockWritesOfOthers } from "../support/gitlabSchema.ts"
import { freshDatabase } from "../support/postgres.ts"
import { startSweeper, waitFor } from "../support/processes.ts"
import { freshRedisUrl } from "../support/redis.ts"

const STUCK = 300

/** Two fresh databases (main, ci) and a Redis db, migrated by the CLI as an operator would. */
const decomposed = Effect.gen(function*() {
  const main = yield* freshDatabase
  const ci = yield* freshDatabase
  const redis = yield* freshRedisUrl
  const env = {
    DATABASE_URL: main.url,
    CI_DATABASE_URL: ci.url,
    REDIS_URL: redis,
    SWEEPER_DROP_BATCH_SIZE: "50",
    // A killed run's lease lapses in seconds, so the rerun need not wait out the default TTL.
    SWEEPER_LEASE_TTL_DROP_CANCELING_BUILDS: "3 seconds"
  }
  const migrated = yield* Effect.promise(() => runCli(["migrate"], env))
  assert.strictEqual(migrated.code, 0, migrated.stderr)
  const mainSql = yield* clientOf(main.url)
  const ciSql = yield* clientOf(ci.url)
  return { env, main: mainSql, ci: ciSql }
})

const clientOf = (url: string) =>
  Effect.map(Layer.build(layerServer(Redacted.make(url))), (context) => Context.get(context, PgClient.PgClient)).pipe(
    Effect.orDie
  )

const count = (sql: PgClient.PgClient, query: string) =>
  Effect.map(sql.unsafe<{ n: string }>(query), (rows) => Number(rows[0]!.n))

const tablesOf = (sql: PgClient.PgClient) =>
  Effect.map(
    sql<{ name: string }>`SELECT table_name AS name FROM information_schema.tables WHERE table_schema = 'public'`,
    (rows) => new Set(rows.map((row) => row.name))
  )

/** Every stuck build failed exactly once, with exactly one BuildDropped each in main, nothing left over. */
const assertExactlyOnce = (db: { main: PgClient.PgClient; ci: PgClient.PgClient }) =>
  Effect.gen(function*() {
    assert.strictEqual(yield* count(db.ci, `SELECT count(*) AS n FROM ci_builds WHERE status = 'failed'`), STUCK)
    assert.strictEqual(
      yield* count(db.ci, `SELECT count(*) AS n FROM ci_builds WHERE status = 'failed' AND lock_version <> 1`),
      0
    )
    const perBuild = yield* db.main<{ stream: string; n: string }>`
      SELECT stream, count(*) AS n FROM sweeper_events WHERE type = 'BuildDropped' GROUP BY stream`
    assert.strictEqual(perBuild.length, STUCK)
    assert.deepStrictEqual([...new Set(perBuild.map((row) => Number(row.n)))], [1])
    assert.strictEqual(yield* count(db.ci, "SELECT count(*) AS n FROM sweeper_outbox"), 0)
    assert.strictEqual(yield* count(db.main, "SELECT count(*) AS n FROM sweeper_relayed"), 0)
  })

/**
 * Makes a DELETE on `table` wait on an advisory lock the test holds: the relay stops right there,
 * the writes before it committed, the ones after it not yet made. Returns the trigger's removal.
 */
const blockAt = (sql: PgClient.PgClient, table: string, key: number) =>
  Effect.gen(function*() {
    yield* sql.unsafe(`CREATE FUNCTION test_block_delete() RETURNS trigger LANGUAGE plpgsql AS
      $$ BEGIN PERFORM pg_advisory_xact_lock_shared(${key}); RETURN NULL; END $$`)
    yield* sql.unsafe(`CREATE TRIGGER test_block BEFORE DELETE ON ${table}
      FOR EACH STATEMENT EXECUTE FUNCTION test_block_delete()`)
    return sql.unsafe(`DROP TRIGGER test_block ON ${table}`).pipe(Effect.asVoid, Effect.orDie)
  })

const runBatch = (env: Record<string, string>) =>
  Effect.promise(() => runCli(["run", "drop-canceling-builds", "--json"], env, 120_000))

describe("decomposed GitLab: main and ci databases", () => {
  it.live(
    "migrations put each table in its database; a run repairs ci and records in main",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const db = yield* decomposed
        const [mainTables, ciTables] = [yield* tablesOf(db.main), yield* tablesOf(db.ci)]
        for (const table of ["ci_builds"]) {
          assert.isTrue(ciTables.has(table), `${table} in ci`)
          assert.isFalse(mainTables.has(table), `${table} not in main`)
        }
        for (const table of ["project_export_jobs", "projects", "namespaces", "sweeper_events", "sweeper_relayed"]) {
          assert.isTrue(mainTables.has(table), `${table} in main`)
          assert.isFalse(ciTables.has(table), `${table} not in ci`)
        }
        for (const table of ["sweeper_outbox", "sweeper_lease_fences"]) assert.isTrue(ciTables.has(table), table)

        yield* seedStuckCancelingBuilds(STUCK).pipe(Effect.provideService(PgClient.PgClient, db.ci))
        // Outside the criteria: canceling but recent.
        yield* db.ci`INSERT INTO ci_builds (project_id, status, created_at, updated_at)
        SELECT 1, 'canceling', now() AT TIME ZONE 'UTC', now() AT TIME ZONE 'UTC' FROM generate_series(1, 20)`
        const run = yield* runBatch(db.env)
        assert.strictEqual(run.code, 0, run.stderr)
        const output = JSON.parse(run.stdout.trim()) as { outcome: string; summary: { dropped: number } }
        assert.strictEqual(output.outcome, "succeeded")
        assert.strictEqual(output.summary.dropped, STUCK)
        yield* assertExactlyOnce(db)
        assert.strictEqual(yield* count(db.ci, `SELECT count(*) AS n FROM ci_builds WHERE status = 'canceling'`), 20)
        // The run's own events are in main, in order: RunStarted, the drops, RunFinished.
        const types = yield* db.main<{ type: string }>`SELECT type FROM sweeper_events
        WHERE stream = 'batch:drop-canceling-builds' ORDER BY id`
        assert.deepStrictEqual(types.map((row) => row.type), ["RunStarted", "RunFinished"])
      })),
    { timeout: 180_000 }
  )

  for (const crash of ["before main commits the events", "after main commits, before ci clears its outbox"] as const) {
    it.live(`kill -9 ${crash}: the rerun loses and doubles nothing`, () =>
      Effect.scoped(Effect.gen(function*() {
        const db = yield* decomposed
        yield* seedStuckCancelingBuilds(STUCK).pipe(Effect.provideService(PgClient.PgClient, db.ci))
        const key = 4242
        const before = crash === "before main commits the events"
        const url = before ? db.env.DATABASE_URL : db.env.CI_DATABASE_URL
        const unblock = before ? yield* blockRepairEvents(db.main, key) : yield* blockAt(db.ci, "sweeper_outbox", key)
        const release = yield* holdAdvisory(url, key)

        const child = startSweeper("decomposed-kill", db.env, ["run", "drop-canceling-builds", "--json"])
        // The first page is written in ci (builds failed, events in the outbox) and the relay is stuck.
        yield* Effect.promise(() =>
          waitFor(
            "the relay to stop at the block",
            async () => {
              const failed = await Effect.runPromise(
                count(db.ci, "SELECT count(*) AS n FROM ci_builds WHERE status = 'failed'")
              )
              const waiting = await Effect.runPromise(
                count(db.main, "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
                  .pipe(Effect.zipWith(
                    count(db.ci, "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"),
                    (a, b) => a + b
                  ))
              )
              return failed > 0 && waiting > 0 ? true : undefined
            },
            60_000,
            50
          )
        )
        // The relay runs beside the pages, which go on meanwhile: every failed build's event is still
        // in ci's outbox, and main has none of them, or the first round's. Main is read first (its
        // count only grows with ci's), and ci's two counts in one statement: one snapshot, so a page
        // committing between them cannot tell them apart.
        const relayed = yield* count(db.main, "SELECT count(*) AS n FROM sweeper_events WHERE type = 'BuildDropped'")
        const [ci] = yield* db.ci<{ waiting: string; failed: string }>`SELECT
          (SELECT count(*) FROM sweeper_outbox) AS waiting,
          (SELECT count(*) FROM ci_builds WHERE status = 'failed') AS failed`
        child.child.kill("SIGKILL")
        yield* Effect.promise(() => child.exited)
        const waiting = Number(ci!.waiting)
        const failed = Number(ci!.failed)
        if (before) assert.strictEqual(relayed, 0, "main's events at the kill")
        else assert.isAtLeast(relayed, 50, "main's events at the kill")
        assert.isAtMost(relayed, failed)
        assert.strictEqual(waiting, failed, "every failed build's event in ci's outbox at the kill")
        yield* release
        yield* unblock

        // The killed run's lease lapses; the rerun takes it over as a later process would.
        yield* Effect.sleep("3500 millis")
        const rerun = yield* runBatch(db.env)
        assert.strictEqual(rerun.code, 0, rerun.stderr)
        yield* Effect.promise(() =>
          waitFor(
            "the killed run's events closed",
            () =>
              Effect.runPromise(count(db.main, "SELECT count(*) AS n FROM sweeper_owed_runs")).then((n) =>
                n === 0 || undefined
              ),
            30_000
          )
        )
        yield* assertExactlyOnce(db)
        yield* assertLedgerOrder(db.main)
      })), { timeout: 180_000 })
  }

  it.live(
    "a relay main refuses: the run counts every drop, the events wait in ci and reach main once it accepts",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const db = yield* decomposed
        yield* seedStuckCancelingBuilds(STUCK).pipe(Effect.provideService(PgClient.PgClient, db.ci))
        // Main refuses the relay's statement (as a full disk or a revoked grant would) until the test lifts it.
        const lift = yield* refuseRepairEvents(db.main)

        const supervisor = startSweeper("decomposed-relay", {
          ...db.env,
          SWEEPER_CRON_DROP_CANCELING_BUILDS: "*/2 * * * * *"
        })
        yield* Effect.addFinalizer(() =>
          Effect.promise(() => {
            supervisor.child.kill("SIGTERM")
            return supervisor.exited
          })
        )
        const summary = yield* Effect.promise(() =>
          waitFor(
            "a drop-canceling run that has finished",
            () =>
              Effect.runPromise(
                db.main<{ data: { outcome: string; summary: { dropped: number } } }>`SELECT data FROM sweeper_events
                WHERE type = 'RunFinished' AND stream = 'batch:drop-canceling-builds' ORDER BY id LIMIT 1`
              ).then((rows) => rows[0]?.data),
            90_000,
            200
          )
        )
        // The run succeeded and counted what it did in ci; its events wait in ci's outbox.
        assert.strictEqual(summary.outcome, "succeeded", JSON.stringify(summary))
        assert.strictEqual(summary.summary.dropped, STUCK)
        assert.strictEqual(yield* count(db.ci, "SELECT count(*) AS n FROM ci_builds WHERE status = 'failed'"), STUCK)
        assert.strictEqual(yield* count(db.ci, "SELECT count(*) AS n FROM sweeper_outbox"), STUCK)
        assert.strictEqual(
          yield* count(db.main, "SELECT count(*) AS n FROM sweeper_events WHERE type = 'BuildDropped'"),
          0
        )
        const metrics = (url: string) => Effect.promise(() => fetch(`${url}/metrics`).then((r) => r.text()))
        const address = yield* Effect.promise(() => supervisor.listening)
        assert.match(yield* metrics(address), /^sweeper_outbox_relay_owed(\{\})? 1$/m)
        // Relays after the run's pages and then every few seconds, each refused: counted each, logged once.
        yield* Effect.promise(() =>
          waitFor(
            "a failed relay counted for as many as the run's pages",
            () =>
              Effect.runPromise(metrics(address)).then((text) => {
                const failures = Number(/^sweeper_outbox_relay_failures_total(?:\{\})? (\d+)$/m.exec(text)?.[1])
                return failures >= STUCK / 50 || undefined
              }),
            60_000
          )
        )
        assert.lengthOf(supervisor.output().match(/not yet relayed/g) ?? [], 1)

        // Main accepts again: with nothing left to repair, the relay is retried on its own.
        yield* lift
        yield* Effect.promise(() =>
          waitFor(
            "the events in main",
            () =>
              Effect.runPromise(Effect.zipWith(
                count(db.ci, "SELECT count(*) AS n FROM sweeper_outbox"),
                count(db.main, "SELECT count(*) AS n FROM sweeper_relayed"),
                (outbox, relayed) => outbox + relayed
              )).then((left) => left === 0 || undefined),
            30_000,
            200
          )
        )
        yield* assertExactlyOnce(db)
        // Its recovery logged once, right after the relay that cleared what was owed.
        yield* Effect.promise(() =>
          waitFor(
            "the relay's recovery in the log",
            async () => supervisor.output().includes("relayed from ci's outbox to main's ledger again") || undefined,
            10_000
          )
        )
        assert.match(yield* metrics(address), /^sweeper_outbox_relay_owed(\{\})? 0$/m)
        // The run's RunFinished said what it owed; RunEventsRelayed closed it after every event.
        yield* Effect.promise(() =>
          waitFor(
            "the run closed",
            () =>
              Effect.runPromise(count(db.main, "SELECT count(*) AS n FROM sweeper_owed_runs")).then((n) =>
                n === 0 || undefined
              ),
            30_000
          )
        )
        const runs = yield* assertLedgerOrder(db.main)
        assert.strictEqual(runs.find((run) => run.repairs > 0)?.owedAtFinish, STUCK)
      })),
    { timeout: 180_000 }
  )

  it.live(
    "GitLab's own layout: both databases hold every table, each copy GitLab does not use write-locked",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const [mainDb, ciDb] = [yield* freshDatabase, yield* freshDatabase]
        const redis = yield* freshRedisUrl
        const [main, ci] = [yield* clientOf(mainDb.url), yield* clientOf(ciDb.url)]
        for (const [sql, database] of [[main, "main"], [ci, "ci"]] as const) {
          yield* createGitLabSchema({ partitioned: true, runners: true }).pipe(
            Effect.provideService(PgClient.PgClient, sql)
          )
          // Stale rows in the copy this database does not use: GitLab's copies are never written.
          yield* sql`INSERT INTO p_ci_builds (id, partition_id, project_id, type, status, created_at, updated_at)
          SELECT i, 100, 1, 'Ci::Build', 'canceling', '2026-01-01', '2026-01-01' FROM generate_series(1, 40) i`
          yield* sql`INSERT INTO namespaces (id, name, path, type, organization_id) VALUES (10, 'g', 'g', 'Group', 1)`
          yield* sql`INSERT INTO projects (id, namespace_id, name, path, project_namespace_id, organization_id)
          VALUES (20, 10, 'p', 'p', 10, 1)`
          yield* sql`INSERT INTO project_export_jobs (id, project_id, jid, status, user_id, created_at, updated_at)
          SELECT g, 20, 'jid-' || g, 0, 1, '2026-01-01', '2026-01-01' FROM generate_series(1, 30) g`
          yield* lockWritesOfOthers(database).pipe(Effect.provideService(PgClient.PgClient, sql))
        }
        // Pending for over a day in ci: the stuck-builds family's outdated rule fails them.
        yield* ci`INSERT INTO p_ci_builds (id, partition_id, project_id, type, status, created_at, updated_at)
        SELECT i, 101, 20, 'Ci::Build', 'pending', '2026-01-01', '2026-01-01' FROM generate_series(1001, 1010) i`
        const env = { DATABASE_URL: mainDb.url, CI_DATABASE_URL: ciDb.url, REDIS_URL: redis }
        const migrated = yield* Effect.promise(() => runCli(["migrate"], env))
        assert.strictEqual(migrated.code, 0, migrated.stderr)
        assert.match(migrated.stdout, /gitlab mode/)

        const batches = [
          "drop-canceling-builds",
          "stuck-export-jobs",
          "drop-pending-builds",
          "drop-running-builds",
          "drop-scheduled-builds"
        ]
        for (const batch of batches) {
          const run = yield* Effect.promise(() => runCli(["run", batch, "--json"], env, 120_000))
          assert.strictEqual(run.code, 0, run.stderr)
          assert.strictEqual((JSON.parse(run.stdout.trim()) as { outcome: string }).outcome, "succeeded", run.stdout)
        }
        // ci's builds failed, main's copy untouched; main's exports failed, ci's copy untouched.
        assert.strictEqual(yield* count(ci, "SELECT count(*) AS n FROM p_ci_builds WHERE status = 'failed'"), 50)
        assert.strictEqual(yield* count(main, "SELECT count(*) AS n FROM p_ci_builds WHERE status = 'canceling'"), 40)
        assert.strictEqual(yield* count(main, "SELECT count(*) AS n FROM project_export_jobs WHERE status = 3"), 30)
        assert.strictEqual(yield* count(ci, "SELECT count(*) AS n FROM project_export_jobs WHERE status = 0"), 30)
        assert.strictEqual(
          yield* count(main, "SELECT count(*) AS n FROM sweeper_events WHERE type = 'BuildDropped'"),
          50
        )
        assert.strictEqual(yield* count(ci, "SELECT count(*) AS n FROM sweeper_outbox"), 0)
        // The drops' jobs went through ci's job outbox, beside the builds, and were relayed.
        assert.strictEqual(yield* count(ci, "SELECT count(*) AS n FROM sweeper_job_outbox_batches"), 0)
        const queued = yield* Effect.acquireUseRelease(
          Effect.sync(() => new IORedis(redis)),
          (client) => Effect.promise(() => client.lrange("queue:default", 0, -1)),
          (client) => Effect.promise(() => client.quit())
        )
        assert.strictEqual(queued.filter((job) => job.includes(`"class":"Ci::BuildFinishedWorker"`)).length, 50)
        // Sweeper's own tables in ci are only the outboxes, the fences and the migration record.
        const ciOwn = yield* ci<{ name: string }>`SELECT table_name AS name FROM information_schema.tables
        WHERE table_schema = 'public' AND table_name LIKE 'sweeper%' ORDER BY 1`
        assert.deepStrictEqual(ciOwn.map((row) => row.name), [
          "sweeper_job_outbox",
          "sweeper_job_outbox_batches",
          "sweeper_lease_fences",
          "sweeper_migrations",
          "sweeper_outbox"
        ])
      })),
    { timeout: 180_000 }
  )
})
