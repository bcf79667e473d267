/**
 * stuck-export-jobs on a large backlog: 100,000 queued/started project export jobs (generate_series,
 * alongside 100,000 finished/failed ones as history), Sidekiq status keys present for half of them
 * (pipelined SET … EX 21600), every 50th of the others a parallel export with relation exports, then
 * the batch through the run guard with the real layers (PostgreSQL + Redis). Prints the time of each
 * step (list, status look-up, re-read, the per-job fail transactions), Redis round trips and memory.
 *
 *   npm run bench -- stuck-export-jobs
 *   BENCH_JOBS=20000 BENCH_HISTORY=0 BENCH_SYNCHRONOUS_COMMIT=off npm run bench -- stuck-export-jobs
 *   (BENCH_DATABASE_URL, BENCH_REDIS_URL: admin database and Redis database, defaults …/test and …/12)
 */
import { NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Duration, Effect, Layer, Redacted } from "effect"
import type { Redis as IORedis } from "ioredis"
import { performance } from "node:perf_hooks"
import { SweeperConfig } from "../../src/config/Config.ts"
import { EXPORT_JOB_STATUS_TTL, JOB_STATUS_LOOKUP_SLICE, jobStatusKey } from "../../src/domain/SidekiqStatus.ts"
import { EventLogSql } from "../../src/layers/postgres/EventLogSql.ts"
import { ExportJobsSql } from "../../src/layers/postgres/ExportJobsSql.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { JobStatusRedis } from "../../src/layers/redis/JobStatusRedis.ts"
import { LeaseRedis } from "../../src/layers/redis/LeaseRedis.ts"
import { Redis } from "../../src/layers/redis/Redis.ts"
import { StuckExportJobs, type StuckExportJobsSummary } from "../../src/programs/StuckExportJobs.ts"
import { ExportJobs } from "../../src/services/ExportJobs.ts"
import { JobStatus } from "../../src/services/JobStatus.ts"
import { runBatch } from "../../src/supervisor/RunGuard.ts"
import {
  adminUrl,
  benchDatabase,
  benchRedis,
  collectGarbage,
  countingRedisCommands,
  envInt,
  fmt,
  formatCommands,
  line,
  maxRss,
  mb,
  memoryNow,
  migratedDatabase,
  redisUrl,
  samplingMemory,
  Stopwatch,
  timed
} from "../support/harness.ts"
import { BenchLogging } from "../support/logging.ts"

/** Queued/started jobs: ids 1..JOBS, odd ids have completed (no status key), even ids still run. */
const JOBS = envInt("BENCH_JOBS", 100_000)
/** Finished/failed jobs after them (the partial index must skip these). */
const HISTORY = envInt("BENCH_HISTORY", 100_000)
const PROJECTS = 1_000
/** Jobs with i % PARALLEL_EVERY = 1 (completed ones) are parallel exports with three relation exports. */
const PARALLEL_EVERY = 50
const SYNCHRONOUS_COMMIT = process.env.BENCH_SYNCHRONOUS_COMMIT
const SET_PIPELINE = 1_000

const seedRows = (now: Date) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    yield* sql`INSERT INTO namespaces (id, name, path) VALUES (1, 'bench', 'bench')`
    yield* sql`INSERT INTO projects (id, namespace_id, name, path)
      SELECT p, 1, 'project ' || p, 'project-' || p FROM generate_series(1, ${PROJECTS}) AS p`
    // jid: 24 lowercase hex (Sidekiq's format), derived from the id so Redis can be seeded alike.
    // created_at spread over the last 12 h: half of the parallel exports are younger than 6 h.
    yield* sql`
      INSERT INTO project_export_jobs (id, project_id, jid, status, user_id, created_at, updated_at)
      SELECT i, 1 + i % ${PROJECTS}, lpad(to_hex(i), 24, '0'),
        CASE WHEN i <= ${JOBS} THEN (i / 2) % 2 ELSE 2 + i % 2 END,
        1 + i % 97,
        ${now}::timestamptz - (i % 720) * interval '1 minute',
        ${now}::timestamptz - (i % 720) * interval '1 minute' + interval '10 seconds'
      FROM generate_series(1, ${JOBS + HISTORY}) AS i`
    yield* sql`
      INSERT INTO project_relation_exports (project_export_job_id, project_id, relation, status, jid)
      SELECT j.id, j.project_id, r.relation, 1, j.jid || '-' || r.relation
      FROM project_export_jobs j CROSS JOIN (VALUES ('labels'), ('milestones'), ('issues')) AS r(relation)
      WHERE j.id <= ${JOBS} AND j.id % ${PARALLEL_EVERY} = 1`
    yield* sql`SELECT setval(pg_get_serial_sequence('project_export_jobs', 'id'), ${JOBS + HISTORY})`
    yield* sql`ANALYZE project_export_jobs`
    yield* sql`ANALYZE project_relation_exports`
  })

