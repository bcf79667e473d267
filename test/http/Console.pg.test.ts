/**
 * The console's reads on real PostgreSQL: a run's repairs page by keyset to the last of
 * 10 000 and none of another run's; a run's repairs are the repaired items its RunFinished says;
 * the history windows hold exactly the runs finished in them; the backlog's bounded reads count what
 * waits (capped beyond BACKLOG_CAP) and put it on /metrics.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { randomUUID } from "node:crypto"
import { SweeperConfig } from "../../src/config/Config.ts"
import { workerKeys } from "../../src/domain/ConcurrencyLimit.ts"
import { jobStatusKey } from "../../src/domain/SidekiqStatus.ts"
import { readHistory, readRun } from "../../src/http/ConsoleApi.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { ObjectStorageMemory } from "../../src/layers/memory/ObjectStorageMemory.ts"
import { RunHistorySql } from "../../src/layers/postgres/RunHistorySql.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { Backlog, BACKLOG_CAP } from "../../src/services/Backlog.ts"
import { prometheusText } from "../../src/services/Metrics.ts"
import { RunHistory } from "../../src/services/RunHistory.ts"
import { MemoryBackends, RepairSteps, SqlBackends } from "../../src/supervisor/App.ts"
import { BacklogLive } from "../../src/views/Backlog.ts"
import { PgTest } from "../support/postgres.ts"

const Console = Layer.mergeAll(RunHistorySql, BacklogLive).pipe(
  // The batches' own services: each batch's backlog is read through them.
  Layer.provideMerge(RepairSteps),
  Layer.provideMerge(Layer.mergeAll(SqlBackends.pipe(Layer.provideMerge(MemoryBackends)), ObjectStorageMemory())),
  Layer.provideMerge(MetricsPrometheus),
  Layer.provideMerge(
    SweeperConfig.layerWith({ concurrencyLimits: { "Releases::CreateEvidenceWorker": { limit: 3, queue: "default" } } })
  ),
  Layer.provideMerge(PgTest)
)

/** A finished run of `batch`: RunStarted, `repairs` BuildDropped in statements of `perStatement`, RunFinished. */
const seedRun = Effect.fn(function*(options: {
  readonly batch: string
  readonly repairs: number
  readonly perStatement?: number
  readonly finishedAgoMs?: number
  readonly firstBuild?: number
}) {
  const sql = yield* PgClient.PgClient
  const runId = randomUUID()
  const finished = new Date(Date.now() - (options.finishedAgoMs ?? 0))
  const started = new Date(finished.getTime() - 1000)
  const stream = `batch:${options.batch}`
  yield* sql`INSERT INTO sweeper_events (stream, type, data, run_id, occurred_at) VALUES
    (${stream}, 'RunStarted', ${
    sql.json({
      batch: options.batch,
      run_id: runId,
      scheduled_at: null,
      node: "test",
      trigger: "manual",
      dryRun: false
    })
  }, ${runId}, ${started})`
  const per = options.perStatement ?? 1000
  const first = options.firstBuild ?? 1
  for (let start = 0; start < options.repairs; start += per) {
    const count = Math.min(per, options.repairs - start)
    yield* sql`INSERT INTO sweeper_events (stream, type, data, run_id, occurred_at)
      SELECT 'build:' || g, CASE WHEN g % 10 = 0 THEN 'BuildDoomed' ELSE 'BuildDropped' END,
        jsonb_build_object('id', g, 'project_id', 1, 'runner_id', null, 'failure_reason', 3), ${runId}::uuid, ${started}::timestamptz
      FROM generate_series(${first + start}::bigint, ${first + start + count - 1}::bigint) g`
  }
  yield* sql`INSERT INTO sweeper_events (stream, type, data, run_id, occurred_at) VALUES
    (${stream}, 'RunFinished', ${
    sql.json({
      batch: options.batch,
      outcome: "succeeded",
      summary: { dropped: options.repairs },
      duration_ms: 1000,
      dryRun: false,
      repaired: options.repairs
    })
  }, ${runId}, ${finished})`
  return runId
})

