/**
 * The stuck-builds family (drop-pending, drop-running, drop-scheduled) against GitLab's own loop,
 * "the first 100 matching rows, until the query comes back empty", on the same data: two fresh
 * databases seeded alike with BENCH_ROWS builds over 60 days (every 100th pending, every 100th + 1
 * running, every 200th + 2 scheduled, all long stale; the rest finished), and BENCH_BAD rows per
 * rule a trigger refuses to change (rows that never leave the scope).
 *
 * Both do a drop's whole work, as GitLab's `drop!` does it: the row (with `processed`), the build's
 * runner-queue row (pending) or running-build row (running) deleted, and its jobs pushed to Sidekiq
 * (PipelineProcessWorker, Ci::BuildFinishedWorker) on the same Redis.
 * Sweeper: the three programs in turn, as production runs them (StuckBuildsSql, one fenced
 * statement a page with its side effects and its jobs into the outbox, events; the relay after each
 * page). GitLab's loop: per rule, SELECT the first 100 in GitLab's order, then per build one UPDATE
 * and its queue-row DELETE in its own transaction, then its two jobs pushed (run_after_commit), a
 * refused build "doomed" with a second UPDATE, which the trigger refuses too; then the SELECT again. It stops when a re-query brings back only rows it has already tried
 * BENCH_GIVE_UP times (GitLab's own would go on until its lease expires), and prints how many
 * rows it processed against how many were distinct. Ratio: GitLab's loop time / Sweeper's.
 * Figures only.
 *
 *   BENCH_ROWS=1000000 npm run bench -- detail/stuck-builds-family
 *   BENCH_ROWS=20000 npm run bench -- detail/stuck-builds-family     (a smoke run)
 */
import { NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { DateTime, Duration, Effect, Layer, Option, Redacted } from "effect"
import type { Redis as IORedis } from "ioredis"
import { performance } from "node:perf_hooks"
import { CurrentRun } from "../../src/domain/Batch.ts"
import { queueKey, sidekiqJob } from "../../src/domain/Sidekiq.ts"
import {
  PENDING_OUTDATED,
  PENDING_STUCK,
  ruleCutoff,
  RUNNING_OUTDATED,
  SCHEDULED_OUTDATED,
  type StuckRule
} from "../../src/domain/StuckBuilds.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { RunnerAckQueueMemory } from "../../src/layers/memory/RunnerAckQueueMemory.ts"
import { EventLogSql } from "../../src/layers/postgres/EventLogSql.ts"
import { JobOutboxRelay } from "../../src/layers/postgres/JobOutbox.ts"
import { StuckBuildsSql } from "../../src/layers/postgres/StuckBuildsSql.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { JobQueueRedis } from "../../src/layers/redis/JobQueueRedis.ts"
import { Redis } from "../../src/layers/redis/Redis.ts"
import { DropPendingBuilds } from "../../src/programs/DropPendingBuilds.ts"
import { DropRunningBuilds } from "../../src/programs/DropRunningBuilds.ts"
import { DropScheduledBuilds } from "../../src/programs/DropScheduledBuilds.ts"
import { startingAt } from "../../src/supervisor/Clocks.ts"
import { benchDatabase, benchRedis, envInt, fmt, line, migratedDatabase, redisUrl } from "../support/harness.ts"
import { BenchLogging } from "../support/logging.ts"

const ROWS = envInt("BENCH_ROWS", 1_000_000)
const BAD = envInt("BENCH_BAD", 3)
const GIVE_UP = envInt("BENCH_GIVE_UP", 3)
const NOW = new Date("2026-01-02T05:00:00Z")
const BATCH = 100

const seed = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  yield* sql`
    INSERT INTO ci_builds (id, project_id, commit_id, type, status, lock_version, created_at, updated_at,
      scheduled_at)
    SELECT i, 1 + (i * 7919) % 5000, i / 20, 'Ci::Build',
      CASE WHEN i % 100 = 0 THEN 'pending' WHEN i % 100 = 1 THEN 'running' WHEN i % 200 = 2 THEN 'scheduled'
        ELSE 'success' END,
      0, ts, ts, CASE WHEN i % 200 = 2 THEN ts AT TIME ZONE 'UTC' END
    FROM (SELECT i, ${NOW}::timestamptz AT TIME ZONE 'UTC' - interval '1 day 2 hours'
      - ((${ROWS} - i) * (interval '60 days' / ${ROWS})) AS ts
      FROM generate_series(1::bigint, ${ROWS}::bigint) AS i) AS s`
  // What GitLab keeps beside a pending and a running build.
  yield* sql`INSERT INTO ci_pending_builds (build_id, project_id) SELECT id, project_id FROM ci_builds
    WHERE status = 'pending'`
  yield* sql`INSERT INTO ci_running_builds (build_id, project_id, runner_id, runner_type)
    SELECT id, project_id, 1, 1 FROM ci_builds WHERE status = 'running'`
  // The first BAD rows of each status can never be changed: a trigger refuses them.
  yield* sql.unsafe(`CREATE TABLE bench_refused AS
    SELECT id FROM (SELECT id, row_number() OVER (PARTITION BY status ORDER BY created_at, project_id, id) AS n
      FROM ci_builds WHERE status IN ('pending', 'running', 'scheduled')) AS s WHERE n <= ${BAD}`)
  yield* sql.unsafe(`CREATE FUNCTION bench_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN IF EXISTS (SELECT FROM bench_refused WHERE id = OLD.id) THEN RAISE EXCEPTION 'refused'; END IF;
    RETURN NEW; END $$`)
  yield* sql.unsafe(`CREATE TRIGGER bench_refuse BEFORE UPDATE ON ci_builds FOR EACH ROW
    EXECUTE FUNCTION bench_refuse()`)
  yield* sql`ANALYZE ci_builds`
})