/** Status keys of the still-running jobs (even ids), as Sidekiq keeps them for export workers. */
const seedStatusKeys = (redis: IORedis) =>
  Effect.promise(async () => {
    const ttl = Duration.toSeconds(EXPORT_JOB_STATUS_TTL)
    let keys = 0
    for (let start = 2; start <= JOBS; start += 2 * SET_PIPELINE) {
      const pipeline = redis.pipeline()
      for (let i = start; i <= JOBS && i < start + 2 * SET_PIPELINE; i += 2) {
        pipeline.set(jobStatusKey(i.toString(16).padStart(24, "0")), "1", "EX", ttl)
        keys++
      }
      const results = await pipeline.exec()
      const failed = results?.find(([error]) => error !== null)
      if (failed !== undefined) throw failed[0]
    }
    return keys
  })

/** Instrumentation around the real layers: the time of each step. */
const listTime = new Stopwatch()
const lookupTime = new Stopwatch()
const rereadTime = new Stopwatch()
const failTime = new Stopwatch()

const InstrumentedExportJobs = Layer.effect(
  ExportJobs,
  Effect.gen(function*() {
    const real = yield* ExportJobs
    return ExportJobs.of({
      listEnqueued: listTime.time(real.listEnqueued),
      firstEnqueued: real.firstEnqueued,
      findEnqueued: (ids) => rereadTime.time(real.findEnqueued(ids)),
      failMany: (jobs, now) => failTime.time(real.failMany(jobs, now))
    })
  })
).pipe(Layer.provide(ExportJobsSql))

const InstrumentedJobStatus = Layer.effect(
  JobStatus,
  Effect.gen(function*() {
    const real = yield* JobStatus
    return JobStatus.of({ ...real, completedJids: (jids) => lookupTime.time(real.completedJids(jids)) })
  })
).pipe(Layer.provide(JobStatusRedis))

