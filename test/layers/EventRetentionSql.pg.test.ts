/**
 * EventRetentionSql on a real PostgreSQL: the SQL rule keeps exactly what the domain rule keeps
 * (random histories), prune-events pages through it under the run guard with its fence checked per
 * page, the boundary is exact, every batch's folded state survives, and the page and kept-set scans
 * use the indexes migration 0004 adds.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, layer } from "@effect/vitest"
import { Duration, Effect, Layer, Logger } from "effect"
import { SweeperConfig, TuningFromConfig } from "../../src/config/Config.ts"
import { foldHistory, unfinishedRuns } from "../../src/domain/BatchState.ts"
import type { StoredEvent } from "../../src/domain/Events.ts"
import { prunable, PrunePageSize } from "../../src/domain/Retention.ts"
import { EventLogSql } from "../../src/layers/postgres/EventLogSql.ts"
import { EventRetentionSql, keptQuery, prunePageQuery } from "../../src/layers/postgres/EventRetentionSql.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { PruneEvents } from "../../src/programs/PruneEvents.ts"
import { EventLog } from "../../src/services/EventLog.ts"
import { LockedRows } from "../../src/services/LockedRows.ts"
import { MemoryBackends } from "../../src/supervisor/App.ts"
import { runBatch } from "../../src/supervisor/RunGuard.ts"
import { randomHistory, type SeedEvent } from "../support/eventHistory.ts"
import { holdLocks, PgTest } from "../support/postgres.ts"

// The real clock (the pool and the run guard's lease renewal need it): runs judge at NOW via asOf,
// which is in the past by then, so the cutoff is exactly NOW − 90 days.
const NOW_MS = Date.now()
const DAY = 86_400_000
const CUTOFF = NOW_MS - 90 * DAY

const Platform = Layer.mergeAll(EventRetentionSql, MemoryBackends, TuningFromConfig, MetricsPrometheus).pipe(
  Layer.provideMerge(EventLogSql),
  Layer.provideMerge(SweeperConfig.layerWith({})),
  Layer.provideMerge(PgTest)
)

const reset = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  yield* sql`TRUNCATE sweeper_events, sweeper_lease_fences RESTART IDENTITY`
})

/** Inserts in order (ids follow), with their own times and run ids, in one statement. */
const insert = (events: ReadonlyArray<SeedEvent>) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const rows = events.map((e) => ({
      stream: e.stream,
      type: e.type,
      data: e.data,
      run_id: e.runId,
      occurred_at: e.occurredAt.toISOString()
    }))
    yield* sql`INSERT INTO sweeper_events (stream, type, data, run_id, occurred_at)
      SELECT e.stream, e.type, e.data, e.run_id::uuid, e.occurred_at
      FROM ROWS FROM (jsonb_to_recordset(${
      sql.json(rows)
    }) AS (stream text, type text, data jsonb, run_id text, occurred_at timestamptz))
        WITH ORDINALITY AS e(stream, type, data, run_id, occurred_at, n)
      ORDER BY e.n`
  })

const repairsAt = (times: ReadonlyArray<number>): ReadonlyArray<SeedEvent> =>
  times.map((time, i) => ({
    stream: `export_job:${i}`,
    type: "ExportJobFailed",
    data: { id: i },
    runId: null,
    occurredAt: new Date(time)
  }))

const all = Effect.gen(function*() {
  return yield* (yield* EventLog).query({})
})

const folds = (events: ReadonlyArray<StoredEvent>) => {
  const streams = [...new Set(events.map((e) => e.stream))].filter((s) => s.startsWith("batch:")).sort()
  return Object.fromEntries(streams.map((stream) => {
    const mine = events.filter((e) => e.stream === stream)
    return [stream, { history: foldHistory(mine), unfinished: unfinishedRuns(mine).map((r) => r.runId).sort() }]
  }))
}

const prune = (options: { dryRun?: boolean; budget?: Duration.Duration } = {}) =>
  runBatch(PruneEvents, { trigger: "manual", asOf: new Date(NOW_MS), ...options })

