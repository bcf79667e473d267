/**
 * The ci outbox's relay at its edges, on two real PostgreSQL databases (main, ci) through the real
 * CLI and supervisor: a main that refuses the relay at start-up, hangs, or dies mid-run; a second
 * relay holding rows; a relay interrupted by a timeout; a ci database restored to an earlier point
 * or failed over to a standby that lost its last transactions. Each checks main's ledger as a
 * consumer reads it, by id (assertLedgerOrder), and that every event arrives exactly once.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber, Layer, Option } from "effect"
import { SqlClient } from "effect/sql"
import { Redis as IORedis } from "ioredis"
import { CurrentRun } from "../../src/domain/Batch.ts"
import { leaseKey } from "../../src/domain/Lease.ts"
import { MainDatabase } from "../../src/layers/postgres/Databases.ts"
import { OutboxRepairEvents, relayOutbox, RepairEvents } from "../../src/layers/postgres/Outbox.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { seedStuckCancelingBuilds } from "../../src/simulator/Fixtures.ts"
import {
  advisoryWaiters,
  assertLedgerOrder,
  blockRepairEvents,
  cli,
  clientOf,
  count,
  type Decomposed,
  decomposedDatabases,
  holdAdvisory,
  refuseRepairEvents,
  slowRepairEventsOf
} from "../support/decomposed.ts"
import { startSweeper, waitFor } from "../support/processes.ts"
import { startTcpProxy } from "../support/tcpProxy.ts"

const STUCK = 300
const TIMEOUT = { timeout: 300_000 }

const seed = (db: Decomposed, n = STUCK) =>
  seedStuckCancelingBuilds(n).pipe(Effect.provideService(PgClient.PgClient, db.ci))

const until = <A>(what: string, probe: () => Promise<A | undefined>, ms = 90_000, every = 200) =>
  Effect.promise(() => waitFor(what, probe, ms, every))

const probe = <A, E>(effect: Effect.Effect<A, E>) => () => Effect.runPromise(Effect.orDie(effect))

const repairEventsInMain = (db: Decomposed) =>
  count(db.main, "SELECT count(*) AS n FROM sweeper_events WHERE type = 'BuildDropped'")
const outboxRows = (db: Decomposed) => count(db.ci, "SELECT count(*) AS n FROM sweeper_outbox")

/** Every failed build's BuildDropped in main exactly once, and nothing left in ci's outbox. */
const assertEachOnce = (db: Decomposed, expected: number) =>
  Effect.gen(function*() {
    assert.strictEqual(yield* count(db.ci, "SELECT count(*) AS n FROM ci_builds WHERE status = 'failed'"), expected)
    const perBuild = yield* db.main<{ stream: string; n: string }>`
      SELECT stream, count(*) AS n FROM sweeper_events WHERE type = 'BuildDropped' GROUP BY stream`
    assert.strictEqual(perBuild.length, expected)
    assert.deepStrictEqual([...new Set(perBuild.map((row) => Number(row.n)))], expected === 0 ? [] : [1])
    assert.strictEqual(yield* outboxRows(db), 0)
  })

/** Waits until ci's outbox is empty and every run that owed events has been closed. */
const drained = (db: Decomposed) =>
  until("the outbox relayed and every owed run closed", async () => {
    const left = await Effect.runPromise(Effect.orDie(outboxRows(db)))
    if (left > 0) return undefined
    const open = await Effect.runPromise(Effect.orDie(db.main<{ n: string }>`
      SELECT count(*) AS n FROM sweeper_events f WHERE f.type = 'RunFinished' AND f.data ? 'eventsOwed'
        AND NOT EXISTS (SELECT FROM sweeper_events c WHERE c.run_id = f.run_id AND c.type = 'RunEventsRelayed')`))
    return Number(open[0]!.n) === 0 || undefined
  })

interface RunJson {
  readonly outcome: string
  readonly summary: { readonly dropped: number }
  readonly eventsOwed?: number
  readonly runFinished?: string
}

const parseRun = (stdout: string) => JSON.parse(stdout.trim()) as RunJson

/** Events left in ci's outbox by an earlier run, as a crash or an outage leaves them. */
const leftInOutbox = (db: Decomposed, n: number) =>
  db.ci`INSERT INTO sweeper_outbox (stream, type, data, run_id, occurred_at)
    SELECT 'build:' || g, 'BuildDropped', jsonb_build_object('id', g), '00000000-0000-4000-8000-000000000001',
      now() FROM generate_series(1, ${n}) g`

