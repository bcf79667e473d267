/**
 * The PostgreSQL health signals read the real thing, on a private primary with a
 * streaming standby this file starts (test/support/pgStandby.ts): replay paused makes real
 * replication lag, a slowed VACUUM is a vacuum on the batch's table (and a partition's counts for
 * its parent), an open transaction on another connection is a long transaction. A role without
 * pg_monitor cannot see other backends' rows: its readings are unreadable, never "healthy".
 */
import { PgClient } from "@effect/sql-pg"
import { assert, layer } from "@effect/vitest"
import { Context, Effect, Layer, Redacted } from "effect"
import { spawn } from "node:child_process"
import type { StandbySelection } from "../../src/domain/Standbys.ts"
import { HealthSignalsLive } from "../../src/layers/health/HealthSignalsLive.ts"
import { HealthSignals, HealthStandbys, SignalUnreadable } from "../../src/services/HealthSignals.ts"
import { type ReplicatedPostgres, replicatedPostgres } from "../support/pgStandby.ts"

class Pair extends Context.Service<Pair, ReplicatedPostgres>()("test/HealthSignals/Pair") {}
const PairLive = Layer.effect(Pair, replicatedPostgres)

const signalsOn = (url: string) =>
  HealthSignalsLive.pipe(Layer.provide(PgClient.layer({ url: Redacted.make(url), maxConnections: 2 })))

const readWith = <A, E>(url: string, f: (signals: HealthSignals["Service"]) => Effect.Effect<A, E>) =>
  Effect.scoped(
    Effect.gen(function*() {
      return yield* f(yield* HealthSignals)
    }).pipe(Effect.provide(signalsOn(url)))
  )

/** As readWith, with the operator's SWEEPER_HEALTH_STANDBYS. */
const readSelecting = <A, E>(
  url: string,
  selection: StandbySelection,
  f: (signals: HealthSignals["Service"]) => Effect.Effect<A, E>
) => readWith(url, f).pipe(Effect.provideService(HealthStandbys, selection))

const sleep = (ms: number) => Effect.promise(() => new Promise((resolve) => setTimeout(resolve, ms)))

let backgrounds = 0

/**
 * Runs statements on another connection in the background (psql, one `-c` each: VACUUM refuses a
 * multi-statement string, which is one implicit transaction). The returned stop terminates its
 * backend: killing psql alone leaves a sleeping backend running until it next writes to the socket.
 */
