/**
 * Backlog sampled on a timer (issue 19 point 3). Each batch has one bounded reader:
 *
 * - drop-canceling-builds: canceling builds past the 1 h cutoff, the first BACKLOG_CAP + 1 of the
 *   canceling index (the scan's own partial index), due since max(created_at, updated_at) + 1 h;
 * - stuck-export-jobs: the first BACKLOG_CAP + 1 queued/started jobs (partial index on status),
 *   of which those whose Sidekiq status key is gone (one batched MGET), due since updated_at;
 * - delete-stale-direct-uploads: HLEN, then at most BACKLOG_CAP entries of HSCAN (never the whole
 *   hash), stale ones due since prepared + 3 h; more entries than the sample means "more than";
 * - reschedule-stuck-issue-rebalances: the running-rebalances set (GitLab caps it at a handful);
 *   the set holds no times, so no age;
 * - concurrency-limit-resume: per worker with deferred jobs, LLEN and the head's `buffered_at`;
 * - prune-events: nothing waits on GitLab's side;
 * - the stuck-builds family: each rule's own first page of BACKLOG_CAP + 1 (programs/Drop*Builds.ts).
 *
 * "Oldest" is how long the oldest thing has been due for a repair, so a backlog the batch keeps up
 * with stays under one period whatever the batch's threshold (3 h for uploads, 1 h for builds).
 * The sample is refreshed every BACKLOG_REFRESH by one fiber, never per request; the gauges
 * `sweeper_backlog{batch}` and `sweeper_backlog_oldest_seconds{batch}` exist from start-up (0).
 */
import { PgClient } from "@effect/sql-pg"
import { DateTime, Duration, Effect, Layer, Metric, Option, Ref, Result, Schedule, Stream } from "effect"
import { CANCELING_TIMEOUT } from "../domain/Build.ts"
import { parseDeferred, workerKeys } from "../domain/ConcurrencyLimit.ts"
import { parseEntry, STALE_AFTER } from "../domain/DirectUpload.ts"
import { describeError } from "../domain/Errors.ts"
import { parseRunningRebalances } from "../domain/Rebalancing.ts"
import { MemoryRedis } from "../layers/memory/MemoryRedis.ts"
import { detectBuildsTable } from "../layers/postgres/DatabaseSchema.ts"
import { SharedStateRedis } from "../layers/redis/Redis.ts"
import { dropPendingBuildsBacklog } from "../programs/DropPendingBuilds.ts"
import { dropRunningBuildsBacklog } from "../programs/DropRunningBuilds.ts"
import { dropScheduledBuildsBacklog } from "../programs/DropScheduledBuilds.ts"
import { batchNames } from "../programs/index.ts"
import { Backlog, BACKLOG_CAP, type BacklogPart, type BacklogSnapshot, type BatchBacklog } from "../services/Backlog.ts"
import { ConcurrencyLimits } from "../services/ConcurrencyLimits.ts"
import { JobStatus } from "../services/JobStatus.ts"
import { Metrics, setGauge } from "../services/Metrics.ts"
import { PendingDirectUploads } from "../services/PendingDirectUploads.ts"
import { RebalancingState } from "../services/RebalancingState.ts"
import { StuckBuilds } from "../services/StuckBuilds.ts"

export const backlogGauge = Metric.gauge("sweeper_backlog", {
  description: "What waits for each batch's repair now (a capped count: at the cap, more wait)"
})
export const backlogOldestSeconds = Metric.gauge("sweeper_backlog_oldest_seconds", {
  description: "How long the oldest thing waiting for each batch's repair has been due, seconds (0 when nothing waits)"
})

/** Often enough for a dashboard, rare enough that the reads cost nothing measurable. */
export const BACKLOG_REFRESH = Duration.seconds(30)
/** One batch's reads; a slow store shows as that batch's error, never delays the others. */
const READ_TIMEOUT = Duration.seconds(5)

/** The first element of a worker's deferred list (its oldest job), exact bytes; null when empty. */
export type DeferredHead = (worker: string) => Effect.Effect<Uint8Array | null, unknown>

const WHAT: Record<string, string> = {
  "drop-canceling-builds": "canceling builds past the 1 h cutoff",
  "stuck-export-jobs": "queued or started export jobs whose Sidekiq job is gone",
  "delete-stale-direct-uploads": "pending direct uploads older than 3 h",
  "reschedule-stuck-issue-rebalances": "issue rebalances marked running",
  "concurrency-limit-resume": "deferred jobs, per worker",
  "prune-events": "nothing (Sweeper's own event log)",
  "drop-pending-builds": "pending builds past a day, or past an hour with no online runner",
  "drop-running-builds": "running builds with no update for an hour",
  "drop-scheduled-builds": "delayed builds an hour past their scheduled time"
}

