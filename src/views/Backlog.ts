/**
 * The backlog sampler. It re-derives no batch's rules: each batch's figure is its own reader's
 * (`Batch.backlog`, in `src/programs/<Program>Backlog.ts`), which reads with the batch's own query
 * and judges with the domain decision the run repairs by, capped at BACKLOG_CAP; a batch without a
 * reader (prune-events: nothing waits on GitLab's side) shows nothing waiting.
 *
 * "Oldest" is how long the oldest thing has been due for a repair, so a backlog the batch keeps up
 * with stays under one period whatever the batch's threshold (3 h for uploads, 1 h for builds).
 * The sample is refreshed every BACKLOG_REFRESH by one fiber, and for a batch whose run just
 * finished, never per request; the gauges `sweeper_backlog{batch}`,
 * `sweeper_backlog_oldest_seconds{batch}`, `sweeper_backlog_capped{batch}` and
 * `sweeper_backlog_stale{batch}` exist from start-up (0).
 */
import { PgClient } from "@effect/sql-pg"
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Metric from "effect/Metric"
import * as Ref from "effect/Ref"
import * as Schedule from "effect/Schedule"
import type { BacklogPart, BacklogReading } from "../domain/Backlog.ts"
import { describeError } from "../domain/Errors.ts"
import { batches, batchNames, type RegisteredBatch } from "../programs/index.ts"
import { Backlog, type BacklogSnapshot, type BatchBacklog } from "../services/Backlog.ts"
import { Metrics, setGauge } from "../services/Metrics.ts"
import type { PlatformServices } from "../services/Platform.ts"

export const backlogGauge = Metric.gauge("sweeper_backlog", {
  description: "What waits for each batch's repair now (a capped count: at the cap, more wait)"
})
export const backlogOldestSeconds = Metric.gauge("sweeper_backlog_oldest_seconds", {
  description: "How long the oldest thing waiting for each batch's repair has been due, seconds (0 when nothing waits)"
})

export const backlogCapped = Metric.gauge("sweeper_backlog_capped", {
  description: "1 when each batch's backlog read stopped at its cap: more wait than sweeper_backlog says"
})
export const backlogStale = Metric.gauge("sweeper_backlog_stale", {
  description:
    "1 when each batch's backlog rests on old knowledge (e.g. a keyspace sweep not yet through): it may miss some"
})

/** Often enough for a dashboard, rare enough that the reads cost nothing measurable. */
export const BACKLOG_REFRESH = Duration.seconds(30)
/** One batch's reads; a slow store shows as that batch's error, never delays the others. */
const READ_TIMEOUT = Duration.seconds(5)

const WHAT: Record<string, string> = {
  "drop-canceling-builds": "canceling builds past the 1 h cutoff",
  "stuck-export-jobs": "queued or started export jobs whose Sidekiq job is gone",
  "delete-stale-direct-uploads": "pending direct uploads older than 3 h",
  "reschedule-stuck-issue-rebalances": "issue rebalances marked running, of containers that still exist",
  "concurrency-limit-resume": "deferred jobs, per worker",
  "prune-events": "nothing (Sweeper's own event log)",
  "drop-pending-builds": "pending builds past a day, or past an hour with no online runner",
  "drop-running-builds": "running builds with no update for an hour",
  "drop-scheduled-builds": "delayed builds an hour past their scheduled time"
}

const total = (batch: string, reading: BacklogReading): BatchBacklog => {
  const parts: ReadonlyArray<BacklogPart> = reading.parts
  const times = parts.flatMap((p) => p.oldestAt === null ? [] : [p.oldestAt.getTime()])
  return {
    batch,
    what: WHAT[batch] ?? batch,
    count: parts.reduce((sum, p) => sum + p.count, 0),
    capped: (reading.capped ?? false) || parts.some((p) => p.capped),
    oldestAt: times.length === 0 ? null : new Date(Math.min(...times)),
    parts,
    stale: reading.stale ?? false,
    note: reading.note ?? null,
    error: null
  }
}

const nothing: BacklogReading = { parts: [] }

