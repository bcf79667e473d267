/**
 * The per-run rollup (sweeper_runs) on a real PostgreSQL: a run's concurrent appenders never queue
 * on its row, and prune-events takes a run's row with its events.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, layer } from "@effect/vitest"
import { Effect, Layer, Option } from "effect"
import { CurrentRun } from "../../src/domain/Batch.ts"
import { EventLogSql } from "../../src/layers/postgres/EventLogSql.ts"
import { EventRetentionSql } from "../../src/layers/postgres/EventRetentionSql.ts"
import { EventRetention } from "../../src/services/EventRetention.ts"
import { holdLocks, PgTest } from "../support/postgres.ts"

const RUN = "6f1c1d1e-0000-4000-8000-000000000001"
const OLD = "6f1c1d1e-0000-4000-8000-000000000002"
const NEW = "6f1c1d1e-0000-4000-8000-000000000003"

const Live = EventRetentionSql.pipe(Layer.provideMerge(EventLogSql), Layer.provideMerge(PgTest))

layer(Live, { excludeTestServices: true })("sweeper_runs on PostgreSQL", (it) => {
  it.effect("two appenders of one run: the second never waits for the first's open transaction", () =>
    Effect.gen(function*() {
      const sql = yield* PgClient.PgClient
      yield* sql`INSERT INTO sweeper_events (stream, type, data, run_id) VALUES
        ('batch:drop-canceling-builds', 'RunStarted', '{"batch":"drop-canceling-builds","dryRun":false}', ${RUN})`
      // One worker's page of repairs, its transaction still open (a slow page, a held fence).
      const release = yield* holdLocks((other) =>
        other`INSERT INTO sweeper_events (stream, type, data, run_id)
          SELECT 'build:' || g, 'BuildDropped', '{}', ${RUN} FROM generate_series(1, 40) g`
      )
      // Another worker of the same run appends its page meanwhile: it must not queue behind the first.
      const began = Date.now()
      const second = yield* sql.withTransaction(Effect.gen(function*() {
        yield* sql`SET LOCAL lock_timeout = '1s'`
        yield* sql`INSERT INTO sweeper_events (stream, type, data, run_id)
          SELECT 'build:' || g, 'BuildDropped', '{}', ${RUN} FROM generate_series(41, 80) g`
      })).pipe(Effect.exit)
      const waited = Date.now() - began
      yield* release
      assert.strictEqual(second._tag, "Success", `the second appender failed after ${waited} ms: ${String(second)}`)
      assert.isBelow(waited, 1000)
    }))

  it.effect("prune takes a run's row with its RunFinished; a run kept in the ledger keeps its row", () =>
    Effect.gen(function*() {
      const sql = yield* PgClient.PgClient
      yield* sql`TRUNCATE sweeper_events, sweeper_runs RESTART IDENTITY`
      const finished = (run: string, at: string) =>
        sql`INSERT INTO sweeper_events (stream, type, data, run_id, occurred_at) VALUES
          ('batch:stuck-export-jobs', 'RunStarted', '{"batch":"stuck-export-jobs","dryRun":false}', ${run}, ${at}),
          ('export:1', 'ExportJobFailed', '{}', ${run}, ${at}),
          ('batch:stuck-export-jobs', 'RunFinished',
            '{"batch":"stuck-export-jobs","outcome":"succeeded","duration_ms":5,"dryRun":false,"repaired":1}', ${run}, ${at})`
      yield* finished(OLD, "2026-01-01T00:00:00Z")
      yield* finished(NEW, "2026-11-01T00:00:00Z")
      const before = new Date("2026-06-01T00:00:00Z")
      const retention = yield* EventRetention
      // Nothing kept for state here: the old run's every event goes.
      const page = yield* retention.prunePage(before, [], 1000).pipe(
        Effect.provideService(CurrentRun, {
          runId: null,
          batch: "prune-events",
          dryRun: false,
          budget: Option.none(),
          fence: Option.none()
        })
      )
      assert.strictEqual(page.pruned, 3)
      const runs = yield* sql<{ run_id: string }>`SELECT run_id FROM sweeper_runs ORDER BY run_id`
      assert.deepStrictEqual(runs.map((r) => r.run_id), [NEW])
    }))
})