describe("console reads on PostgreSQL", () => {
  it.live(
    "a run of 10 000 repairs pages by keyset, to exactly its repairs, filterable by type",
    () =>
      Effect.gen(function*() {
        const big = yield* seedRun({ batch: "drop-canceling-builds", repairs: 10_000, perStatement: 700 })
        // Another run's repairs, appended after: never on the first run's pages.
        const other = yield* seedRun({ batch: "drop-canceling-builds", repairs: 50, firstBuild: 20_000 })

        const first = yield* readRun(big, {})
        assert.isNotNull(first)
        assert.strictEqual(first!.run.outcome, "succeeded")
        assert.strictEqual(first!.run.trigger, "manual")
        assert.strictEqual(first!.run.repairs, 10_000, "the run's repaired items, as its RunFinished says")
        assert.lengthOf(first!.page.events, 100)

        const seen = new Set<number>()
        let after: number | undefined = undefined
        let pages = 0
        for (;;) {
          const found: Effect.Success<ReturnType<typeof readRun>> = yield* readRun(big, { after, limit: 1000 })
          pages++
          for (const event of found!.page.events) {
            assert.strictEqual(event.runId, big)
            assert.isFalse(seen.has(event.id))
            if (after !== undefined) assert.isAbove(event.id, after)
            seen.add(event.id)
          }
          const next: number | null = found!.page.next
          if (next === null) break
          after = next
        }
        assert.strictEqual(seen.size, 10_000)
        assert.strictEqual(pages, 10)

        const doomed = yield* readRun(big, { type: "BuildDoomed", limit: 1000 })
        assert.lengthOf(doomed!.page.events, 1000)
        assert.isTrue(doomed!.page.events.every((e) => e.type === "BuildDoomed"))
        assert.isNull(doomed!.page.next)

        const small = yield* readRun(other, {})
        assert.strictEqual(small!.run.repairs, 50)
        assert.deepStrictEqual(
          small!.page.events.map((e) => e.stream),
          Array.from({ length: 50 }, (_, i) => `build:${20_000 + i}`)
        )
        assert.isNull(yield* readRun(randomUUID(), {}))
        assert.isNull(yield* readRun("not-a-uuid", {}))
      }).pipe(Effect.provide(Console)),
    120_000
  )

  it.live(
    "history windows hold the runs finished in them, oldest first, with their repairs",
    () =>
      Effect.gen(function*() {
        const hour = 3600_000
        const runs = [
          yield* seedRun({ batch: "stuck-export-jobs", repairs: 3, finishedAgoMs: 40 * 24 * hour }),
          yield* seedRun({ batch: "stuck-export-jobs", repairs: 2, finishedAgoMs: 10 * 24 * hour }),
          yield* seedRun({ batch: "stuck-export-jobs", repairs: 1, finishedAgoMs: 2 * 24 * hour }),
          yield* seedRun({ batch: "stuck-export-jobs", repairs: 0, finishedAgoMs: hour })
        ]
        yield* seedRun({ batch: "drop-canceling-builds", repairs: 5, finishedAgoMs: hour })
        const day = yield* readHistory("stuck-export-jobs", "24h")
        const week = yield* readHistory("stuck-export-jobs", "7d")
        const month = yield* readHistory("stuck-export-jobs", "30d")
        assert.deepStrictEqual(day.runs.map((r) => r.runId), [runs[3]])
        assert.deepStrictEqual(week.runs.map((r) => r.runId), [runs[2], runs[3]])
        assert.deepStrictEqual(month.runs.map((r) => [r.runId, r.repairs]), [[runs[1], 2], [runs[2], 1], [runs[3], 0]])
        assert.isTrue(month.runs.every((r) => r.outcome === "succeeded" && r.durationMs === 1000))
      }).pipe(Effect.provide(Console)),
    60_000
  )

  it.live("backlog: what waits per batch, the oldest's due time, capped counts, gauges", () =>
    Effect.gen(function*() {
      const sql = yield* PgClient.PgClient
      const redis = yield* MemoryRedis
      const now = Date.now()
      // Builds: BACKLOG_CAP + 5 stuck (two hours old), one fresh (ten minutes).
      yield* sql`INSERT INTO ci_builds (project_id, status, created_at, updated_at)
        SELECT 1, 'canceling', (now() AT TIME ZONE 'UTC') - interval '2 hours' - g * interval '1 second', (now() AT TIME ZONE 'UTC') - interval '2 hours'
        FROM generate_series(1, ${BACKLOG_CAP + 5}) g`
      yield* sql`INSERT INTO ci_builds (project_id, status, created_at, updated_at)
        VALUES (1, 'canceling', (now() AT TIME ZONE 'UTC') - interval '10 minutes', (now() AT TIME ZONE 'UTC') - interval '10 minutes')`
      // The family: one running build three hours stale (due 2 h ago), one running build fresh; a
      // pending build two hours old (no runner at all: stuck, due 1 h ago); a delayed build past due.
      yield* sql`INSERT INTO ci_builds (project_id, status, created_at, updated_at, scheduled_at) VALUES
        (1, 'running', (now() AT TIME ZONE 'UTC') - interval '3 hours', (now() AT TIME ZONE 'UTC') - interval '3 hours', NULL),
        (1, 'running', (now() AT TIME ZONE 'UTC') - interval '5 minutes', (now() AT TIME ZONE 'UTC') - interval '5 minutes', NULL),
        (1, 'pending', (now() AT TIME ZONE 'UTC') - interval '2 hours', (now() AT TIME ZONE 'UTC') - interval '2 hours', NULL),
        (1, 'scheduled', (now() AT TIME ZONE 'UTC') - interval '1 day', (now() AT TIME ZONE 'UTC') - interval '1 day', now() - interval '2 hours')`
      // Export jobs: two whose Sidekiq job is gone (stuck), one still tracked.
      yield* sql`INSERT INTO namespaces (id) VALUES (1)`
      yield* sql`INSERT INTO projects (id, namespace_id) VALUES (1, 1)`
      yield* sql`INSERT INTO project_export_jobs (project_id, jid, status, created_at, updated_at) VALUES
        (1, 'gone-1', 0, now() - interval '3 hours', now() - interval '3 hours'),
        (1, 'gone-2', 1, now() - interval '1 hour', now() - interval '1 hour'),
        (1, 'tracked', 1, now() - interval '5 hours', now() - interval '5 hours')`
      redis.set(jobStatusKey("tracked"), "1", { exSeconds: 600 })
      // A parallel export an hour old whose main worker is gone: inside its 6 h grace, the run leaves it.
      const [parallel] = yield* sql<{ id: number }>`INSERT INTO project_export_jobs
        (project_id, jid, status, created_at, updated_at)
        VALUES (1, 'gone-parallel', 1, now() - interval '1 hour', now() - interval '1 hour') RETURNING id`
      yield* sql`INSERT INTO project_relation_exports
        (project_export_job_id, project_id, relation, status, jid, created_at, updated_at)
        VALUES (${parallel!.id}, 1, 'issues', 1, 'relation-1', now(), now())`
      // Uploads: one stale (prepared 4 h ago: due 1 h ago), one fresh.
      redis.hset("pending_direct_uploads", {
        "uploads:tmp/old": String(Math.floor(now / 1000) - 4 * 3600),
        "uploads:tmp/new": String(Math.floor(now / 1000) - 60)
      })
      // Deferred jobs of one worker, the oldest buffered 10 minutes ago.
      const deferred = workerKeys("Releases::CreateEvidenceWorker").deferred
      redis.rpush(
        deferred,
        ...[600, 300, 10].map((age) => JSON.stringify({ args: [1], context: {}, buffered_at: now / 1000 - age }))
      )
      // Namespace 1 and project 1 exist; project 9 is gone, and its run never reschedules it.
      redis.sadd("gitlab:issues-position-rebalances:running_rebalances", "1/1", "2/1", "2/9")

      const snapshot = yield* (yield* Backlog).refresh
      const of = (batch: string) => snapshot.batches.find((b) => b.batch === batch)!
      const near = (at: Date | null, expected: number, what: string) => {
        assert.isNotNull(at, what)
        assert.isBelow(Math.abs(at!.getTime() - expected), 5000, what)
      }

      assert.deepInclude(of("drop-canceling-builds"), { count: BACKLOG_CAP, capped: true, error: null })
      near(of("drop-canceling-builds").oldestAt, now - 3600_000, "builds due since their updated_at + 1 h")
      assert.deepInclude(of("stuck-export-jobs"), { count: 2, capped: false })
      near(of("stuck-export-jobs").oldestAt, now - 3 * 3600_000, "export job due since updated_at")
      assert.deepInclude(of("delete-stale-direct-uploads"), { count: 1, capped: false })
      near(of("delete-stale-direct-uploads").oldestAt, now - 3600_000, "upload due 3 h after prepared")
      assert.deepInclude(of("concurrency-limit-resume"), { count: 3, capped: false })
      near(of("concurrency-limit-resume").oldestAt, now - 600_000, "oldest buffered_at")
      assert.strictEqual(of("reschedule-stuck-issue-rebalances").count, 2)
      assert.deepInclude(of("prune-events"), { count: 0, oldestAt: null })
      assert.deepInclude(of("drop-running-builds"), { count: 1, capped: false, error: null })
      near(of("drop-running-builds").oldestAt, now - 2 * 3600_000, "running build due an hour after its update")
      assert.deepInclude(of("drop-pending-builds"), { count: 1, error: null })
      near(of("drop-pending-builds").oldestAt, now - 3600_000, "pending build stuck an hour after its update")
      assert.deepInclude(of("drop-scheduled-builds"), { count: 1, error: null })

      const text = yield* prometheusText
      assert.include(text, `sweeper_backlog{batch="drop-canceling-builds"} ${BACKLOG_CAP}`)
      assert.include(text, `sweeper_backlog{batch="stuck-export-jobs"} 2`)
      assert.include(text, `sweeper_backlog_capped{batch="drop-canceling-builds"} 1`)
      assert.include(text, `sweeper_backlog_capped{batch="stuck-export-jobs"} 0`)
      assert.include(text, `sweeper_backlog_stale{batch="concurrency-limit-resume"} 0`)
      const oldest = /sweeper_backlog_oldest_seconds\{batch="stuck-export-jobs"\} ([\d.]+)/.exec(text)
      assert.isNotNull(oldest)
      assert.approximately(Number(oldest![1]), 3 * 3600, 10)
      // `current` is the sample, read from memory.
      assert.deepStrictEqual(yield* (yield* Backlog).current, snapshot)
    }).pipe(Effect.provide(Console)), 60_000)

  it.live(
    "the history read stays bounded: at most the newest HISTORY_MAX_RUNS runs of the window",
    () =>
      Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        // 2100 runs in the last day, straight into the rollup's source (RunStarted/RunFinished pairs).
        yield* sql`INSERT INTO sweeper_events (stream, type, data, run_id, occurred_at)
        SELECT 'batch:concurrency-limit-resume', t, jsonb_build_object('batch', 'concurrency-limit-resume', 'outcome', 'succeeded', 'duration_ms', 5),
          md5(g::text)::uuid, now() - (g * interval '30 seconds')
        FROM generate_series(1, 2100) g, unnest(ARRAY['RunStarted', 'RunFinished']) t`
        const day = yield* (yield* RunHistory).history("concurrency-limit-resume", new Date(Date.now() - 24 * 3600_000))
        assert.lengthOf(day, 2000)
        // The newest are kept: the oldest kept finished about 2000 × 30 s ago.
        assert.isBelow(Date.now() - day[0]!.finishedAt.getTime(), 2001 * 30_000)
      }).pipe(Effect.provide(Console)),
    60_000
  )
})
