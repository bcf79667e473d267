/**
 * prune-events on a long-grown event log: BENCH_EVENTS repair events (default 1,000,000) and
 * BENCH_BATCH_EVENTS batch-stream events (RunStarted/RunFinished pairs of six batches, default
 * 100,000) spread over 200 days, then one run of the batch through the run guard on PostgreSQL
 * with the 90-day default retention. Prints the kept-set query, the pages (count, slowest), rows
 * deleted per second, WAL written and the table's size (which autovacuum, not the prune, reclaims).
 *
 *   npm run bench -- detail/prune-events
 *   BENCH_EVENTS=200000 BENCH_BATCH_EVENTS=20000 npm run bench -- detail/prune-events
 *   (BENCH_DATABASE_URL: admin database, default …/test)
 */
import { NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Duration, Effect, Layer } from "effect"
import { performance } from "node:perf_hooks"
import { SweeperConfig, TuningFromConfig } from "../../src/config/Config.ts"
import { EventLogSql } from "../../src/layers/postgres/EventLogSql.ts"
import { EventRetentionSql } from "../../src/layers/postgres/EventRetentionSql.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { PruneEvents, type PruneEventsSummary } from "../../src/programs/PruneEvents.ts"
import { EventRetention } from "../../src/services/EventRetention.ts"
import { MemoryBackends } from "../../src/supervisor/App.ts"
import { runBatch } from "../../src/supervisor/RunGuard.ts"
import { benchDatabase, envInt, fmt, line, migratedDatabase, timed } from "../support/harness.ts"

const EVENTS = envInt("BENCH_EVENTS", 1_000_000)
const BATCH_EVENTS = envInt("BENCH_BATCH_EVENTS", 100_000)
const DAYS = 200
const BATCHES = [
  "stuck-export-jobs",
  "drop-canceling-builds",
  "delete-stale-direct-uploads",
  "reschedule-stuck-issue-rebalances",
  "concurrency-limit-resume",
  "prune-events"
]

const pageTimes: Array<number> = []
let keptMs = 0

/** EventRetentionSql with each call timed. */
const Timed = Layer.effect(
  EventRetention,
  Effect.gen(function*() {
    const inner = yield* EventRetention
    const time = <A, E>(effect: Effect.Effect<A, E>, record: (ms: number) => void) =>
      Effect.suspend(() => {
        const start = performance.now()
        return Effect.tap(effect, () => Effect.sync(() => record(performance.now() - start)))
      })
    return EventRetention.of({
      kept: (before) => time(inner.kept(before), (ms) => (keptMs += ms)),
      countPrunable: inner.countPrunable,
      prunePage: (before, kept, limit) => time(inner.prunePage(before, kept, limit), (ms) => pageTimes.push(ms))
    })
  })
).pipe(Layer.provide(EventRetentionSql))

const seed = (now: Date) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const spanSeconds = DAYS * 86_400
    yield* sql`INSERT INTO sweeper_events (stream, type, data, occurred_at)
      SELECT 'build:' || i, 'BuildDropped', jsonb_build_object('id', i, 'project_id', i % 1000, 'runner_id', null, 'failure_reason', 3),
        ${now}::timestamptz - ((${spanSeconds}::bigint * i / ${EVENTS}) * interval '1 second')
      FROM generate_series(1, ${EVENTS}) AS i`
    // Runs: a RunStarted and its succeeded RunFinished per pair, round-robin over the batches.
    yield* sql`INSERT INTO sweeper_events (stream, type, data, run_id, occurred_at)
      SELECT 'batch:' || b.name, t.type,
        CASE WHEN t.type = 'RunStarted'
          THEN jsonb_build_object('batch', b.name, 'run_id', r.id::text, 'scheduled_at', null, 'node', 'bench', 'trigger', 'schedule', 'dryRun', false)
          ELSE jsonb_build_object('batch', b.name, 'outcome', 'succeeded', 'summary', '{}'::jsonb, 'duration_ms', 10, 'dryRun', false) END,
        r.id, r.at + CASE WHEN t.type = 'RunStarted' THEN interval '0' ELSE interval '1 second' END
      FROM (SELECT gen_random_uuid() AS id, i,
              ${now}::timestamptz - ((${spanSeconds}::bigint * i / ${
      Math.max(1, BATCH_EVENTS / 2)
    }) * interval '1 second') AS at
            FROM generate_series(1, ${Math.floor(BATCH_EVENTS / 2)}) AS i) AS r
      CROSS JOIN LATERAL (SELECT (ARRAY[${
      sql.unsafe(BATCHES.map((b) => `'${b}'`).join(", "))
    }])[1 + r.i % ${BATCHES.length}] AS name) AS b
      CROSS JOIN (VALUES ('RunStarted', 1), ('RunFinished', 2)) AS t(type, n)
      ORDER BY r.at DESC, t.n`
    yield* sql`ANALYZE sweeper_events`
  })