const metricsOf = (address: string) => Effect.promise(() => fetch(`${address}/metrics`).then((r) => r.text()))

/**
 * Until drop-canceling-builds' lease is free: released by a run that ended, or lapsed (its TTL is
 * 3 s here) after one that was killed, so the next run takes it instead of finding it held.
 */
const leaseFree = (db: Decomposed) =>
  Effect.acquireUseRelease(
    Effect.sync(() => new IORedis(db.env.REDIS_URL, { maxRetriesPerRequest: 1 })),
    (redis) =>
      until(
        "drop-canceling-builds' lease free",
        async () => (await redis.exists(leaseKey("ci/stuck_builds/drop_canceling_worker"))) === 0 || undefined,
        30_000,
        100
      ),
    (redis) => Effect.promise(() => redis.quit())
  )

describe("the ci relay at its edges", () => {
  it.live(
    "a relay main refuses at start-up fails neither run nor start: degraded, logged once, retried",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const db = yield* decomposedDatabases()
        yield* leftInOutbox(db, 3)
        const lift = yield* refuseRepairEvents(db.main)

        // A batch that never touches ci, and a ci batch with nothing to repair: each runs and succeeds.
        for (const batch of ["stuck-export-jobs", "drop-scheduled-builds"]) {
          const run = yield* cli(["run", batch, "--json"], db.env)
          assert.strictEqual(run.code, 0, run.stderr)
          assert.strictEqual(parseRun(run.stdout).outcome, "succeeded", run.stdout)
          assert.lengthOf(run.stderr.match(/not yet relayed/g) ?? [], 1, run.stderr)
          assert.notMatch(run.stderr, /\n\s+at /, "no stack trace")
        }

        const supervisor = startSweeper("relay-refused-at-start", db.env)
        yield* Effect.addFinalizer(() =>
          Effect.promise(() => {
            supervisor.child.kill("SIGTERM")
            return supervisor.exited
          })
        )
        const address = yield* Effect.promise(() => supervisor.listening)
        yield* until("the owed metric", () =>
          Effect.runPromise(metricsOf(address)).then((text) =>
            /^sweeper_outbox_relay_owed(\{\})? 1$/m.test(text) || undefined
          ))
        // Retried every few seconds (RELAY_RETRY), logged once: once it has failed again, still one line.
        const retried = /^sweeper_outbox_relay_failures_total(\{\})? ([2-9]|\d\d+)$/m
        yield* until("a retry in the background", () =>
          Effect.runPromise(metricsOf(address)).then((text) =>
            retried.test(text) || undefined
          ))
        assert.lengthOf(supervisor.output().match(/not yet relayed/g) ?? [], 1, supervisor.output())
        assert.match(yield* metricsOf(address), retried, "retried in the background")
        assert.strictEqual(yield* repairEventsInMain(db), 0)

        yield* lift
        yield* until(
          "the waiting events in main",
          probe(Effect.map(outboxRows(db), (n) =>
            n === 0 || undefined))
        )
        assert.strictEqual(yield* repairEventsInMain(db), 3)
        yield* until("the owed metric back to 0", () =>
          Effect.runPromise(metricsOf(address)).then((text) =>
            /^sweeper_outbox_relay_owed(\{\})? 0$/m.test(text) || undefined
          ))
      })),
    TIMEOUT
  )

  it.live(
    "a second relay holding rows, slowly: each run's events precede its RunFinished, in page order",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const db = yield* decomposedDatabases({ SWEEPER_DROP_BATCH_SIZE: "25" })
        yield* seed(db)
        // Another replica's relay, 0.2 s per event in main, polling without pause.
        yield* Effect.asVoid(slowRepairEventsOf(db.main, "second-relay"))
        const slowMain = yield* clientOf(`${db.mainUrl}&application_name=second-relay`)
        const second = yield* relayOutbox(db.ci, slowMain).pipe(Effect.ignore, Effect.forever, Effect.forkScoped)

        const run = yield* cli(["run", "drop-canceling-builds", "--json"], db.env)
        assert.include([0, 4], run.code, run.stderr)
        assert.strictEqual(parseRun(run.stdout).summary.dropped, STUCK)
        yield* until("every event in main", probe(Effect.map(repairEventsInMain(db), (n) => n === STUCK || undefined)))
        yield* Fiber.interrupt(second)
        // Whatever the second relay left half done, a later relay finishes.
        const later = yield* cli(["run", "stuck-export-jobs", "--json"], db.env)
        assert.strictEqual(later.code, 0, later.stderr)
        yield* drained(db)
        yield* assertEachOnce(db, STUCK)
        const runs = yield* assertLedgerOrder(db.main)
        assert.strictEqual(runs.find((r) => r.repairs > 0)?.repairs, STUCK)
      })),
    TIMEOUT
  )

  it.live(
    "a failing relay: RunFinished says how many events it owes, and RunEventsRelayed closes them",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const db = yield* decomposedDatabases()
        yield* seed(db)
        const lift = yield* refuseRepairEvents(db.main)
        const run = yield* cli(["run", "drop-canceling-builds", "--json"], db.env)
        const report = parseRun(run.stdout)
        assert.strictEqual(report.outcome, "succeeded", run.stdout)
        assert.strictEqual(report.eventsOwed, STUCK, run.stdout)
        assert.strictEqual(run.code, 4, "exit 4: the run is not fully recorded")
        const finished = yield* db.main<{ data: { eventsOwed?: number } }>`
        SELECT data FROM sweeper_events WHERE type = 'RunFinished' AND stream = 'batch:drop-canceling-builds'`
        assert.strictEqual(finished[0]?.data.eventsOwed, STUCK)

        yield* lift
        const later = yield* cli(["run", "stuck-export-jobs", "--json"], db.env)
        assert.strictEqual(later.code, 0, later.stderr)
        yield* drained(db)
        yield* assertEachOnce(db, STUCK)
        const runs = yield* assertLedgerOrder(db.main)
        assert.strictEqual(runs.find((r) => r.repairs > 0)?.owedAtFinish, STUCK)
      })),
    TIMEOUT
  )

  it.live("no ci transaction stays open while main hangs", () =>
    Effect.scoped(Effect.gen(function*() {
      const db = yield* decomposedDatabases()
      yield* seed(db)
      const key = 4343
      const unblock = yield* blockRepairEvents(db.main, key)
      const release = yield* holdAdvisory(db.mainUrl, key)
      const running = yield* cli(["run", "drop-canceling-builds", "--json"], db.env).pipe(Effect.forkScoped)
      yield* until("the relay to wait on main", probe(Effect.map(advisoryWaiters(db.main), (n) => n > 0 || undefined)))
      for (let sample = 0; sample < 10; sample++) {
        const open = yield* db.ci<{ pid: number; state: string; query: string }>`
          SELECT pid, state, query FROM pg_stat_activity
          WHERE datname = current_database() AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'`
        assert.deepStrictEqual(open, [], "a ci transaction open across the call to main")
        yield* Effect.sleep("300 millis")
      }
      yield* release
      yield* unblock
      const run = yield* Fiber.join(running)
      assert.include([0, 4], run.code, run.stderr)
      yield* drained(db)
      yield* assertEachOnce(db, STUCK)
      yield* assertLedgerOrder(db.main)
    })), TIMEOUT)

  it.live(
    "main hangs: the configured lock timeout ends the relay's wait, the run ends saying what it owes",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const db = yield* decomposedDatabases({ SWEEPER_PG_LOCK_TIMEOUT: "2 seconds" })
        yield* seed(db)
        const key = 4344
        const unblock = yield* blockRepairEvents(db.main, key)
        const release = yield* holdAdvisory(db.mainUrl, key)
        const run = yield* cli(["run", "drop-canceling-builds", "--json"], db.env, 120_000)
        assert.strictEqual(run.code, 4, run.stderr)
        const report = parseRun(run.stdout)
        assert.strictEqual(report.outcome, "succeeded")
        assert.strictEqual(report.eventsOwed, STUCK)
        yield* release
        yield* unblock
        const later = yield* cli(["run", "stuck-export-jobs", "--json"], db.env)
        assert.strictEqual(later.code, 0, later.stderr)
        yield* drained(db)
        yield* assertEachOnce(db, STUCK)
        yield* assertLedgerOrder(db.main)
      })),
    TIMEOUT
  )

  it.live(
    "main gone mid-run: the run says its events and RunFinished are owed (exit 4); they arrive in order",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const db = yield* decomposedDatabases({ SWEEPER_DROP_BATCH_SIZE: "25" })
        yield* seed(db)
        // Each page takes a moment in ci, so main can go away while the run is under way.
        yield* db.ci.unsafe(`CREATE FUNCTION test_slow_page() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN PERFORM pg_sleep(0.3); RETURN NULL; END $$`)
        yield* db.ci.unsafe(`CREATE TRIGGER test_slow_page BEFORE UPDATE ON ci_builds
        FOR EACH STATEMENT EXECUTE FUNCTION test_slow_page()`)
        const proxy = yield* Effect.promise(() => startTcpProxy(5432))
        const viaProxy = new URL(db.mainUrl)
        viaProxy.port = String(proxy.port)
        const env = { ...db.env, DATABASE_URL: viaProxy.toString() }
        const running = yield* cli(["run", "drop-canceling-builds", "--json"], env).pipe(Effect.forkScoped)
        yield* until(
          "the first pages in ci",
          probe(
            Effect.map(count(db.ci, "SELECT count(*) AS n FROM ci_builds WHERE status = 'failed'"), (n) =>
              n >= 50 || undefined)
          ),
          90_000,
          50
        )
        yield* Effect.promise(() =>
          proxy.refuse()
        )
        const run = yield* Fiber.join(running)
        const report = parseRun(run.stdout)
        assert.strictEqual(report.outcome, "succeeded", run.stdout + run.stderr)
        assert.strictEqual(report.summary.dropped, STUCK)
        assert.isAbove(report.eventsOwed ?? 0, 0, run.stdout)
        assert.strictEqual(report.runFinished, "outbox", run.stdout)
        assert.strictEqual(run.code, 4, run.stderr)

        yield* Effect.promise(() => proxy.accept())
        yield* db.ci.unsafe("DROP TRIGGER test_slow_page ON ci_builds")
        // The next run relays what waits (its RunFinished too) and does not take that run for abandoned.
        yield* leaseFree(db)
        const next = yield* cli(["run", "drop-canceling-builds", "--json"], db.env)
        assert.strictEqual(next.code, 0, next.stderr)
        yield* drained(db)
        yield* assertEachOnce(db, STUCK)
        const outcomes = yield* db.main<{ outcome: string }>`SELECT data->>'outcome' AS outcome FROM sweeper_events
        WHERE type = 'RunFinished' AND stream = 'batch:drop-canceling-builds' ORDER BY id`
        assert.deepStrictEqual(outcomes.map((row) => row.outcome), ["succeeded", "succeeded"])
        yield* assertLedgerOrder(db.main)
      })),
    TIMEOUT
  )

  it.live(
    "a relay interrupted by a timeout leaves its events owed: relayed in the background, no new commit",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const db = yield* decomposedDatabases()
        yield* leftInOutbox(db, 20)
        const key = 4345
        const unblock = yield* blockRepairEvents(db.main, key)
        const release = yield* holdAdvisory(db.mainUrl, key)
        const layer = OutboxRepairEvents({ recover: false }).pipe(
          Layer.provide(MetricsPrometheus),
          Layer.provide(Layer.mergeAll(
            Layer.succeed(PgClient.PgClient, db.ci),
            Layer.succeed(SqlClient.SqlClient, db.ci),
            Layer.succeed(MainDatabase, db.main)
          ))
        )
        yield* Effect.gen(function*() {
          const repairEvents = yield* RepairEvents
          // As the run guard's deadline interrupts a run right after a page committed.
          yield* repairEvents.committed(20).pipe(
            Effect.timeoutOption("1 second"),
            Effect.provideService(CurrentRun, {
              runId: "00000000-0000-4000-8000-000000000001",
              batch: "drop-canceling-builds",
              dryRun: false,
              budget: Option.none(),
              fence: Option.none()
            }),
            Effect.ignore
          )
          yield* release
          yield* unblock
          // Main's commit comes before ci's outbox DELETE (two databases, two commits): wait for both.
          yield* until(
            "the events in main and gone from ci's outbox, no further commit",
            probe(
              Effect.map(
                Effect.all([repairEventsInMain(db), outboxRows(db)]),
                ([inMain, left]) => (inMain === 20 && left === 0) || undefined
              )
            ),
            30_000
          )
          assert.strictEqual(yield* repairEventsInMain(db), 20)
          assert.strictEqual(yield* outboxRows(db), 0)
        }).pipe(Effect.provide(layer))
      })),
    TIMEOUT
  )

  it.live(
    "a ci restored to a point before its relay: the events it brings back are not appended twice",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const db = yield* decomposedDatabases()
        yield* seed(db, 50)
        const key = 4346
        const unblock = yield* blockRepairEvents(db.main, key)
        const release = yield* holdAdvisory(db.mainUrl, key)
        const running = yield* cli(["run", "drop-canceling-builds", "--json"], db.env).pipe(Effect.forkScoped)
        yield* until(
          "the relay to wait on main",
          probe(Effect.map(advisoryWaiters(db.main), (n) => n > 0 || undefined))
        )
        // The backup: ci's outbox as it is now, its 50 events not yet in main.
        yield* db.ci.unsafe("CREATE TABLE test_backup AS SELECT * FROM sweeper_outbox")
        yield* db.ci.unsafe("CREATE TABLE test_backup_seq AS SELECT last_value FROM sweeper_outbox_id_seq")
        assert.strictEqual(yield* count(db.ci, "SELECT count(*) AS n FROM test_backup"), 50)
        yield* release
        yield* unblock
        yield* Fiber.join(running)
        yield* drained(db)
        assert.strictEqual(yield* repairEventsInMain(db), 50)

        // Point-in-time restore of ci to the backup: the outbox rows and its sequence come back.
        yield* db.ci.unsafe("INSERT INTO sweeper_outbox SELECT * FROM test_backup")
        yield* db.ci.unsafe("SELECT setval('sweeper_outbox_id_seq', (SELECT last_value FROM test_backup_seq))")
        yield* leaseFree(db)
        const next = yield* cli(["run", "drop-canceling-builds", "--json"], db.env)
        assert.strictEqual(next.code, 0, next.stderr)
        yield* drained(db)
        yield* assertEachOnce(db, 50)
      })),
    TIMEOUT
  )

  it.live(
    "ci failed over to a standby behind the relay: new events whose ids repeat still reach main",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const token = "relay-failover-token"
        const db = yield* decomposedDatabases({
          SWEEPER_API_TOKEN: token,
          // Runs only when asked (POST …/run): no scheduled run between the steps.
          SWEEPER_CRON_DROP_CANCELING_BUILDS: "0 0 1 1 *"
        })
        // Replica B, running since before everything below (its start-up relay is behind it).
        const replica = startSweeper("relay-failover-b", db.env)
        yield* Effect.addFinalizer(() =>
          Effect.promise(() => {
            replica.child.kill("SIGTERM")
            return replica.exited
          })
        )
        const address = yield* Effect.promise(() => replica.listening)

        // Replica A relays 50 events and is killed just after clearing ci's outbox, before it could
        // forget their outbox ids in main (where a relay keeps what it has appended).
        yield* seed(db, 50)
        const key = 4347
        yield* db.main.unsafe(`CREATE FUNCTION test_block_forget() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN PERFORM pg_advisory_xact_lock_shared(${key}); RETURN OLD; END $$`)
        yield* db.main.unsafe(`CREATE TRIGGER test_block_forget BEFORE DELETE ON sweeper_relayed
        FOR EACH STATEMENT EXECUTE FUNCTION test_block_forget()`)
        const release = yield* holdAdvisory(db.mainUrl, key)
        const a = startSweeper("relay-failover-a", db.env, ["run", "drop-canceling-builds", "--json"])
        const stopped = yield* until("replica A at the forget step, or done", async () => {
          if ((await Effect.runPromise(Effect.orDie(advisoryWaiters(db.main)))) > 0) return "blocked"
          const code = await Promise.race([a.exited, new Promise((r) => setTimeout(() => r(undefined), 10))])
          return code === undefined ? undefined : "exited"
        })
        if (stopped === "blocked") {
          a.child.kill("SIGKILL")
          yield* Effect.promise(() => a.exited)
          // Its session in main dies with it (a backend waiting on a lock would not notice by itself).
          yield* db.main.unsafe(`SELECT pg_terminate_backend(l.pid) FROM pg_locks l
          JOIN pg_database d ON d.oid = l.database
          WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database()`)
        }
        yield* release
        yield* db.main.unsafe("DROP TRIGGER test_block_forget ON sweeper_relayed")
        yield* until("A's events in main", probe(Effect.map(repairEventsInMain(db), (n) => n === 50 || undefined)))

        // Failover to a standby that had not seen the outbox's last ids: they are handed out again.
        yield* db.ci.unsafe("ALTER SEQUENCE sweeper_outbox_id_seq RESTART WITH 1")
        yield* seed(db, 50)
        yield* leaseFree(db)
        const response = yield* Effect.promise(() =>
          fetch(`${address}/api/batches/drop-canceling-builds/run`, {
            method: "POST",
            headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
            body: JSON.stringify({})
          }).then(async (r) => ({ status: r.status, body: await r.text() }))
        )
        yield* drained(db)
        yield* assertEachOnce(db, 100)
        assert.strictEqual(response.status, 200, response.body)
        assert.strictEqual((JSON.parse(response.body) as RunJson).summary.dropped, 50)
      })),
    TIMEOUT
  )
})
