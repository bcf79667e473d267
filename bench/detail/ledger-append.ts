/**
 * The event append path with and without the per-run rollup (sweeper_runs). BENCH_APPENDERS
 * concurrent appenders (default 8: resume's workers, export slices) of ONE run each append
 * BENCH_PAGES pages (default 200) of BENCH_PAGE repair events (default 100) through EventLogSql's
 * appendAll, three times on the same database:
 * - no rollup: no trigger on sweeper_events (the floor);
 * - rollup: the row trigger of migration 6, which fires only on a run's RunStarted / RunFinished;
 * - statement rollup: the trigger migration 5 used to install (every appending statement upserts the
 *   run's row, adding its repairs), recreated here for comparison.
 * Each page's transaction stays open BENCH_TX_MS (default 5) after its append, as a repair page's
 * does for its write. BENCH_ROUNDS rounds (default 2) over the variants; prints each variant's best
 * round: events/s, per-page latency (median, p99, slowest), and its ratio to the floor.
 *
 *   npm run bench -- detail/ledger-append
 *   BENCH_APPENDERS=16 BENCH_PAGES=500 npm run bench -- detail/ledger-append
 *   (BENCH_DATABASE_URL: admin database, default …/test)
 */
import { NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Effect, Layer, Option } from "effect"
import { randomUUID } from "node:crypto"
import { performance } from "node:perf_hooks"
import { CurrentRun } from "../../src/domain/Batch.ts"
import { BuildDropped, RunFinished, RunStarted } from "../../src/domain/Events.ts"
import { EventLogSql } from "../../src/layers/postgres/EventLogSql.ts"
import { EventLog } from "../../src/services/EventLog.ts"
import { benchDatabase, envInt, fmt, line, migratedDatabase, percentile } from "../support/harness.ts"

const APPENDERS = envInt("BENCH_APPENDERS", 8)
const PAGES = envInt("BENCH_PAGES", 200)
const PAGE = envInt("BENCH_PAGE", 100)
/**
 * Each page is appended in a transaction that stays open this long after the append, as a repair
 * page's does while its write and fence run (0: autocommit appends). Whatever row lock the append
 * took is held that long.
 */
const TX_MS = envInt("BENCH_TX_MS", 5)
/** Rounds over the three variants; each variant's best round is printed (the machine is shared). */
const ROUNDS = envInt("BENCH_ROUNDS", 2)

/** Migration 5's trigger as it was: one upsert of the run's row per appending statement. */
const STATEMENT_ROLLUP = [
  `ALTER TABLE sweeper_runs ADD COLUMN IF NOT EXISTS repairs bigint NOT NULL DEFAULT 0`,
  `CREATE OR REPLACE FUNCTION bench_statement_rollup() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  INSERT INTO sweeper_runs AS r (run_id, batch, repairs)
  SELECT run_id, max(substr(stream, 7)) FILTER (WHERE type IN ('RunStarted', 'RunFinished')),
    count(*) FILTER (WHERE stream NOT LIKE 'batch:%')
  FROM sweeper_new_events WHERE run_id IS NOT NULL GROUP BY run_id
  ON CONFLICT (run_id) DO UPDATE SET batch = coalesce(r.batch, excluded.batch), repairs = r.repairs + excluded.repairs;
  RETURN NULL;
END
$fn$`,
  `CREATE TRIGGER bench_statement_rollup AFTER INSERT ON sweeper_events
    REFERENCING NEW TABLE AS sweeper_new_events FOR EACH STATEMENT EXECUTE FUNCTION bench_statement_rollup()`
]

const VARIANTS = {
  "no rollup": [`ALTER TABLE sweeper_events DISABLE TRIGGER sweeper_runs_fold`],
  "rollup (row trigger, run events only)": [`ALTER TABLE sweeper_events ENABLE TRIGGER sweeper_runs_fold`],
  "statement rollup (migration 5, before)": [
    `ALTER TABLE sweeper_events DISABLE TRIGGER sweeper_runs_fold`,
    ...STATEMENT_ROLLUP
  ]
} as const

/** One run: RunStarted, APPENDERS × PAGES pages appended concurrently, RunFinished. Page latencies. */
const oneRun = Effect.gen(function*() {
  const log = yield* EventLog
  const sql = yield* PgClient.PgClient
  const runId = randomUUID()
  const batch = "concurrency-limit-resume"
  const times: Array<number> = []
  yield* Effect.gen(function*() {
    yield* log.append(
      new RunStarted({ batch, run_id: runId, scheduled_at: null, node: "b", trigger: "manual", dryRun: false })
    )
    yield* Effect.forEach(
      Array.from({ length: APPENDERS }, (_, a) => a),
      (a) =>
        Effect.gen(function*() {
          for (let p = 0; p < PAGES; p++) {
            const first = (a * PAGES + p) * PAGE
            const page = Array.from(
              { length: PAGE },
              (_, i) => new BuildDropped({ id: first + i, project_id: 1, runner_id: null, failure_reason: 3 })
            )
            const began = performance.now()
            yield* TX_MS === 0 ? log.appendAll(page) : log.transaction(Effect.gen(function*() {
              yield* log.appendAll(page)
              yield* sql`SELECT pg_sleep(${TX_MS / 1000})`
            }))
            times.push(performance.now() - began)
          }
        }),
      { concurrency: "unbounded", discard: true }
    )
    yield* log.append(
      new RunFinished({ batch, outcome: "succeeded", summary: {}, duration_ms: 1, dryRun: false, repaired: 0 })
    )
  }).pipe(
    Effect.provideService(CurrentRun, { runId, batch, dryRun: false, budget: Option.none(), fence: Option.none() })
  )
  return times
})

const program = Effect.gen(function*() {
  const database = yield* benchDatabase(undefined)
  yield* Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    line(
      "appenders × pages × events",
      `${APPENDERS} × ${fmt(PAGES)} × ${PAGE} (one run), each page's transaction open ${TX_MS} ms`
    )
    const rates: Record<string, number> = {}
    const lines: Record<string, string> = {}
    for (let round = 0; round < ROUNDS; round++) {
      for (const [name, statements] of Object.entries(VARIANTS)) {
        yield* sql`TRUNCATE sweeper_events, sweeper_runs`
        yield* sql`DROP TRIGGER IF EXISTS bench_statement_rollup ON sweeper_events`
        for (const statement of statements) yield* sql.unsafe(statement)
        yield* oneRun // warm-up: plans, pool connections
        yield* sql`TRUNCATE sweeper_events, sweeper_runs`
        const began = performance.now()
        const times = yield* oneRun
        const seconds = (performance.now() - began) / 1000
        const sorted = [...times].sort((a, b) => a - b)
        const rate = (APPENDERS * PAGES * PAGE) / seconds
        if (rate <= (rates[name] ?? 0)) continue
        rates[name] = rate
        lines[name] = `${fmt(rate)} events/s; page median ${percentile(sorted, 0.5).toFixed(1)} ms, p99 ${
          percentile(sorted, 0.99).toFixed(1)
        } ms, slowest ${sorted.at(-1)!.toFixed(1)} ms`
      }
    }
    for (const [name, text] of Object.entries(lines)) line(name, text)
    const floor = rates["no rollup"]!
    for (const [name, rate] of Object.entries(rates)) {
      if (name !== "no rollup") line(`ratio to no rollup: ${name}`, `${(rate / floor).toFixed(3)}`)
    }
  }).pipe(Effect.provide(EventLogSql.pipe(Layer.provideMerge(migratedDatabase(database.url)))))
}).pipe(Effect.scoped)

NodeRuntime.runMain(program)
