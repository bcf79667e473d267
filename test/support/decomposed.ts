/**
 * A decomposed GitLab for tests: two fresh databases (main, ci) and a Redis db, migrated by the CLI
 * as an operator would, plus what the relay tests do to main or ci (refuse, block, slow down) and
 * the ledger as a consumer reads it, by id.
 */
import { PgClient } from "@effect/sql-pg"
import { assert } from "@effect/vitest"
import { Context, Effect, Layer, Redacted } from "effect"
import { layerServer } from "../../src/layers/postgres/Postgres.ts"
import { runCli } from "./cli.ts"
import { freshDatabase } from "./postgres.ts"
import { freshRedisUrl } from "./redis.ts"

export interface Decomposed {
  readonly env: Record<string, string>
  readonly main: PgClient.PgClient
  readonly ci: PgClient.PgClient
  readonly mainUrl: string
  readonly ciUrl: string
}

export const clientOf = (url: string) =>
  Effect.map(Layer.build(layerServer(Redacted.make(url))), (context) => Context.get(context, PgClient.PgClient)).pipe(
    Effect.orDie
  )

/** Two fresh databases (main, ci) and a Redis db, migrated by the CLI; `extra` joins the env. */
export const decomposedDatabases = (extra: Record<string, string> = {}) =>
  Effect.gen(function*() {
    const main = yield* freshDatabase
    const ci = yield* freshDatabase
    const redis = yield* freshRedisUrl
    const env = {
      DATABASE_URL: main.url,
      CI_DATABASE_URL: ci.url,
      REDIS_URL: redis,
      SWEEPER_DROP_BATCH_SIZE: "50",
      // A killed run's lease lapses in seconds, so the rerun need not wait out the default TTL.
      SWEEPER_LEASE_TTL_DROP_CANCELING_BUILDS: "3 seconds",
      ...extra
    }
    const migrated = yield* Effect.promise(() => runCli(["migrate"], env))
    assert.strictEqual(migrated.code, 0, migrated.stderr)
    return {
      env,
      main: yield* clientOf(main.url),
      ci: yield* clientOf(ci.url),
      mainUrl: main.url,
      ciUrl: ci.url
    } satisfies Decomposed
  })

export const count = (sql: PgClient.PgClient, query: string) =>
  Effect.map(sql.unsafe<{ n: string }>(query), (rows) => Number(rows[0]!.n))

/** A row trigger on main's ledger for the relay's repair events only (RunStarted/RunFinished pass). */
const onRepairEvents = (sql: PgClient.PgClient, name: string, body: string) =>
  Effect.gen(function*() {
    yield* sql.unsafe(`CREATE FUNCTION ${name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN ${body} END $$`)
    yield* sql.unsafe(`CREATE TRIGGER ${name} BEFORE INSERT ON sweeper_events
      FOR EACH ROW WHEN (NEW.type = 'BuildDropped') EXECUTE FUNCTION ${name}()`)
    return sql.unsafe(`DROP TRIGGER ${name} ON sweeper_events`).pipe(Effect.asVoid, Effect.orDie)
  })

/** Main refuses every repair event (as a revoked grant or a full disk would); returns the lift. */
export const refuseRepairEvents = (main: PgClient.PgClient) =>
  onRepairEvents(main, "test_refuse_repairs", "RAISE EXCEPTION 'repair events refused by the test';")

/**
 * Main's insert of a repair event waits on advisory lock `key` (shared), which the test holds with
 * `holdAdvisory`: main hangs right there, for as long as the test wants. Returns the trigger's removal.
 */
export const blockRepairEvents = (main: PgClient.PgClient, key: number) =>
  onRepairEvents(main, "test_block_repairs", `PERFORM pg_advisory_xact_lock_shared(${key}); RETURN NEW;`)

/**
 * Main takes 0.2 s for each repair event a session named `application` inserts: slow enough that the
 * other relay waits on the rows it holds, and short enough that, holding every one of 300 (120 s at
 * 0.4 s on a loaded CI machine), it still finishes within the tests' waits.
 */
export const slowRepairEventsOf = (main: PgClient.PgClient, application: string) =>
  onRepairEvents(
    main,
    "test_slow_repairs",
    `IF current_setting('application_name') = '${application}' THEN PERFORM pg_sleep(0.2); END IF; RETURN NEW;`
  )

