/**
 * Upgrading a ledger of 5 000 000 events from the schema before the console rollup (migrations
 * 1–4) while another session keeps appending events: no append waits a second. Slow (the seed
 * alone takes about a minute on the shared machine), hence its own file.
 *
 * The old schema is made by migrating fully and then undoing what migrations 5 and up added, so the
 * same file runs against any version of the migrations.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber, Layer, Option, Redacted, Ref } from "effect"
import type { SqlClient } from "effect/sql"
import { migrate, migrateWith } from "../../src/layers/postgres/Migrations.ts"
import { layerServer } from "../../src/layers/postgres/Postgres.ts"
import { freshDatabase } from "../support/postgres.ts"

const EVENTS = 5_000_000
const RUNS = 10_000
const PER_RUN = EVENTS / RUNS

/** Back to the tables of migration 4, with no secondary index on sweeper_events (see indexesOfFour). */
const toSchemaFour = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  yield* sql`DROP TRIGGER IF EXISTS sweeper_runs_rollup ON sweeper_events`
  yield* sql`DROP TRIGGER IF EXISTS sweeper_runs_fold ON sweeper_events`
  yield* sql`DROP TABLE IF EXISTS sweeper_runs, sweeper_backfills`
  const indexes = yield* sql<{ name: string }>`SELECT indexname AS name FROM pg_indexes
    WHERE tablename = 'sweeper_events' AND indexname <> 'sweeper_events_pkey'`
  for (const { name } of indexes) yield* sql.unsafe(`DROP INDEX ${name}`)
  yield* sql`DELETE FROM sweeper_migrations WHERE migration_id >= 5`
})

/** Migration 4's indexes on sweeper_events, built in bulk after the seed (much faster than row by row). */
const indexesOfFour = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  yield* sql`CREATE INDEX index_sweeper_events_on_stream_and_id ON sweeper_events (stream, id)`
  yield* sql`CREATE INDEX index_sweeper_events_on_type_and_occurred_at ON sweeper_events (type, occurred_at)`
  yield* sql`CREATE INDEX IF NOT EXISTS index_sweeper_events_on_run_id ON sweeper_events (run_id) WHERE run_id IS NOT NULL`
  yield* sql`CREATE INDEX IF NOT EXISTS index_sweeper_events_on_occurred_at ON sweeper_events (occurred_at)`
  yield* sql`CREATE INDEX IF NOT EXISTS index_sweeper_events_on_batch_streams ON sweeper_events (stream, id)
    WHERE stream LIKE 'batch:%'`
})