const stale = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  const rows = yield* sql<{ n: string }>`SELECT count(*) AS n FROM ci_builds
    WHERE status IN ('pending', 'running', 'scheduled')`
  return Number(rows[0]!.n)
})

/** GitLab's loop for one rule: the first 100 matching, one UPDATE each, again until empty or stuck. */
const gitlabLoop = (rule: StuckRule, redis: IORedis) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    let pushes = 0
    const at = DateTime.toDateUtc(ruleCutoff(rule, DateTime.fromDateUnsafe(NOW)))
    const age = rule.timestamps === "scheduled_at"
      ? sql`scheduled_at IS NOT NULL AND scheduled_at < ${at}`
      : sql`created_at < ${at} AND updated_at < ${at}`
    const tries = new Map<number, number>()
    let processed = 0
    let queries = 0
    for (;;) {
      const page = yield* sql<{ id: string; lock_version: number }>`SELECT id, lock_version FROM ci_builds
        WHERE status = ${rule.status} AND type = 'Ci::Build' AND ${age} ORDER BY created_at, project_id LIMIT ${BATCH}`
      queries++
      if (page.length === 0) return { processed, distinct: tries.size, queries, endless: false }
      if (page.every((row) => (tries.get(Number(row.id)) ?? 0) >= GIVE_UP)) {
        return { processed, distinct: tries.size, queries, endless: true }
      }
      for (const row of page) {
        const id = Number(row.id)
        tries.set(id, (tries.get(id) ?? 0) + 1)
        processed++
        const dropped = yield* sql.withTransaction(Effect.gen(function*() {
          const updated = yield* sql<{ pipeline_id: string | null }>`UPDATE ci_builds SET status = 'failed',
            failure_reason = 3, finished_at = ${NOW}, updated_at = ${NOW}, lock_version = lock_version + 1,
            processed = coalesce(retried, false)
            WHERE id = ${id} AND lock_version = ${row.lock_version} RETURNING commit_id AS pipeline_id`
          if (updated.length === 0) return updated
          if (rule.status === "pending") yield* sql`DELETE FROM ci_pending_builds WHERE build_id = ${id}`
          if (rule.status === "running") yield* sql`DELETE FROM ci_running_builds WHERE build_id = ${id}`
          return updated
        })).pipe(
          Effect.catch(() =>
            sql`UPDATE ci_builds SET status = 'failed', failure_reason = 12 WHERE id = ${id}`.pipe(
              Effect.ignore,
              Effect.as([])
            )
          )
        )
        // After commit, as GitLab's run_after_commit: the build's two jobs, one push each.
        for (const { pipeline_id } of dropped) {
          for (const [workerClass, arg] of [["PipelineProcessWorker", pipeline_id], ["Ci::BuildFinishedWorker", id]]) {
            const job = sidekiqJob({
              workerClass: String(workerClass),
              args: [Number(arg)],
              queue: "default",
              jid: (++pushes).toString(16).padStart(24, "0"),
              nowMillis: NOW.getTime(),
              extra: { retry: 3 }
            })
            yield* Effect.promise(() => redis.lpush(queueKey("default"), JSON.stringify(job)))
          }
        }
      }
    }
  })