const background = (pair: ReplicatedPostgres, statements: ReadonlyArray<string>) => {
  const name = `health-test-${process.pid}-${++backgrounds}`
  const child = spawn("psql", [
    pair.primaryUrl,
    "-X",
    "-q",
    "-v",
    "ON_ERROR_STOP=1",
    ...statements.flatMap((s) => ["-c", s])
  ], {
    stdio: "ignore",
    env: { ...process.env, PGAPPNAME: name }
  })
  return Effect.promise(async () => {
    await pair.primary(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '${name}'`)
    child.kill("SIGTERM")
  })
}

const SLOW_VACUUM = ["SET vacuum_cost_delay = 100", "SET vacuum_cost_limit = 1"]

layer(PairLive, { excludeTestServices: true, timeout: "360 seconds" })(
  "PostgreSQL health signals (primary + streaming standby)",
  (it) => {
    it.effect("replicationLag: replay paused → bytes behind the primary's WAL position; resumed → caught up", () =>
      Effect.gen(function*() {
        const pair = yield* Pair
        const caughtUp = yield* readWith(pair.primaryUrl, (s) => s.replicationLag)
        assert.strictEqual(caughtUp.standbys, 1)
        assert.isBelow(caughtUp.bytes, 1_000_000)

        yield* Effect.promise(() => pair.pauseReplay())
        yield* Effect.promise(() =>
          pair.primary(
            "CREATE TABLE IF NOT EXISTS filler (id int, pad text); INSERT INTO filler SELECT g, repeat('x', 1000) FROM generate_series(1, 8000) g"
          )
        )
        // With synchronous_commit off the WAL write position goes on moving after the INSERT returns
        // (further on a busy machine), so the signal is bracketed by a measure before and one after.
        let written = yield* Effect.promise(() => pair.lagBytes())
        for (let i = 0; i < 600 && written <= 8_000_000; i++) {
          yield* sleep(100)
          written = yield* Effect.promise(() => pair.lagBytes())
        }
        const behind = yield* readWith(pair.primaryUrl, (s) => s.replicationLag)
        const measured = yield* Effect.promise(() => pair.lagBytes())
        assert.isAbove(
          behind.bytes,
          8_000_000,
          "8000 rows of 1 kB are at least 8 MB of WAL the standby has not replayed"
        )
        assert.isAtLeast(behind.bytes, written - 200_000)
        assert.isAtMost(behind.bytes, measured + 200_000)

        yield* Effect.promise(() => pair.resumeReplay())
        let after = behind
        for (let i = 0; i < 600 && after.bytes > 100_000; i++) {
          yield* sleep(100)
          after = yield* readWith(pair.primaryUrl, (s) => s.replicationLag)
        }
        assert.isBelow(after.bytes, 100_000)
      }))

    it.effect("replicationLag watches physical standbys only: a logical subscriber far behind does not count", () =>
      Effect.gen(function*() {
        const pair = yield* Pair
        // A logical subscriber on the same server (another database; its slot made by hand, as a
        // subscription to its own cluster requires), its apply worker stalled on a lock like a CDC
        // pipeline that stopped consuming.
        yield* Effect.promise(() =>
          pair.primary("CREATE TABLE cdc_filler (pad text); CREATE PUBLICATION cdc_pub FOR TABLE cdc_filler")
        )
        yield* Effect.promise(() => pair.primary("SELECT pg_create_logical_replication_slot('cdc_sub', 'pgoutput')"))
        yield* Effect.promise(() => pair.primary("CREATE DATABASE cdc_target"))
        yield* Effect.promise(() => pair.primary("CREATE TABLE cdc_filler (pad text)", "cdc_target"))
        yield* Effect.promise(() =>
          pair.primary(
            `CREATE SUBSCRIPTION cdc_sub CONNECTION '${pair.primaryUrl}' PUBLICATION cdc_pub ` +
              `WITH (create_slot = false, slot_name = 'cdc_sub', copy_data = false)`,
            "cdc_target"
          )
        )
        const lock = spawn("psql", [
          pair.urlOf("cdc_target"),
          "-X",
          "-q",
          "-c",
          "BEGIN",
          "-c",
          "LOCK TABLE cdc_filler IN ACCESS EXCLUSIVE MODE",
          "-c",
          "SELECT pg_sleep(60)"
        ], { stdio: "ignore", env: { ...process.env, PGAPPNAME: "cdc-lock" } })
        try {
          for (let i = 0; i < 100; i++) {
            const rows = yield* Effect.promise(() => pair.primary("SELECT count(*) FROM pg_stat_replication"))
            if (rows[0]?.[0] === "2") break
            yield* sleep(100)
          }
          yield* sleep(500)
          // One row stalls the apply worker on the lock; the 8 MB after it are never acknowledged.
          yield* Effect.promise(() => pair.primary("INSERT INTO cdc_filler VALUES ('first')"))
          yield* sleep(1500)
          yield* Effect.promise(() =>
            pair.primary("INSERT INTO cdc_filler SELECT repeat('x', 1000) FROM generate_series(1, 8000)")
          )
          let lag = yield* readWith(pair.primaryUrl, (s) => s.replicationLag)
          let all = Number.NaN
          for (let i = 0; i < 100; i++) {
            const [row] = yield* Effect.promise(() =>
              pair.primary(
                "SELECT max(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn))::float8 FROM pg_stat_replication"
              )
            )
            all = Number(row?.[0])
            lag = yield* readWith(pair.primaryUrl, (s) => s.replicationLag)
            if (lag.bytes < 100_000 && all > 8_000_000) break
            yield* sleep(100)
          }
          assert.isAbove(all, 8_000_000, "the logical subscriber is far behind")
          assert.deepStrictEqual([lag.standbys, lag.bytes < 100_000], [1, true])
        } finally {
          yield* Effect.promise(() =>
            pair.primary("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'cdc-lock'")
          )
          lock.kill("SIGTERM")
          yield* Effect.promise(() => pair.primary("DROP SUBSCRIPTION cdc_sub", "cdc_target"))
        }
      }))

    it.effect("replicationLag as a duration: replay_lag grows while replay is paused and writes go on", () =>
      Effect.gen(function*() {
        const pair = yield* Pair
        yield* Effect.promise(() => pair.pauseReplay())
        try {
          for (let i = 0; i < 3; i++) {
            yield* Effect.promise(() =>
              pair.primary("CREATE TABLE IF NOT EXISTS ticks (at timestamptz); INSERT INTO ticks VALUES (now())")
            )
            yield* sleep(700)
          }
          const lag = yield* readWith(pair.primaryUrl, (s) => s.replicationLag)
          assert.isAbove(lag.seconds, 1, `replay_lag ${lag.seconds}s after ~2 s of unreplayed writes`)
        } finally {
          yield* Effect.promise(() => pair.resumeReplay())
        }
      }))

    it.effect("walPosition: advances by the WAL a write generates", () =>
      Effect.gen(function*() {
        const pair = yield* Pair
        const before = yield* readWith(pair.primaryUrl, (s) => s.walPosition)
        yield* Effect.promise(() =>
          pair.primary(
            "CREATE TABLE IF NOT EXISTS wal_burst (pad text); INSERT INTO wal_burst SELECT repeat('y', 1000) FROM generate_series(1, 4000)"
          )
        )
        // The write position reaches the INSERT's WAL only once the WAL writer has written it
        // (synchronous_commit is off): read until it has, within a minute, rather than once.
        let after = yield* readWith(pair.primaryUrl, (s) => s.walPosition)
        for (let i = 0; i < 600 && after - before <= 4_000_000; i++) {
          yield* sleep(100)
          after = yield* readWith(pair.primaryUrl, (s) => s.walPosition)
        }
        assert.isAbove(after - before, 4_000_000)
      }))

    it.effect("vacuuming: a VACUUM on a batch's table (or a partition of it) is seen; other tables are not", () =>
      Effect.gen(function*() {
        const pair = yield* Pair
        yield* Effect.promise(() =>
          pair.primary(`
          CREATE TABLE IF NOT EXISTS busy (id int, pad text) WITH (autovacuum_enabled = false);
          INSERT INTO busy SELECT g, repeat('z', 200) FROM generate_series(1, 20000) g;
          DELETE FROM busy WHERE id % 2 = 0;
          CREATE TABLE IF NOT EXISTS p_parts (id int, partition_id int, pad text) PARTITION BY LIST (partition_id);
          CREATE TABLE IF NOT EXISTS p_parts_100 PARTITION OF p_parts FOR VALUES IN (100)
            WITH (autovacuum_enabled = false);
          INSERT INTO p_parts SELECT g, 100, repeat('z', 200) FROM generate_series(1, 20000) g;
          DELETE FROM p_parts WHERE id % 2 = 0;`)
        )
        // Autovacuum is off on both tables: only the test's own VACUUM may be seen (CI once saw an
        // autovacuum of the 10,000 deleted rows here).
        assert.deepStrictEqual(yield* readWith(pair.primaryUrl, (s) => s.vacuuming(["busy"])), [])
        // Cost-based delay makes the VACUUM take seconds instead of milliseconds.
        const stop = background(pair, [...SLOW_VACUUM, "VACUUM busy"])
        try {
          let seen: ReadonlyArray<string> = []
          for (let i = 0; i < 300 && seen.length === 0; i++) {
            yield* sleep(100)
            seen = yield* readWith(pair.primaryUrl, (s) => s.vacuuming(["busy", "ci_builds"]))
          }
          assert.deepStrictEqual(seen, ["busy"])
          assert.deepStrictEqual(
            yield* readWith(pair.primaryUrl, (s) => s.vacuuming(["ci_builds", "sweeper_events"])),
            []
          )
        } finally {
          yield* stop
        }
        const partitions = background(pair, [...SLOW_VACUUM, "VACUUM p_parts_100"])
        try {
          let seen: ReadonlyArray<string> = []
          for (let i = 0; i < 300 && seen.length === 0; i++) {
            yield* sleep(100)
            seen = yield* readWith(pair.primaryUrl, (s) => s.vacuuming(["p_parts"]))
          }
          assert.deepStrictEqual(seen, ["p_parts"], "a partition's vacuum counts for its partitioned parent")
        } finally {
          yield* partitions
        }
      }))

    it.effect("oldestTransaction: the age of another connection's open transaction; none open → 0", () =>
      Effect.gen(function*() {
        const pair = yield* Pair
        const stop = background(pair, ["BEGIN", "SELECT txid_current()", "SELECT pg_sleep(30)", "COMMIT"])
        try {
          yield* sleep(1500)
          const age = yield* readWith(pair.primaryUrl, (s) => s.oldestTransaction)
          assert.isAbove(age, 1)
          assert.isBelow(age, 10)
        } finally {
          yield* stop
        }
        let age = 1
        for (let i = 0; i < 300 && age > 0; i++) {
          yield* sleep(100)
          age = yield* readWith(pair.primaryUrl, (s) => s.oldestTransaction)
        }
        assert.strictEqual(age, 0)
      }))

    it.effect("a role without pg_monitor: readings are unreadable (naming the grant), not a false zero; with it they read", () =>
      Effect.gen(function*() {
        const pair = yield* Pair
        yield* Effect.promise(() => pair.primary("DROP ROLE IF EXISTS watcher; CREATE ROLE watcher LOGIN"))
        const watcher = pair.primaryUrl.replace("postgres://postgres@", "postgres://watcher@")
        const privileges = yield* readWith(watcher, (s) => s.privileges)
        assert.deepStrictEqual(privileges, {
          role: "watcher",
          superuser: false,
          readAllStats: false,
          inRecovery: false
        })
        for (
          const read of [
            (s: HealthSignals["Service"]) => Effect.asVoid(s.replicationLag),
            (s: HealthSignals["Service"]) => Effect.asVoid(s.oldestTransaction),
            (s: HealthSignals["Service"]) => Effect.asVoid(s.vacuuming(["busy"]))
          ]
        ) {
          const error = yield* Effect.flip(readWith(watcher, read))
          assert.instanceOf(error, SignalUnreadable)
          assert.include(error.message, "pg_monitor")
        }
        yield* Effect.promise(() => pair.primary("GRANT pg_monitor TO watcher"))
        assert.strictEqual((yield* readWith(watcher, (s) => s.replicationLag)).standbys, 1)
        assert.isTrue((yield* readWith(watcher, (s) => s.privileges)).readAllStats)
      }))

    it.effect("on the standby itself: in recovery, no WAL position to read", () =>
      Effect.gen(function*() {
        const pair = yield* Pair
        assert.isTrue((yield* readWith(pair.standbyUrl, (s) => s.privileges)).inRecovery)
        const error = yield* Effect.flip(readWith(pair.standbyUrl, (s) => s.walPosition))
        assert.instanceOf(error, SignalUnreadable)
      }))

    it.effect(
      "a delayed standby the operator ignores is not lag: 8 MB behind on a 1 h recovery_min_apply_delay",
      () =>
        Effect.gen(function*() {
          const pair = yield* Pair
          yield* Effect.acquireRelease(
            Effect.promise(async () => {
              await pair.standby("ALTER SYSTEM SET recovery_min_apply_delay = '1h'")
              await pair.standby("SELECT pg_reload_conf()")
            }),
            () =>
              Effect.promise(async () => {
                await pair.standby("ALTER SYSTEM RESET recovery_min_apply_delay")
                await pair.standby("SELECT pg_reload_conf()")
              })
          )
          const [[name]] = yield* Effect.promise(() => pair.primary("SELECT application_name FROM pg_stat_replication"))
          yield* sleep(1500)
          // The delay holds back commit records: the first commit stops replay, and what follows piles up.
          yield* Effect.promise(() => pair.primary("CREATE TABLE IF NOT EXISTS delayed_marker (id int)"))
          yield* Effect.promise(() =>
            pair.primary(
              "CREATE TABLE IF NOT EXISTS filler (id int, pad text); INSERT INTO filler SELECT g, repeat('x', 1000) FROM generate_series(1, 8000) g"
            )
          )
          let written = yield* Effect.promise(() => pair.lagBytes())
          for (let i = 0; i < 600 && written <= 8_000_000; i++) {
            yield* sleep(100)
            written = yield* Effect.promise(() => pair.lagBytes())
          }
          // Unnamed, a freshly delayed standby has no replay_lag to tell it by yet: it counts.
          const unnamed = yield* readWith(pair.primaryUrl, (s) => s.replicationLag)
          assert.isAbove(unnamed.bytes, 8_000_000)
          const ignore = { ignore: [name!] }
          const ignored = yield* readSelecting(pair.primaryUrl, ignore, (s) => s.replicationLag)
          assert.deepStrictEqual(ignored, { standbys: 0, bytes: 0, seconds: 0 })
          const listed = yield* readSelecting(pair.primaryUrl, ignore, (s) => s.standbys)
          assert.deepStrictEqual(listed.map((s) => [s.name, s.watched, s.reason]), [
            [name, false, "ignored by SWEEPER_HEALTH_STANDBYS"]
          ])
          assert.isAbove(listed[0]!.bytes, 8_000_000)
        }),
      300_000
    )
  }
)