const part = (label: string, count: number, capped: boolean, oldestMs: number | null): BacklogPart => ({
  label,
  count,
  capped,
  oldestAt: oldestMs === null ? null : new Date(oldestMs)
})

const total = (batch: string, parts: ReadonlyArray<BacklogPart>): BatchBacklog => {
  const times = parts.flatMap((p) => p.oldestAt === null ? [] : [p.oldestAt.getTime()])
  return {
    batch,
    what: WHAT[batch] ?? batch,
    count: parts.reduce((sum, p) => sum + p.count, 0),
    capped: parts.some((p) => p.capped),
    oldestAt: times.length === 0 ? null : new Date(Math.min(...times)),
    parts,
    error: null
  }
}

/** The readers, given the services; `refresh` samples them all concurrently. */
export const makeBacklog = Effect.fnUntraced(function*(head: DeferredHead) {
  // Captured once: `refresh` runs from the timer and after each run, outside any layer's context.
  const metrics = yield* Metrics
  const sql = yield* PgClient.PgClient
  const jobStatus = yield* JobStatus
  const uploads = yield* PendingDirectUploads
  const rebalancing = yield* RebalancingState
  const limits = yield* ConcurrencyLimits
  const stuck = yield* StuckBuilds
  const builds = yield* detectBuildsTable.pipe(Effect.provideService(PgClient.PgClient, sql), Effect.orDie)
  const nowMs = Effect.map(DateTime.now, DateTime.toEpochMillis)
  /**
   * A read on GitLab's tables that PostgreSQL itself stops after 2 s: on a database without the
   * index the batch's scan wants (`sweeper doctor` recommends it), a backlog read must not become a
   * scan of the table every 30 s; the card then says it timed out.
   */
  const bounded = <A, E>(read: Effect.Effect<A, E>) =>
    sql.withTransaction(Effect.andThen(sql`SET LOCAL statement_timeout = '2s'`, read))

  const readers: Record<string, Effect.Effect<ReadonlyArray<BacklogPart>, unknown, never>> = {
    "drop-canceling-builds": Effect.gen(function*() {
      const cutoff = new Date((yield* nowMs) - Duration.toMillis(CANCELING_TIMEOUT))
      const rows = yield* bounded(sql<{ n: string; oldest: number | null }>`
        SELECT count(*) AS n, extract(epoch FROM min(greatest(created_at, updated_at)))::float8 AS oldest FROM (
          SELECT created_at, updated_at FROM ${sql(builds.name)}
          WHERE status = 'canceling' AND type = 'Ci::Build' AND created_at < ${cutoff} AND updated_at < ${cutoff}
          ORDER BY created_at LIMIT ${BACKLOG_CAP + 1}) first`)
      const n = Number(rows[0]?.n ?? 0)
      const oldest = rows[0]?.oldest ?? null
      return [
        part(
          "canceling builds",
          Math.min(n, BACKLOG_CAP),
          n > BACKLOG_CAP,
          oldest === null ? null : oldest * 1000 + Duration.toMillis(CANCELING_TIMEOUT)
        )
      ]
    }),
    "stuck-export-jobs": Effect.gen(function*() {
      const rows = yield* bounded(sql<{ jid: string; updated: number }>`
        SELECT jid, extract(epoch FROM updated_at)::float8 AS updated FROM project_export_jobs
        WHERE status IN (0, 1) ORDER BY id LIMIT ${BACKLOG_CAP + 1}`)
      const sample = rows.slice(0, BACKLOG_CAP)
      const completed = new Set(yield* jobStatus.completedJids(sample.map((r) => r.jid)))
      const stuck = sample.filter((r) => completed.has(r.jid))
      const oldest = stuck.length === 0 ? null : Math.min(...stuck.map((r) => r.updated)) * 1000
      return [part("export jobs", stuck.length, rows.length > BACKLOG_CAP, oldest)]
    }),
    "delete-stale-direct-uploads": Effect.gen(function*() {
      const now = yield* nowMs
      const entries = yield* uploads.count
      const sample = yield* Stream.runCollect(Stream.take(uploads.scan({ pageSize: BACKLOG_CAP }), BACKLOG_CAP))
      let stale = 0
      let oldest: number | null = null
      for (const raw of sample) {
        const parsed = parseEntry(raw)
        if (Result.isFailure(parsed)) continue
        const dueMs = parsed.success.preparedAt * 1000 + Duration.toMillis(STALE_AFTER)
        if (dueMs > now) continue
        stale++
        oldest = oldest === null ? dueMs : Math.min(oldest, dueMs)
      }
      return [part("stale entries", stale, entries > sample.length, oldest)]
    }),
    "reschedule-stuck-issue-rebalances": Effect.gen(function*() {
      const running = parseRunningRebalances(yield* rebalancing.runningMembers)
      return [part("running rebalances", running.namespaceIds.length + running.projectIds.length, false, null)]
    }),
    "concurrency-limit-resume": Effect.gen(function*() {
      const workers = yield* limits.workersWithDeferredJobs
      return yield* Effect.forEach(workers.slice(0, 50), (worker) =>
        Effect.gen(function*() {
          const size = yield* limits.queueSize(worker)
          const first = yield* head(worker)
          const job = first === null ? Option.none() : parseDeferred(first)
          const buffered = Option.isSome(job) && typeof job.value.buffered_at === "number"
            ? job.value.buffered_at * 1000
            : null
          return part(worker, size, false, size === 0 ? null : buffered)
        }), { concurrency: 4 })
    }),
    "prune-events": Effect.succeed([]),
    "drop-pending-builds": Effect.provideService(dropPendingBuildsBacklog, StuckBuilds, stuck),
    "drop-running-builds": Effect.provideService(dropRunningBuildsBacklog, StuckBuilds, stuck),
    "drop-scheduled-builds": Effect.provideService(dropScheduledBuildsBacklog, StuckBuilds, stuck)
  }

  const sample = (batch: string) => {
    const reader = readers[batch] ?? Effect.succeed([])
    return reader.pipe(
      Effect.timeoutOrElse({ duration: READ_TIMEOUT, orElse: () => Effect.fail("timed out after 5 s") }),
      Effect.map((parts) => total(batch, parts)),
      Effect.catchCause((cause) => Effect.succeed({ ...total(batch, []), error: describeError(cause) }))
    )
  }

  const state = yield* Ref.make<BacklogSnapshot>({ sampledAt: null, batches: batchNames.map((b) => total(b, [])) })

  const refresh = Effect.gen(function*() {
    const batches = yield* Effect.forEach(batchNames, sample, { concurrency: 3 })
    const now = yield* nowMs
    for (const b of batches) {
      yield* setGauge(backlogGauge, b.count, { batch: b.batch })
      yield* setGauge(
        backlogOldestSeconds,
        b.oldestAt === null ? 0 : Math.max(0, (now - b.oldestAt.getTime()) / 1000),
        { batch: b.batch }
      )
    }
    const snapshot = { sampledAt: new Date(now), batches }
    yield* Ref.set(state, snapshot)
    return snapshot
  }).pipe(Effect.withSpan("Backlog.refresh"), Effect.provideService(Metrics, metrics))

  return Backlog.of({ current: Ref.get(state), refresh })
})

