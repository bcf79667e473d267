/**
 * The cadence of pass-shaped batches: passes over one thing repeated on a `Schedule` until the
 * budget, and the exclusive per-thing lease (`underLease`) a pass runs under, renewed across holds.
 */
import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import { CurrentRun } from "../domain/Batch.ts"
import type { RedisError } from "../domain/Errors.ts"
import { Lease } from "../services/Lease.ts"
import { loopBookkeeping } from "./LoopBookkeeping.ts"

/** What a pass tells the cadence: how to go on. */
export type Next = "now" | "wait" | "stop"

/**
 * Passes over one thing (a worker's deferred list), repeated while `next` says so: "now" back to
 * back, "wait" one `delay` later (a `Schedule.spaced`), "stop" to end, until the budget: a pass is
 * started only if it can start before the deadline. The gate is asked before every pass. A dry run
 * makes one pass: it writes nothing, so repeating it would only repeat the same answer.
 */
export const passes = <P, E, R>(options: {
  readonly batch: string
  readonly budget: Duration.Duration
  readonly delay: Duration.Duration
  readonly pass: (first: boolean) => Effect.Effect<Option.Option<P>, E, R>
  readonly next: (result: P) => Next
  /**
   * Before every further pass, after its wait and the gate (and before a first pass the gate held):
   * false ends the passes (e.g. a lease lost).
   */
  readonly between?: Effect.Effect<boolean, E, R> | undefined
}) =>
  Effect.gen(function*() {
    const loop = yield* loopBookkeeping(options.batch, options.budget, {})
    const results: Array<P> = []
    const delayMillis = Duration.toMillis(options.delay)
    const step = (first: boolean): Effect.Effect<Next, E, R> =>
      Effect.gen(function*() {
        // No pass starts at or after the deadline, a loop's first included (it may have waited for a slot).
        if (first && (yield* loop.clock.spent)) {
          loop.setStop("budget")
          return "stop"
        }
        if (!(yield* loop.before)) return "stop"
        // After the gate, right before the pass: a hold may have lasted long enough for the lease
        // under these passes to be lost, and a pass must not run on a lease that is not ours.
        const held = loop.wasHeld()
        if ((!first || held) && options.between !== undefined && !(yield* options.between)) return "stop"
        const result = yield* loop.gate.ownWrite(options.batch)(options.pass(first))
        if (Option.isNone(result)) return "stop"
        results.push(result.value)
        const next = loop.run.dryRun ? "stop" : options.next(result.value)
        if (next === "stop") return "stop"
        // A pass starts only if it can start before the deadline (after its wait, if any).
        const now = yield* Clock.currentTimeMillis
        if (next === "now" ? now >= loop.clock.deadlineMillis : now + delayMillis >= loop.clock.deadlineMillis) {
          loop.setStop("budget")
          return "stop"
        }
        return next
      })
    // The cadence, in one place: the pass after a "wait" one delay later, after a "now" at once.
    const cadence = Schedule.forever.pipe(
      Schedule.setInputType<Next>(),
      Schedule.addDelay(({ input }) => Effect.succeed(input === "wait" ? options.delay : Duration.zero))
    )
    let first = true
    yield* Effect.suspend(() => step(first)).pipe(
      Effect.tap(() => Effect.sync(() => void (first = false))),
      Effect.repeat({ schedule: cadence, while: (next) => next !== "stop" })
    )
    return { results, ...(yield* loop.result) }
  })

/**
 * `body` under its own exclusive lease `name` (a dry run takes none: it writes nothing), released
 * at the end: None when another process holds it. `body` gets `renew`, which extends the lease
 * (before each further pass) and says false once it was lost. Between those, the lease is also
 * renewed every TTL/3 in the background, so it outlives a gate hold (or any wait) longer than its
 * TTL: a lease that lapsed while held would let another process run the same work at once. A
 * background renewal that errs is left to the next one (and to `renew`, which reports the error);
 * one that finds another token marks the lease lost.
 */
export const underLease = <A, E, R>(
  name: string,
  ttl: Duration.Duration,
  body: (renew: Effect.Effect<boolean, RedisError>) => Effect.Effect<A, E, R>
) =>
  Effect.gen(function*() {
    const lease = yield* Lease
    const { dryRun } = yield* CurrentRun
    return yield* Effect.scoped(Effect.gen(function*() {
      const handle = dryRun ? Option.none() : yield* Effect.acquireRelease(
        lease.tryAcquire(name, ttl),
        (held) => Option.isSome(held) ? Effect.ignore(lease.release(held.value)) : Effect.void
      )
      if (!dryRun && Option.isNone(handle)) return Option.none<A>()
      if (Option.isNone(handle)) return Option.some(yield* body(Effect.succeed(true)))
      let lost = false
      const renew = Effect.map(lease.renew(handle.value), (kept) => {
        if (!kept) lost = true
        return kept
      })
      // An error says nothing about who holds the lease: logged, and left to the next renewal (and to
      // `renew`, which reports it to the body).
      const backgroundRenewal = renew.pipe(
        Effect.catch((error) =>
          Effect.as(
            Effect.logWarning("Lease renewal failed; trying again at the next renewal", error).pipe(
              Effect.annotateLogs({ lease: name })
            ),
            true
          )
        )
      )
      yield* Effect.suspend(() => lost ? Effect.succeed(false) : backgroundRenewal).pipe(
        Effect.delay(Duration.divideUnsafe(ttl, 3)),
        Effect.repeat({ while: (kept) => kept }),
        Effect.forkScoped
      )
      return Option.some(yield* body(Effect.suspend(() => lost ? Effect.succeed(false) : renew)))
    }))
  })

/**
 * `passes` under their own exclusive lease (`underLease`): renewed before every further pass and
 * kept alive in between; a lease lost stops the passes (logged as `<label> lease lost; stopping`,
 * annotated with `subject`). None, logged at info, when another process holds the lease: it is
 * running these passes.
 */
export const leasedPasses = <P, E, R>(options: {
  readonly lease: string
  readonly ttl: Duration.Duration
  readonly label: string
  readonly subject: Readonly<Record<string, unknown>>
  readonly batch: string
  readonly budget: Duration.Duration
  readonly delay: Duration.Duration
  readonly pass: (first: boolean) => Effect.Effect<Option.Option<P>, E, R>
  readonly next: (result: P) => Next
}) =>
  Effect.gen(function*() {
    const annotations = { ...options.subject, lease: options.lease }
    const lost = Effect.as(
      Effect.logWarning(`${options.label} lease lost; stopping`).pipe(Effect.annotateLogs(annotations)),
      false
    )
    const run = yield* underLease(options.lease, options.ttl, (renew) =>
      passes<P, E | RedisError, R>({
        ...options,
        between: Effect.flatMap(renew, (kept) => kept ? Effect.succeed(true) : lost)
      }))
    if (Option.isNone(run)) {
      yield* Effect.logInfo(`Skipped: ${options.label} lease held`).pipe(Effect.annotateLogs(annotations))
    }
    return run
  })