describe("upgrading a 5M-event ledger", () => {
  it.live(
    "appends from another session never wait over 1 s; start refuses, migrate upgrades",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const { url } = yield* freshDatabase
        const migrator = yield* Layer.build(layerServer(Redacted.make(url)))
        const appender = yield* Layer.build(layerServer(Redacted.make(url)))
        const asMigrator = <A, E>(effect: Effect.Effect<A, E, PgClient.PgClient | SqlClient.SqlClient>) =>
          Effect.provideContext(effect, migrator)

        const seeded = yield* asMigrator(Effect.gen(function*() {
          const sql = yield* PgClient.PgClient
          yield* migrate
          yield* toSchemaFour
          const began = Date.now()
          // Run r of batch r % 6: RunStarted, PER_RUN - 2 repairs, RunFinished, in id order.
          yield* sql`INSERT INTO sweeper_events (stream, type, data, run_id, occurred_at)
          SELECT CASE WHEN e = 1 OR e = ${PER_RUN} THEN 'batch:b' || (r % 6) ELSE 'build:' || (r * ${PER_RUN} + e) END,
            CASE WHEN e = 1 THEN 'RunStarted' WHEN e = ${PER_RUN} THEN 'RunFinished' ELSE 'BuildDropped' END,
            CASE WHEN e = ${PER_RUN}
              THEN jsonb_build_object('batch', 'b' || (r % 6), 'outcome', 'succeeded', 'duration_ms', 1200, 'dryRun', false)
              ELSE jsonb_build_object('id', r * ${PER_RUN} + e) END,
            md5(r::text)::uuid, now() - (${RUNS} - r) * interval '4 minutes' + e * interval '1 millisecond'
          FROM generate_series(1, ${RUNS}) r, generate_series(1, ${PER_RUN}) e`
          yield* indexesOfFour
          yield* sql`ANALYZE sweeper_events`
          return Date.now() - began
        }))
        console.log(`seeded ${EVENTS} events in ${seeded} ms`)

        // `sweeper start` on this ledger: refused in one line, before anything changes.
        const refused = yield* asMigrator(migrateWith(Option.none(), { heavy: "refuse" })).pipe(Effect.flip)
        assert.strictEqual(refused._tag, "HeavyMigrationPending")
        assert.include(refused.message, "sweeper migrate")
        assert.notInclude(refused.message, "\n")
        const latest = yield* asMigrator(Effect.flatMap(
          PgClient.PgClient,
          (sql) => sql<{ n: number }>`SELECT max(migration_id) AS n FROM sweeper_migrations`
        ))
        assert.strictEqual(Number(latest[0]!.n), 4)

        // Another session appends events one statement at a time (a run's start and finish among
        // them, so the rollup's trigger is on the path as soon as it exists) until told to stop.
        const waits = yield* Ref.make<Array<number>>([])
        const stop = yield* Ref.make(false)
        const appending = yield* Effect.gen(function*() {
          const sql = yield* PgClient.PgClient
          let n = 0
          while (!(yield* Ref.get(stop))) {
            n++
            const run = `00000000-0000-4000-8000-${String(n).padStart(12, "0")}`
            const began = performance.now()
            yield* sql`INSERT INTO sweeper_events (stream, type, data, run_id) VALUES
            ('batch:live', 'RunStarted', '{"batch":"live","dryRun":false}', ${run}),
            ('build:' || ${n}, 'BuildDropped', '{}', ${run}),
            ('batch:live', 'RunFinished', '{"batch":"live","outcome":"succeeded","duration_ms":5,"repaired":1}', ${run})`
            const waited = performance.now() - began
            yield* Ref.update(waits, (all) => [...all, waited])
            yield* Effect.sleep("20 millis")
          }
        }).pipe(Effect.provideContext(appender), Effect.forkScoped)

        yield* Effect.sleep("300 millis")
        const began = Date.now()
        const applied = yield* asMigrator(migrate)
        const took = Date.now() - began
        yield* Effect.sleep("300 millis")
        yield* Ref.set(stop, true)
        yield* Fiber.join(appending)

        const all = yield* Ref.get(waits)
        const worst = Math.max(...all)
        console.log(
          `upgrade took ${took} ms (${
            applied.map(([id, name]) => `${id}_${name}`).join("; ")
          }); ${all.length} appends, ` +
            `slowest ${worst.toFixed(1)} ms`
        )
        assert.isAbove(all.length, 10)
        assert.isBelow(worst, 1000, "an append waited over a second")

        const check = yield* asMigrator(Effect.gen(function*() {
          const sql = yield* PgClient.PgClient
          const indexes = yield* sql<{ name: string; valid: boolean }>`SELECT c.relname AS name, i.indisvalid AS valid
          FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
          WHERE i.indrelid = 'sweeper_events'::regclass ORDER BY 1`
          const runs = yield* sql<{ n: string; finished: string }>`SELECT count(*) AS n,
          count(*) FILTER (WHERE outcome = 'succeeded' AND duration_ms = 1200) AS finished FROM sweeper_runs
          WHERE batch LIKE 'b_'`
          const live = yield* sql<{ n: string; bad: string }>`SELECT count(*) AS n,
          count(*) FILTER (WHERE repaired IS DISTINCT FROM 1 OR outcome IS NULL) AS bad FROM sweeper_runs
          WHERE batch = 'live'`
          return { indexes, runs: runs[0]!, live: live[0]! }
        }))
        const names = check.indexes.map((i) => i.name)
        assert.include(names, "index_sweeper_events_on_run_id_and_id")
        assert.notInclude(names, "index_sweeper_events_on_run_id")
        assert.isTrue(check.indexes.every((i) => i.valid), JSON.stringify(check.indexes))
        // Every seeded run backfilled; every run appended during the upgrade folded by the trigger.
        assert.strictEqual(Number(check.runs.n), RUNS)
        assert.strictEqual(Number(check.runs.finished), RUNS)
        assert.strictEqual(Number(check.live.n), all.length)
        assert.strictEqual(Number(check.live.bad), 0)
      })),
    600_000
  )
})
