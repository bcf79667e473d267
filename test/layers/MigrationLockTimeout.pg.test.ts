/**
 * The transactional migrations' DDL on sweeper_events waits at most its lock timeout: while another
 * transaction that appended holds the table, the trigger swap gives up and retries instead of
 * sitting in the lock queue, where every later append would queue behind it.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber, Layer, Redacted } from "effect"
import type { SqlClient } from "effect/sql"
import { migrate } from "../../src/layers/postgres/Migrations.ts"
import { layerServer } from "../../src/layers/postgres/Postgres.ts"
import { freshDatabase } from "../support/postgres.ts"

const HOLD_MS = 3000

describe("migration lock timeout", () => {
  it.live(
    "an open appending transaction holds the trigger swap back, yet later appends never queue behind it",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const { url } = yield* freshDatabase
        const clients = yield* Effect.all([1, 2, 3].map(() => Layer.build(layerServer(Redacted.make(url)))))
        const on = <A, E>(i: number, effect: Effect.Effect<A, E, PgClient.PgClient | SqlClient.SqlClient>) =>
          Effect.provideContext(effect, clients[i]!)
        // The schema of migration 4: the rollup (and its trigger on sweeper_events) still to come.
        yield* on(
          0,
          Effect.gen(function*() {
            const sql = yield* PgClient.PgClient
            yield* migrate
            yield* sql`DROP TRIGGER sweeper_runs_fold ON sweeper_events`
            yield* sql`DROP TABLE sweeper_runs, sweeper_backfills`
            yield* sql`DELETE FROM sweeper_migrations WHERE migration_id >= 5`
          })
        )
        const append = Effect.flatMap(
          PgClient.PgClient,
          (sql) => sql`INSERT INTO sweeper_events (stream, type, data) VALUES ('build:1', 'BuildDropped', '{}')`
        )
        // A repair page's transaction: appended, then busy for HOLD_MS before it commits.
        const holder = yield* on(
          0,
          Effect.flatMap(
            PgClient.PgClient,
            (sql) => sql.withTransaction(Effect.andThen(append, Effect.sleep(HOLD_MS)))
          )
        ).pipe(Effect.forkScoped)
        yield* Effect.sleep("200 millis")
        const began = Date.now()
        const migrating = yield* on(1, migrate).pipe(Effect.forkScoped)
        yield* Effect.sleep("300 millis")
        // Another appender meanwhile: it must not wait for the holder behind the migration's lock request.
        const appendStarted = Date.now()
        yield* on(2, append)
        const waited = Date.now() - appendStarted
        yield* Fiber.join(holder)
        const applied = yield* Fiber.join(migrating)
        const took = Date.now() - began
        console.log(`append waited ${waited} ms; migrate took ${took} ms (${applied.length} applied)`)
        assert.isBelow(waited, 1000, "the append queued behind the migration's lock request")
        // The migration still happened, once the holder had committed.
        assert.include(applied.map(([id]) => id), 6)
        assert.isAtLeast(took, HOLD_MS - 300)
      })),
    60_000
  )
})