/** The readers, given the services; `refresh` samples them all concurrently. */
export const makeBacklog = Effect.gen(function*() {
  // Captured once: `refresh` runs from the timer and after each run, outside any layer's context.
  const metrics = yield* Metrics
  const sql = yield* PgClient.PgClient
  const services = yield* Effect.context<PlatformServices>()
  const nowMs = Effect.map(DateTime.now, DateTime.toEpochMillis)
  /**
   * A read that PostgreSQL itself stops after 2 s: on a database without the index the batch's scan
   * wants (`sweeper doctor` recommends it), a backlog read must not become a scan of the table
   * every 30 s; the card then says it timed out.
   */
  const bounded = <A, E>(read: Effect.Effect<A, E>) =>
    sql.withTransaction(Effect.andThen(sql`SET LOCAL statement_timeout = '2s'`, read))

  /** A batch that repairs GitLab's tables scans them; one that only logs its own events reads Redis. */
  const scansTables = (batch: RegisteredBatch) => (batch.writes?.tables ?? []).some((t) => t !== "sweeper_events")

  const sample = (name: string) => {
    const batch = batches.find((b) => b.name === name)
    if (batch?.backlog === undefined) return Effect.succeed(total(name, nothing))
    const read = Effect.provideContext(batch.backlog, services)
    // Only a table scan needs PostgreSQL's own stop; a Redis reader must not need a database connection.
    return (scansTables(batch) ? bounded(read) : read).pipe(
      Effect.timeoutOrElse({ duration: READ_TIMEOUT, orElse: () => Effect.fail("timed out after 5 s") }),
      Effect.map((reading) => total(name, reading)),
      Effect.catchCause((cause) => Effect.succeed({ ...total(name, nothing), error: describeError(cause) }))
    )
  }

  const state = yield* Ref.make<BacklogSnapshot>({
    sampledAt: null,
    batches: batchNames.map((b) => total(b, nothing))
  })

  const sampleSome = (names: ReadonlyArray<string>) =>
    Effect.gen(function*() {
      const sampled = yield* Effect.forEach(names, sample, { concurrency: 3 })
      const now = yield* nowMs
      for (const b of sampled) {
        yield* setGauge(backlogGauge, b.count, { batch: b.batch })
        yield* setGauge(backlogCapped, b.capped ? 1 : 0, { batch: b.batch })
        yield* setGauge(backlogStale, b.stale ? 1 : 0, { batch: b.batch })
        yield* setGauge(
          backlogOldestSeconds,
          b.oldestAt === null ? 0 : Math.max(0, (now - b.oldestAt.getTime()) / 1000),
          { batch: b.batch }
        )
      }
      return yield* Ref.updateAndGet(state, (previous) => ({
        sampledAt: new Date(now),
        batches: previous.batches.map((b) => sampled.find((s) => s.batch === b.batch) ?? b)
      }))
    }).pipe(Effect.withSpan("Backlog.refresh"), Effect.provideService(Metrics, metrics))

  return Backlog.of({
    current: Ref.get(state),
    refresh: sampleSome(batchNames),
    refreshOnly: (names) => sampleSome(batchNames.filter((b) => names.includes(b)))
  })
})

/** The gauges at 0 for every batch, so a scrape before the first sample already has the series. */
const initialGauges = Effect.forEach(
  batchNames,
  (batch) =>
    Effect.forEach(
      [backlogGauge, backlogOldestSeconds, backlogCapped, backlogStale],
      (gauge) => setGauge(gauge, 0, { batch }),
      { discard: true }
    ),
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

/** On PostgreSQL and the platform's services (real stores or the embedded in-memory ones). */
export const BacklogLive = withTimer(makeBacklog)

/** Fixed readings, for specs of what shows the backlog: `BacklogMemory.layer(snapshot)`. */
export const BacklogMemory = {
  layer: (snapshot: BacklogSnapshot) =>
    Layer.effect(
      Backlog,
      Effect.gen(function*() {
        const state = yield* Ref.make(snapshot)
        return Backlog.of({ current: Ref.get(state), refresh: Ref.get(state), refreshOnly: () => Ref.get(state) })
      })
    )
}