const program = Effect.gen(function*() {
  const database = yield* benchDatabase(undefined)
  const Platform = Layer.mergeAll(Timed, MemoryBackends, TuningFromConfig, MetricsPrometheus).pipe(
    Layer.provideMerge(EventLogSql),
    Layer.provideMerge(SweeperConfig.layerWith({})),
    Layer.provideMerge(migratedDatabase(database.url))
  )
  yield* Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const now = new Date()
    yield* timed(`seed ${fmt(EVENTS)} repair + ${fmt(BATCH_EVENTS)} batch events`, seed(now))
    const size = () =>
      Effect.map(
        sql<
          { rows: string; bytes: string }
        >`SELECT (SELECT count(*) FROM sweeper_events) AS rows, pg_total_relation_size('sweeper_events') AS bytes`,
        (r) => r[0]!
      )
    const wal = () => Effect.map(sql<{ lsn: string }>`SELECT pg_current_wal_lsn()::text AS lsn`, (r) => r[0]!.lsn)
    const before = yield* size()
    const walBefore = yield* wal()
    const start = performance.now()
    const result = yield* runBatch(PruneEvents, { trigger: "manual", budget: Duration.hours(1) })
    const seconds = (performance.now() - start) / 1000
    const walBytes = yield* Effect.map(
      sql<{ bytes: string }>`SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), ${walBefore}::pg_lsn) AS bytes`,
      (r) => Number(r[0]!.bytes)
    )
    const after = yield* size()
    const summary = result.summary as PruneEventsSummary | null
    line("outcome", `${result.outcome}${result.error ? ` (${result.error})` : ""}`)
    line("summary", JSON.stringify(summary))
    line("rows before / after", `${fmt(Number(before.rows))} / ${fmt(Number(after.rows))}`)
    line("wall time", `${seconds.toFixed(2)} s`)
    line("kept-for-state query", `${(keptMs / 1000).toFixed(2)} s`)
    const sorted = [...pageTimes].sort((a, b) => a - b)
    line(
      "pages (DELETE + EventsPruned, one transaction)",
      `${pageTimes.length}, median ${(sorted[Math.floor(sorted.length / 2)] ?? 0).toFixed(0)} ms, slowest ${
        (sorted.at(-1) ?? 0).toFixed(0)
      } ms`
    )
    line("rows deleted/s", fmt((summary?.pruned ?? 0) / seconds))
    line(
      "WAL written",
      `${fmt(walBytes / 1024 / 1024, 1)} MB (${fmt(walBytes / Math.max(1, summary?.pruned ?? 1))} B per row)`
    )
    line(
      "table + indexes before / after (autovacuum reclaims)",
      `${fmt(Number(before.bytes) / 1024 / 1024)} MB / ${fmt(Number(after.bytes) / 1024 / 1024)} MB`
    )
  }).pipe(Effect.provide(Platform))
}).pipe(Effect.scoped)

NodeRuntime.runMain(program)