/** Holds advisory lock `key` on a connection of its own until the returned effect releases it. */
export const holdAdvisory = (url: string, key: number) =>
  Effect.gen(function*() {
    const holder = yield* clientOf(url)
    const release = yield* holder.reserve
    yield* release.executeRaw(`SELECT pg_advisory_lock(${key})`, [])
    return release.executeRaw(`SELECT pg_advisory_unlock(${key})`, []).pipe(Effect.asVoid, Effect.orDie)
  })

/** Sessions waiting for an advisory lock in `sql`'s database. */
export const advisoryWaiters = (sql: PgClient.PgClient) =>
  count(
    sql,
    `SELECT count(*) AS n FROM pg_locks l JOIN pg_database d ON d.oid = l.database
     WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database()`
  )

interface LedgerRow {
  readonly id: string
  readonly stream: string
  readonly type: string
  readonly data: Record<string, unknown>
  readonly run_id: string | null
}

/**
 * Reads main's ledger by id, as a consumer would, and checks the order invariant for every run: its
 * repair events precede its RunFinished, or RunFinished says `eventsOwed` and the run's
 * RunEventsRelayed comes after every one of them; within a run, BuildDropped events follow the
 * order the run dropped the builds in (keyset order: build id order in these seeds), as far as two
 * pages written at once allow: a page starts only once the page two before it committed, so its
 * events follow that page's in ci and in main, and no three builds appear in descending order.
 * Returns the runs, each with its events and whether it was complete at RunFinished.
 */
/** drop-canceling-builds' pages written at once (DropCancelingBuilds.ts). */
const PAGES_IN_FLIGHT = 2

/** The length of the longest strictly descending subsequence of `values`. */
const longestDescent = (values: ReadonlyArray<number>): number => {
  const ending: Array<number> = []
  values.forEach((value, i) => {
    ending[i] = 1 + Math.max(0, ...values.slice(0, i).map((earlier, j) => earlier > value ? ending[j]! : 0))
  })
  return Math.max(0, ...ending)
}

export const assertLedgerOrder = (main: PgClient.PgClient) =>
  Effect.gen(function*() {
    const rows = yield* main<LedgerRow>`SELECT id, stream, type, data, run_id FROM sweeper_events ORDER BY id`
    const runs = new Map<string, Array<LedgerRow>>()
    for (const row of rows) {
      if (row.run_id === null) continue
      const list = runs.get(row.run_id) ?? []
      list.push(row)
      runs.set(row.run_id, list)
    }
    const summary: Array<{ runId: string; repairs: number; owedAtFinish: number | undefined }> = []
    for (const [runId, events] of runs) {
      const finished = events.filter((e) => e.type === "RunFinished")
      const repairs = events.filter((e) => !e.stream.startsWith("batch:"))
      if (finished.length === 0) continue
      assert.lengthOf(finished, 1, `one RunFinished for run ${runId}`)
      const finish = finished[0]!
      const owed = finish.data.eventsOwed as number | undefined
      const after = repairs.filter((e) => Number(e.id) > Number(finish.id))
      const closing = events.filter((e) => e.type === "RunEventsRelayed")
      if (owed === undefined) {
        assert.lengthOf(after, 0, `run ${runId}: ${after.length} repair events after a RunFinished that owed none`)
        assert.lengthOf(closing, 0, `run ${runId}: no RunEventsRelayed for a run that owed nothing`)
      } else {
        assert.isAbove(owed, 0)
        assert.isAtMost(after.length, owed, `run ${runId}: more events after RunFinished than it said it owed`)
        assert.lengthOf(closing, 1, `run ${runId}: RunFinished owed ${owed} events and nothing closed them`)
        const last = Math.max(Number(finish.id), ...repairs.map((e) => Number(e.id)))
        assert.isAbove(Number(closing[0]!.id), last, `run ${runId}: RunEventsRelayed before the run's last event`)
      }
      const dropped = repairs.filter((e) => e.type === "BuildDropped").map((e) => Number(e.data.id))
      assert.strictEqual(new Set(dropped).size, dropped.length, `run ${runId}: a build dropped twice`)
      assert.isAtMost(longestDescent(dropped), PAGES_IN_FLIGHT, `run ${runId}: pages out of order: ${dropped}`)
      summary.push({ runId, repairs: repairs.length, owedAtFinish: owed })
    }
    return summary
  })

/** Runs the CLI with the decomposed env (plus `extra`) and a generous timeout. */
export const cli = (args: ReadonlyArray<string>, env: Record<string, string>, timeoutMs = 150_000) =>
  Effect.promise(() => runCli(args, env, timeoutMs))