/** The gauges at 0 for every batch, so a scrape before the first sample already has the series. */
const initialGauges = Effect.forEach(
  batchNames,
  (batch) => Effect.andThen(setGauge(backlogGauge, 0, { batch }), setGauge(backlogOldestSeconds, 0, { batch })),
  { discard: true }
)

/** The service plus its timer: samples at start and every BACKLOG_REFRESH in a scoped fiber. */
const withTimer = <E, R>(make: Effect.Effect<Backlog["Service"], E, R>) =>
  Layer.effect(
    Backlog,
    Effect.gen(function*() {
      yield* initialGauges
      const backlog = yield* make
      yield* Effect.forkScoped(Effect.repeat(backlog.refresh, Schedule.spaced(BACKLOG_REFRESH)))
      return backlog
    })
  )

/**
 * The head of a deferred list, read from the SharedState Redis when there is one, else from the
 * embedded in-memory Redis: the one read the ConcurrencyLimits contract has no method for.
 */
const deferredHead = Effect.gen(function*() {
  const shared = yield* Effect.serviceOption(SharedStateRedis)
  if (Option.isSome(shared)) {
    return ((worker) =>
      shared.value.use(
        "LINDEX deferred 0",
        (client) => client.lindexBuffer(workerKeys(worker).deferred, 0)
      )) satisfies DeferredHead
  }
  const memory = yield* Effect.serviceOption(MemoryRedis)
  if (Option.isSome(memory)) {
    return ((worker) =>
      Effect.sync(() => memory.value.lrangeBuffer(workerKeys(worker).deferred, 0, 0)[0] ?? null)) satisfies DeferredHead
  }
  return ((_worker) => Effect.succeed(null)) satisfies DeferredHead
})

/** On PostgreSQL and the Redis in use (real stores or the embedded in-memory one). */
export const BacklogLive = withTimer(Effect.flatMap(deferredHead, makeBacklog))

/** Fixed readings, for specs of what shows the backlog: `BacklogMemory.layer(snapshot)`. */
export const BacklogMemory = {
  layer: (snapshot: BacklogSnapshot) =>
    Layer.effect(
      Backlog,
      Effect.gen(function*() {
        const state = yield* Ref.make(snapshot)
        return Backlog.of({ current: Ref.get(state), refresh: Ref.get(state) })
      })
    )
}