const program = Effect.gen(function*() {
  const database = yield* benchDatabase(SYNCHRONOUS_COMMIT)
  const redis = yield* benchRedis
  console.log(
    `database ${database.name} on ${new URL(adminUrl).host}, redis ${redisUrl}, ` +
      `${fmt(JOBS)} queued/started jobs + ${fmt(HISTORY)} finished/failed` +
      `${SYNCHRONOUS_COMMIT === undefined ? "" : `, synchronous_commit=${SYNCHRONOUS_COMMIT}`}\n`
  )

  const Platform = Layer.mergeAll(InstrumentedExportJobs, InstrumentedJobStatus, LeaseRedis, MetricsPrometheus).pipe(
    Layer.provideMerge(EventLogSql),
    Layer.provideMerge(Layer.mergeAll(
      migratedDatabase(database.url),
      Redis.layerSingle(Redacted.make(redisUrl)),
      SweeperConfig.layerWith({ node: "bench" })
    ))
  )

  yield* Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const now = new Date()
    yield* timed("seed rows (generate_series)", seedRows(now))
    const keys = yield* timed(`seed status keys (pipelined SET EX, ${SET_PIPELINE}/trip)`, seedStatusKeys(redis))
    const byStatus = yield* sql<
      { status: number; n: string }
    >`SELECT status, count(*) AS n FROM project_export_jobs GROUP BY status ORDER BY status`
    const parallel = yield* sql<{ young: string; old: string }>`
      SELECT count(*) FILTER (WHERE created_at > ${now}::timestamptz - interval '6 hours') AS young,
        count(*) FILTER (WHERE created_at <= ${now}::timestamptz - interval '6 hours') AS old
      FROM project_export_jobs j WHERE status IN (0, 1) AND EXISTS (SELECT 1 FROM project_relation_exports r WHERE r.project_export_job_id = j.id)`
    line(
      "jobs by status",
      byStatus.map((r) => `${["queued", "started", "finished", "failed"][r.status]}=${fmt(Number(r.n))}`).join(", ")
    )
    line("status keys (still running)", keys)
    line(
      "parallel exports (queued/started)",
      `${fmt(Number(parallel[0]!.young))} younger than 6 h, ${fmt(Number(parallel[0]!.old))} older`
    )

    collectGarbage()
    const before = memoryNow()
    const cpu = process.cpuUsage()
    const start = performance.now()
    const [[result, commands], peak] = yield* runBatch(StuckExportJobs, { trigger: "manual" }).pipe(
      countingRedisCommands,
      samplingMemory(20)
    )
    const seconds = (performance.now() - start) / 1000
    const cpuUsed = process.cpuUsage(cpu)

    const summary = result.summary as StuckExportJobsSummary | null
    const after = yield* sql<
      { status: number; n: string }
    >`SELECT status, count(*) AS n FROM project_export_jobs GROUP BY status ORDER BY status`
    const events = yield* sql<{ n: string }>`
      SELECT count(*) AS n FROM sweeper_events WHERE run_id = ${result.runId} AND type = 'ExportJobFailed'`
    const finished = yield* sql<{ bytes: string }>`
      SELECT pg_column_size(data) AS bytes FROM sweeper_events WHERE run_id = ${result.runId} AND type = 'RunFinished'`

    console.log(
      `\nrun ${result.runId}: ${result.outcome}${result.reason ? ` (${result.reason})` : ""}${
        result.error ? ` ${result.error}` : ""
      }`
    )
    if (summary !== null) {
      const { failedJids, ...counts } = summary
      line("summary", `${JSON.stringify(counts)}, failedJids: ${fmt(failedJids.length)} jids`)
    }
    line("wall time", `${seconds.toFixed(2)} s`)
    line("jobs checked/s", fmt((summary?.checked ?? 0) / seconds))
    line("jobs failed/s", fmt((summary?.failed ?? 0) / seconds))
    line(
      "jobs by status after",
      after.map((r) => `${["queued", "started", "finished", "failed"][r.status]}=${fmt(Number(r.n))}`).join(", ")
    )
    line("ExportJobFailed events", Number(events[0]!.n))
    line(
      "RunFinished event data (with failedJids)",
      finished[0] === undefined ? "-" : `${fmt(Number(finished[0].bytes) / 1024)} KB (stored, compressed)`
    )
    line("Redis round trips", formatCommands(commands))
    line(
      `  MGET (slices of ${JOB_STATUS_LOOKUP_SLICE})`,
      `${fmt(commands.get("mget")?.calls ?? 0)} (expected ${fmt(Math.ceil(JOBS / JOB_STATUS_LOOKUP_SLICE))})`
    )
    console.log("time per step")
    line("  1. listEnqueued (one SELECT)", `${(listTime.totalMs / 1000).toFixed(2)} s`)
    line("  2. completedJids (MGET slices)", `${(lookupTime.totalMs / 1000).toFixed(2)} s`)
    line("  3. findEnqueued (re-read, 1000 ids/query)", `${(rereadTime.totalMs / 1000).toFixed(2)} s`)
    line(
      "  6. fail (one transaction per job)",
      `${(failTime.totalMs / 1000).toFixed(2)} s, ${fmt(failTime.calls)} calls, ` +
        `${(failTime.totalMs / Math.max(failTime.calls, 1)).toFixed(3)} ms each`
    )
    line("process CPU (user+sys)", `${((cpuUsed.user + cpuUsed.system) / 1e6).toFixed(2)} s`)
    line("RSS / heap used before the run (after GC)", `${mb(before.rss)} / ${mb(before.heapUsed)}`)
    line(`peak RSS / heap used during the run`, `${mb(peak.rss)} / ${mb(peak.heapUsed)}`)
    line("process peak RSS (whole process)", mb(maxRss()))
    console.log("")
  }).pipe(Effect.provide(Platform))
})

program.pipe(
  Effect.scoped,
  // Sweeper logs as in production (Info, JSON lines into a scratch file: support/logging.ts).
  Effect.provide(BenchLogging),
  Effect.timeout(Duration.minutes(60)),
  NodeRuntime.runMain
)