const asRun = (batch: string) => <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  effect.pipe(
    startingAt(NOW),
    Effect.provideService(CurrentRun, {
      runId: null,
      batch,
      dryRun: false,
      budget: Option.some(Duration.hours(1)),
      fence: Option.none()
    })
  )

const program = Effect.gen(function*() {
  const redis = yield* benchRedis
  const sweeperDb = yield* benchDatabase(undefined)
  const gitlabDb = yield* benchDatabase(undefined)
  console.log(`${fmt(ROWS)} builds, ${BAD} refused rows per status, databases ${sweeperDb.name} / ${gitlabDb.name}\n`)

  const sweeper = yield* Effect.gen(function*() {
    yield* seed
    const before = yield* stale
    const start = performance.now()
    const summaries = [
      yield* DropPendingBuilds.run.pipe(asRun(DropPendingBuilds.name)),
      yield* DropRunningBuilds.run.pipe(asRun(DropRunningBuilds.name)),
      yield* DropScheduledBuilds.run.pipe(asRun(DropScheduledBuilds.name))
    ]
    const seconds = (performance.now() - start) / 1000
    const dropped = summaries.reduce((n, s) => n + s.dropped, 0)
    const refused = summaries.reduce((n, s) => n + s.refused, 0)
    line("stale builds before", before)
    line("Sweeper: dropped", dropped)
    line("Sweeper: refused, counted and passed", refused)
    line("Sweeper: stale builds left", yield* stale)
    line("Sweeper: wall time", `${seconds.toFixed(2)} s (${fmt(dropped / seconds)} builds/s)`)
    return seconds
  }).pipe(
    Effect.provide(
      // No build here awaits a runner's acknowledgement: the in-memory queue stands in for that.
      // The drops' jobs go to the bench's Redis through the production relay, as GitLab's loop's do.
      Layer.mergeAll(
        StuckBuildsSql.pipe(
          Layer.provide(JobOutboxRelay({ recover: false })),
          Layer.provide(JobQueueRedis.pipe(Layer.provide(Redis.layerSingle(Redacted.make(redisUrl)))))
        ),
        RunnerAckQueueMemory.pipe(Layer.provide(MemoryRedis.layer))
      ).pipe(
        Layer.provideMerge(MetricsPrometheus),
        Layer.provideMerge(EventLogSql),
        Layer.provideMerge(migratedDatabase(sweeperDb.url))
      )
    )
  )
  const sweeperJobs = yield* Effect.promise(() => redis.llen(queueKey("default")))
  line("Sweeper: jobs pushed", sweeperJobs)
  yield* Effect.promise(() => redis.flushdb())

  const gitlab = yield* Effect.gen(function*() {
    yield* seed
    const start = performance.now()
    const loops = []
    for (const rule of [PENDING_OUTDATED, PENDING_STUCK, RUNNING_OUTDATED, SCHEDULED_OUTDATED]) {
      loops.push({ rule: rule.name, ...(yield* gitlabLoop(rule, redis)) })
    }
    const seconds = (performance.now() - start) / 1000
    for (const loop of loops) {
      line(
        `GitLab loop ${loop.rule}`,
        `${fmt(loop.processed)} processed, ${fmt(loop.distinct)} distinct, ${fmt(loop.queries)} queries` +
          (loop.endless ? `, NEVER EMPTY (stopped after ${GIVE_UP} tries of the same head)` : "")
      )
    }
    line("GitLab loop: stale builds left", yield* stale)
    line("GitLab loop: jobs pushed", yield* Effect.promise(() => redis.llen(queueKey("default"))))
    line("GitLab loop: wall time", `${seconds.toFixed(2)} s`)
    return seconds
  }).pipe(Effect.provide(migratedDatabase(gitlabDb.url)))

  line("ratio GitLab loop / Sweeper (wall time)", `${(gitlab / sweeper).toFixed(2)}×`)
})

program.pipe(
  Effect.scoped,
  Effect.provide(BenchLogging),
  Effect.timeout(Duration.minutes(60)),
  NodeRuntime.runMain
)