layer(Platform, { excludeTestServices: true, timeout: "60 seconds" })("EventRetentionSql (real PostgreSQL)", (it) => {
  it.effect("the SQL kept set is the domain rule's, on random histories and cutoffs", () =>
    Effect.gen(function*() {
      const sql = yield* PgClient.PgClient
      for (const seed of [1, 2, 3, 4, 5, 6]) {
        yield* reset
        yield* insert(randomHistory(seed, { start: new Date(NOW_MS - 200 * DAY), steps: 600, stepMinutes: 480 }))
        const events = yield* all
        for (const days of [150, 90, 30, 0]) {
          const before = new Date(NOW_MS - days * DAY)
          const gone = new Set(prunable(events, before).map((e) => e.id))
          const expected = events.filter((e) => e.occurredAt < before && !gone.has(e.id)).map((e) => e.id)
          const actual = (yield* keptQuery(sql, before)).map((row) => Number(row.id))
          assert.deepStrictEqual(actual, expected, `seed ${seed}, before ${before.toISOString()}`)
        }
      }
    }))

  it.effect("prunes in pages under the run guard; folded state unchanged; boundary exact; nothing recent touched", () =>
    Effect.gen(function*() {
      yield* reset
      yield* insert([
        ...randomHistory(9, { start: new Date(NOW_MS - 200 * DAY), steps: 700, stepMinutes: 400 }).filter((e) =>
          e.occurredAt.getTime() < NOW_MS - DAY
        ),
        ...repairsAt([CUTOFF - 1, CUTOFF, CUTOFF + 1])
      ])
      const before = yield* all
      const old = before.filter((e) => e.occurredAt.getTime() < CUTOFF)
      const dry = yield* prune({ dryRun: true })
      const result = yield* prune().pipe(Effect.provideService(PrunePageSize, 40))
      assert.strictEqual(result.outcome, "succeeded", result.error)
      const summary = result.summary as { before: string; pruned: number; keptForState: number; pages: number }
      assert.strictEqual(summary.before, new Date(CUTOFF).toISOString())
      assert.strictEqual(summary.pruned, (dry.summary as { pruned: number }).pruned)
      assert.strictEqual(summary.pruned + summary.keptForState, old.length)
      assert.strictEqual(summary.pages, Math.ceil(summary.pruned / 40))
      const after = yield* all
      // Exactly the events the domain rule names went; every batch folds the same.
      const gone = new Set(prunable(before, new Date(CUTOFF)).map((e) => e.id))
      const seeded = before.length
      assert.deepStrictEqual(
        after.filter((e) => e.id <= seeded).map((e) => e.id),
        before.filter((e) => !gone.has(e.id)).map((e) => e.id)
      )
      assert.deepStrictEqual(folds(after.filter((e) => e.stream !== "batch:prune-events")), folds(before))
      const boundary = after.filter((e) => e.type === "ExportJobFailed").map((e) => e.occurredAt.getTime())
      assert.deepStrictEqual(boundary, [CUTOFF, CUTOFF + 1])
      // One EventsPruned per page, their counts adding up; the run's own RunStarted is there.
      const pages = after.filter((e) => e.type === "EventsPruned")
      assert.strictEqual(pages.length, summary.pages)
      assert.strictEqual(pages.reduce((n, e) => n + Number(e.data.count), 0), summary.pruned)
      assert.deepStrictEqual(
        after.filter((e) => e.runId === result.runId).map((e) => e.type).filter((t) => t.startsWith("Run")),
        ["RunStarted", "RunFinished"]
      )
    }))

  it.effect("events another transaction holds are skipped, counted once and logged, within the budget; the next run prunes them", () =>
    Effect.gen(function*() {
      yield* reset
      // 100 old repair events (ids 1–100) and one recent; ids 3, 4 and 57 held FOR UPDATE elsewhere.
      yield* insert(repairsAt([...Array.from({ length: 100 }, (_, i) => CUTOFF - 1000 + i), NOW_MS - DAY]))
      const release = yield* holdLocks((other) => other`SELECT 1 FROM sweeper_events WHERE id IN (3, 4, 57) FOR UPDATE`)
      const started = Date.now()
      const result = yield* prune({ budget: Duration.seconds(5) }).pipe(Effect.provideService(PrunePageSize, 10))
      assert.isBelow(Date.now() - started, 5_000, "the prune waited for the held rows")
      assert.strictEqual(result.outcome, "succeeded", result.error)
      assert.deepStrictEqual(result.summary, {
        before: new Date(CUTOFF).toISOString(),
        pruned: 97,
        keptForState: 0,
        pages: 10,
        executionTimeout: false,
        skippedLocked: 3,
        heldMs: 0,
        heldBy: []
      })
      assert.deepStrictEqual((yield* all).filter((e) => e.type === "ExportJobFailed").map((e) => e.id), [3, 4, 57, 101])
      yield* release
      const again = yield* prune().pipe(Effect.provideService(PrunePageSize, 10))
      assert.strictEqual((again.summary as { pruned: number; skippedLocked: number }).pruned, 3)
      assert.strictEqual((again.summary as { skippedLocked: number }).skippedLocked, 0)
      assert.deepStrictEqual((yield* all).filter((e) => e.type === "ExportJobFailed").map((e) => e.id), [101])
    }))

  it.effect("events held run after run: counted once per run however many pages meet them, warned about from the 3rd run, forgotten once pruned", () =>
    Effect.gen(function*() {
      yield* reset
      const rows = yield* LockedRows
      yield* rows.passed("prune-events", yield* rows.counted("prune-events"))
      // 30 old repair events (ids 1–30) and one recent; 3 and 4, the oldest but two, held FOR UPDATE
      // elsewhere: every page of 10 meets them again.
      yield* insert(repairsAt([...Array.from({ length: 30 }, (_, i) => CUTOFF - 1000 + i), NOW_MS - DAY]))
      const release = yield* holdLocks((other) => other`SELECT 1 FROM sweeper_events WHERE id IN (3, 4) FOR UPDATE`)
      const warnings: Array<[unknown, unknown]> = []
      const collector = Logger.make((options) => {
        const message = Array.isArray(options.message) ? options.message : [options.message]
        if (options.logLevel !== "Warn" || !String(message[0]).includes("run after run")) return
        warnings.push([message[1]?.event_id, message[1]?.runs])
      })
      const held: Array<unknown> = []
      for (let run = 1; run <= 3; run++) {
        const result = yield* prune().pipe(
          Effect.provideService(PrunePageSize, 10),
          Effect.provide(Logger.layer([collector]))
        )
        assert.strictEqual(result.outcome, "succeeded", result.error)
        held.push((result.summary as { skippedLocked: number }).skippedLocked)
      }
      assert.deepStrictEqual(held, [2, 2, 2])
      assert.deepStrictEqual(warnings, [[3, 3], [4, 3]])
      assert.deepStrictEqual([...(yield* rows.counted("prune-events"))].sort(), ["3", "4"])
      yield* release
      const pruned = yield* prune().pipe(Effect.provideService(PrunePageSize, 10))
      assert.strictEqual((pruned.summary as { pruned: number }).pruned, 2)
      assert.deepStrictEqual(yield* rows.counted("prune-events"), [])
    }))

  it.effect("a stale fence (a newer holder has written) stops the prune before its first page: nothing deleted", () =>
    Effect.gen(function*() {
      yield* reset
      yield* insert(repairsAt([CUTOFF - 3, CUTOFF - 2, CUTOFF - 1]))
      const sql = yield* PgClient.PgClient
      yield* sql`INSERT INTO sweeper_lease_fences (name, epoch) VALUES ('sweeper/prune_events', 9000000000000000)`
      const result = yield* prune()
      assert.strictEqual(result.outcome, "failed")
      assert.strictEqual(result.reason, "lease lost")
      assert.lengthOf((yield* all).filter((e) => e.type === "ExportJobFailed"), 3)
    }))

  it.effect("the page DELETE walks index_sweeper_events_on_occurred_at; the kept set reads only batch streams", () =>
    Effect.gen(function*() {
      yield* reset
      const sql = yield* PgClient.PgClient
      const plans = yield* sql.withTransaction(Effect.gen(function*() {
        // Priced as on a large table (an empty one is scanned sequentially either way).
        yield* sql`SET LOCAL enable_seqscan = off`
        const page = yield* sql<{ "QUERY PLAN": string }>`EXPLAIN ${
          prunePageQuery(sql, new Date(CUTOFF), [1, 2], 10_000)
        }`
        const kept = yield* sql<{ "QUERY PLAN": string }>`EXPLAIN ${keptQuery(sql, new Date(CUTOFF))}`
        return { page: page.map((r) => r["QUERY PLAN"]).join("\n"), kept: kept.map((r) => r["QUERY PLAN"]).join("\n") }
      }))
      assert.include(plans.page, "index_sweeper_events_on_occurred_at")
      assert.include(plans.kept, "index_sweeper_events_on_batch_streams")
    }))
})
