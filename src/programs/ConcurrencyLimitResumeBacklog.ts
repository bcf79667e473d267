/**
 * concurrency-limit-resume's backlog: the deferred jobs of every worker whose pass would resume
 * them (`resumesDeferred`: a limit known and its breaker closed), and since when the oldest waits
 * (its `buffered_at`).
 *
 * Which workers: never a whole-keyspace SCAN per sample (on millions of SharedState keys it cannot
 * finish). The service keeps them known (`knownDeferredWorkers`): configured workers, the last
 * complete discovery (a run's own scan, or a sweep finished by these samples), and an incremental
 * SCAN cursor carried across samples, advanced at most SWEEP.calls × SWEEP.count keys once per
 * SWEEP.every. So a sample costs at most SWEEP.calls SCANs, one LLEN per known worker (at most
 * MAX_KNOWN) and two more reads for each of at most MAX_WORKERS workers with jobs waiting, whatever
 * the keyspace's size; the reading says when it is capped (more workers waiting than read) or
 * stale (no complete discovery yet, or an old one).
 */
import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { backlogPart, type BacklogReading } from "../domain/Backlog.ts"
import { resumesDeferred } from "../domain/ConcurrencyLimit.ts"
import { ConcurrencyLimits } from "../services/ConcurrencyLimits.ts"

/** 50 SCANs of COUNT 1000 (0.2 s measured on 1 M keys), at most every 20 s: 1 M keys in ~20 samples. */
export const SWEEP = { calls: 50, count: 1000, every: Duration.seconds(20) }
/** Workers with jobs waiting read in full (limit, oldest job) per sample; more are reported as capped. */
export const MAX_WORKERS = 50
/** Known workers whose list length a sample reads (one LLEN each); more are reported as capped. */
export const MAX_KNOWN = 1000
/**
 * A complete discovery that started longer ago than this makes the figure stale: three sweeps of a
 * 1 M-key keyspace at the 30 s sampling cadence (~10 min each), when no run here refreshes it.
 */
export const DISCOVERY_STALE_AFTER = Duration.minutes(30)

export const concurrencyLimitResumeBacklog = Effect.gen(function*() {
  const limits = yield* ConcurrencyLimits
  const known = yield* limits.knownDeferredWorkers(SWEEP)
  // One LLEN per known worker (up to MAX_KNOWN), so the workers read are ones with jobs waiting.
  const sizes = yield* Effect.forEach(known.workers.slice(0, MAX_KNOWN), (worker) =>
    limits.queueSize(worker).pipe(
      // A key of the wrong type is that worker's pass to report; it must not blank every worker's figure.
      Effect.catchTag("WrongTypeKey", () => Effect.succeed(0)),
      Effect.map((size) => ({ worker, size }))
    ), { concurrency: 8 })
  const waiting = sizes.filter(({ size }) => size > 0)
  const read = waiting.slice(0, MAX_WORKERS)
  const left = { noLimit: 0, breakerOpen: 0 }
  const parts = yield* Effect.forEach(read, ({ worker, size }) =>
    Effect.gen(function*() {
      const setting = yield* limits.limitOf(worker)
      if (!resumesDeferred(setting)) {
        left[Option.isNone(setting) ? "noLimit" : "breakerOpen"]++
        return []
      }
      const head = yield* limits.oldestDeferred(worker)
      const buffered = Option.flatMap(head, (job) => Option.fromNullishOr(job.buffered_at))
      return [backlogPart(
        worker,
        size,
        false,
        Option.match(buffered, {
          onNone: () => null,
          onSome: (at) => typeof at === "number" ? new Date(at * 1000) : null
        })
      )]
    }).pipe(Effect.catchTag("WrongTypeKey", () => Effect.succeed([]))), { concurrency: 4 })
  const capped = waiting.length > read.length || known.workers.length > MAX_KNOWN
  const ageMs = known.completeAt === null ? null : (yield* Clock.currentTimeMillis) - known.completeAt.getTime()
  const stale = ageMs === null || ageMs > Duration.toMillis(DISCOVERY_STALE_AFTER)
  const notes = [
    capped
      ? `${waiting.length}${
        known.workers.length > MAX_KNOWN ? "+" : ""
      } workers with jobs deferred, the first ${read.length} read`
      : null,
    ageMs === null
      ? `worker discovery still sweeping the keyspace (${known.sweptKeys} keys in): workers past it are missing`
      : stale
      ? `workers as of a discovery ${Math.round(ageMs / 60_000)} min ago`
      : null,
    left.noLimit > 0 ? `${left.noLimit} with jobs deferred but no limit set, left alone by the run` : null,
    left.breakerOpen > 0 ? `${left.breakerOpen} with jobs deferred behind an open breaker (limit < 0)` : null
  ].filter((n) => n !== null)
  return { parts: parts.flat(), capped, stale, note: notes.length === 0 ? null : notes.join("; ") }
}) satisfies Effect.Effect<BacklogReading, unknown, ConcurrencyLimits>
