/**
 * The repair loop: the one piece of machinery under every page-, step- and pass-shaped
 * batch, so that a program is only its seed's flowchart — what a unit reads and decides, what it
 * writes — and every cross-cutting capability lives here once:
 *
 *   source of units (keyset pages with read-ahead, scan steps that grow, passes, a list)
 *     → before each unit: HealthGate.beforeUnit (a hold; proceed:false stops as if the budget
 *       were spent), its heldMs/heldBy summed into the summary
 *     → plan (read and decide; never writes)
 *     → dry run: each target's `wouldChange`, the unit's dry counts; never a write
 *     → else the fence (unless the write fences itself in its own statement), then the write,
 *       whose `commit`s are reported at once (`reportProgress`) and folded into the totals
 *     → after each unit: budget spent? (cooperative: overshoot ≤ one unit; the deadline is the
 *       run's, set once, so loops run one after another or a retried attempt share it)
 *     → progress: a keyset cursor moves past every page, a step past every entry, a list past every
 *       input, so no source revisits a unit; a repeated write (`repeatUntilDone`) that changes
 *       nothing twice in a row ends its loop
 *     → passes: cadence from a `Schedule` (1 s for a positive limit, back to back for 0, 1 s
 *       after a pass that moved nothing)
 *
 * Why its own room (repair/) and not layers/ or runtime/: it is no implementation of a service
 * contract and has no backend to choose; like the run guard it is policy applied to every batch the
 * same way, but it depends only on domain/ and services/ (CurrentRun, Clock, the HealthGate and
 * Lease contracts), so programs may import it as they import those.
 */
import * as Cause from "effect/Cause"
import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Option from "effect/Option"
import * as Ref from "effect/Ref"
import * as Schedule from "effect/Schedule"
import * as Stream from "effect/Stream"
import { checkFence, CurrentRun, reportProgress, wouldChange } from "../domain/Batch.ts"
import { type RedisError, WrongTypeKey } from "../domain/Errors.ts"
import type { ShadowProposal } from "../domain/Shadow.ts"
import { addSummaries, capped } from "../domain/Summary.ts"
import { HealthGate } from "../services/HealthGate.ts"
import { Lease } from "../services/Lease.ts"

/** What every batch's summary gains: time held by the health gate and the signals that held it. */
export interface Held {
  readonly heldMs: number
  readonly heldBy: ReadonlyArray<string>
}

/** Summary counts: numbers add, booleans OR, lists concatenate (capped), as `addSummaries`. */
export type Counts = Readonly<Record<string, unknown>>

/** Why a loop ended: its source ran dry, its budget was spent, or the gate held past the deadline. */
export type Stop = "done" | "budget" | "held"

export interface LoopResult<C extends Counts> extends Held {
  readonly totals: C
  /** Units done (a dry run's included). */
  readonly units: number
  readonly stop: Stop
}

/** One unit of work as a program writes it: what it would change, and how to change it. */
export interface Unit<In, T, C extends Counts, E, R> {
  /** Reads and decides; never writes. Default: the input is the targets. */
  readonly plan?: ((input: In) => Effect.Effect<ReadonlyArray<T>, E, R>) | undefined
  /** A dry run's stream for `wouldChange` (e.g. `build:123`). */
  readonly target: (t: T) => string
  /**
   * What the write would do to a target, for shadow mode's ledger (rule, outcome, facts read);
   * undefined for a target the write would pass over.
   */
  readonly propose?: ((t: T) => ShadowProposal | undefined) | undefined
  /** What a dry run counts for these targets (it writes nothing). */
  readonly dry: (targets: ReadonlyArray<T>) => C
  /** The guarded write; `commit` reports counts as they become durable (a retried run keeps them). */
  readonly write: (targets: ReadonlyArray<T>, commit: (counts: C) => Effect.Effect<void>) => Effect.Effect<void, E, R>
  /** false when the write checks the fence inside its own statement (a fenced SQL write); default true. */
  readonly fence?: boolean | undefined
}

/** The budget: one clock for the run, cooperative (checked after a unit, never inside one). */
export interface Budget {
  readonly startedMillis: number
  readonly deadlineMillis: number
  /** The budget is spent: stop after the unit that spent it. */
  readonly spent: Effect.Effect<boolean>
  /**
   * How many more items, at the rate of `handled` so far, still fit the budget. The rate is per
   * millisecond of work: `heldMillis` (time spent waiting on the gate) is not work time.
   */
  readonly fits: (handled: number, heldMillis?: number) => Effect.Effect<number>
}

/**
 * The run's budget: its deadline is the run's (set once by the run guard, see `CurrentRun`); a bare
 * run without one ends `--budget` (else the batch's own default) after this loop starts.
 */
export const budget = (fallback: Duration.Duration): Effect.Effect<Budget> =>
  Effect.gen(function*() {
    const run = yield* CurrentRun
    const startedMillis = yield* Clock.currentTimeMillis
    const deadlineMillis = run.deadline ??
      startedMillis + Duration.toMillis(Option.getOrElse(run.budget, () => fallback))
    return {
      startedMillis,
      deadlineMillis,
      spent: Effect.map(Clock.currentTimeMillis, (now) => now >= deadlineMillis),
      fits: (handled, heldMillis = 0) =>
        Effect.map(Clock.currentTimeMillis, (now) => {
          const elapsed = Math.max(0, now - startedMillis - heldMillis)
          return elapsed === 0 || handled === 0 ? Infinity : Math.floor((deadlineMillis - now) / (elapsed / handled))
        })
    }
  })

/**
 * `effect` under one deadline for all its loops: the run's if it has one, else set now from
 * `--budget` or `fallback` (a bare run of a batch whose loops run one after another).
 */
export const withDeadline = (fallback: Duration.Duration) => <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.gen(function*() {
    const run = yield* CurrentRun
    if (run.deadline !== undefined) return yield* effect
    const deadline = (yield* Clock.currentTimeMillis) + Duration.toMillis(Option.getOrElse(run.budget, () => fallback))
    return yield* Effect.provideService(effect, CurrentRun, { ...run, deadline })
  })

/**
 * One loop's bookkeeping: the gate before each unit, held time, the budget, the no-progress guard
 * and the totals. Every driver below is this plus how its units are sourced.
 */
const make = Effect.fnUntraced(function*<C extends Counts>(batch: string, fallback: Duration.Duration, initial: C) {
  const run = yield* CurrentRun
  const gate = yield* HealthGate
  const clock = yield* budget(fallback)
  const held = yield* Ref.make({ heldMs: 0, heldBy: new Set<string>() })
  let totals: C = initial
  let units = 0
  let stop: Stop = "done"
  /**
   * Whether the gate held the unit that asked last. Per unit, not from heldMs: concurrent units of a
   * run share its holds and the held time is reported to one of them only, yet every one of them
   * waited, and each must re-read what it is about to repair.
   */
  let lastHeld = false

  /** Before a unit: the health gate. false: stop, writing nothing more. */
  const before = Effect.gen(function*() {
    const verdict = yield* gate.beforeUnit({ batch, deadlineMillis: clock.deadlineMillis })
    lastHeld = !run.dryRun && verdict.heldBy.length > 0
    if (verdict.heldMs > 0 || verdict.heldBy.length > 0) {
      yield* Ref.update(
        held,
        (h) => ({ heldMs: h.heldMs + verdict.heldMs, heldBy: new Set([...h.heldBy, ...verdict.heldBy]) })
      )
    }
    if (!verdict.proceed) stop = "held"
    return verdict.proceed
  })

  /** One unit: plan, dry run or fence + write; its commits folded in order. Returns what it committed. */
  const unit = <In, T, E, R>(spec: Unit<In, T, C, E, R>, input: In) =>
    Effect.gen(function*() {
      const targets = spec.plan === undefined ? input as unknown as ReadonlyArray<T> : yield* spec.plan(input)
      let committed: Counts = {}
      if (run.dryRun) {
        for (const t of targets) yield* wouldChange(spec.target(t), spec.propose?.(t))
        committed = spec.dry(targets)
      } else if (targets.length > 0) {
        if (spec.fence !== false) yield* checkFence
        // Through the gate: the WAL written meanwhile is Sweeper's own, not the platform's normal.
        yield* gate.ownWrite(batch)(spec.write(targets, (counts) =>
          Effect.andThen(
            reportProgress(counts),
            Effect.sync(() => {
              committed = addSummaries(committed, counts) as Counts
            })
          )))
      }
      units++
      return committed
    })

  const fold = (committed: Counts) => void (totals = addSummaries(totals, committed) as C)
  /** After a unit: fold it in; false when the budget is spent. */
  const after = (committed: Counts) =>
    Effect.gen(function*() {
      fold(committed)
      if (yield* clock.spent) {
        stop = "budget"
        return false
      }
      return true
    })

  const result = Effect.gen(function*() {
    const h = yield* Ref.get(held)
    return { totals, units, stop, heldMs: h.heldMs, heldBy: [...h.heldBy].sort() } satisfies LoopResult<C>
  })
  /** Time this loop has waited on the gate so far. */
  const heldMillis = Effect.map(Ref.get(held), (h) => h.heldMs)
  return {
    run,
    clock,
    gate,
    before,
    unit,
    after,
    fold,
    result,
    heldMillis,
    wasHeld: () => lastHeld,
    setStop: (s: Stop) => void (stop = s)
  }
})

/**
 * Keyset pages with read-ahead: the next page is read (on another pooled connection) while the
 * current one is written; a short page is the last. `revisit` is housekeeping after commit, walked
 * one page behind (see DropCancelingBuilds): each committed page start is walked twice, and the
 * walk's failure fails nothing.
 */
export const keysetPages = <A, Cur, C extends Counts, E, R, E2, R2>(options: {
  readonly batch: string
  readonly budget: Duration.Duration
  readonly initial: C
  readonly size: number
  readonly read: (after: Option.Option<Cur>) => Effect.Effect<ReadonlyArray<A>, E2, R2>
  readonly cursor: (a: A) => Cur
  readonly revisit?: ((after: Option.Option<Cur>) => Effect.Effect<void, unknown, R2>) | undefined
  readonly unit: Unit<ReadonlyArray<A>, A, C, E, R>
}) =>
  Effect.gen(function*() {
    const loop = yield* make(options.batch, options.budget, options.initial)
    const revisit = (after: Option.Option<Cur>) =>
      options.revisit === undefined ? Effect.void : options.revisit(after).pipe(Effect.ignore)
    let pageAfter = Option.none<Cur>()
    let committed: ReadonlyArray<Option.Option<Cur>> = []
    let page = yield* options.read(Option.none())
    while (page.length > 0 && (yield* loop.before)) {
      const upTo = options.cursor(page[page.length - 1]!)
      const next = page.length < options.size ? Effect.succeed<ReadonlyArray<A>>([]) : options.read(Option.some(upTo))
      // The read writes nothing (no fence needed), its rows are strictly after this page in keyset
      // order, and each row's guard is checked again when its own page is written. Before it, the
      // same fiber revisits the page two before (committed before this write began). If the write
      // fails, the read is interrupted with it.
      const ahead = loop.run.dryRun || committed.length === 0 ? next : Effect.andThen(revisit(committed[0]!), next)
      const [done, nextPage] = yield* Effect.all([loop.unit(options.unit, page), ahead], {
        concurrency: loop.run.dryRun ? 1 : 2
      })
      if (!loop.run.dryRun) {
        committed = [...committed, pageAfter].slice(-2)
        pageAfter = Option.some(upTo)
      }
      page = nextPage
      if (!(yield* loop.after(done))) break
    }
    // The last pages written have not been walked twice yet.
    if (committed.length > 0) yield* revisit(committed[0]!)
    return yield* loop.result
  })

/** Whether a unit's committed counts changed anything (a positive count, a non-empty list, a true). */
const changedAnything = (committed: Counts) =>
  Object.values(committed).some((v) => typeof v === "number" ? v > 0 : Array.isArray(v) ? v.length > 0 : v === true)

/**
 * Units from a repeated write until it reports that nothing is left (`more`), e.g. a page deleted
 * by one statement with no cursor of its own. A unit that changed nothing twice ends it.
 */
export const repeatUntilDone = <C extends Counts, E, R, E2, R2>(options: {
  readonly batch: string
  readonly budget: Duration.Duration
  readonly initial: C
  /** One unit: write and commit; true while more may be left. */
  readonly write: (commit: (counts: C) => Effect.Effect<void>) => Effect.Effect<boolean, E, R>
  /** A dry run's one unit: what the writes would count, without writing. */
  readonly dry: Effect.Effect<C, E2, R2>
  /** false when the write checks the fence in its own transaction; default true. */
  readonly fence?: boolean | undefined
}) =>
  Effect.gen(function*() {
    const loop = yield* make(options.batch, options.budget, options.initial)
    if (loop.run.dryRun) {
      if (yield* loop.before) loop.fold(yield* options.dry)
      return yield* loop.result
    }
    // Set by each write: a field, so the loop's condition visibly reads state the unit changes.
    const pending = { more: true }
    const unit: Unit<ReadonlyArray<null>, null, C, E, R> = {
      target: () => "",
      dry: () => options.initial,
      write: (_, commit) => Effect.map(options.write(commit), (m) => void (pending.more = m)),
      fence: options.fence
    }
    let idle = false
    while (pending.more && (yield* loop.before)) {
      const done = yield* loop.unit(unit, [null])
      // Said more is left but changed nothing, twice: repeating it would only spin.
      if (!changedAnything(done) && idle) {
        yield* Effect.logWarning("Stopped a repeated write that made no progress twice").pipe(
          Effect.annotateLogs({ batch: options.batch })
        )
        break
      }
      idle = !changedAnything(done)
      if (!pending.more) loop.fold(done)
      else if (!(yield* loop.after(done))) break
    }
    return yield* loop.result
  })

/** What `growingSteps` grows by: the first step, the factor, the cap (a page). */
export interface Growth {
  readonly first: number
  readonly factor: number
  readonly max: number
}

/**
 * A scan's pages cut into steps that grow (first, ×factor, … capped by `max` and by what the time
 * per item so far says still fits the budget), the budget checked after each: `--budget 0s`
 * handles exactly `first` items, and a run overshoots by at most about one step.
 */
export const growingSteps = <In, T, C extends Counts, E, R, E2, R2>(options: {
  readonly batch: string
  readonly budget: Duration.Duration
  readonly initial: C
  readonly source: Stream.Stream<In, E2, R2>
  readonly growth: Growth
  readonly unit: Unit<ReadonlyArray<In>, T, C, E, R>
}) =>
  Effect.gen(function*() {
    const loop = yield* make(options.batch, options.budget, options.initial)
    let step = options.growth.first
    let handled = 0
    const handlePage = (page: ReadonlyArray<In>) =>
      Effect.gen(function*() {
        for (let offset = 0; offset < page.length;) {
          if (!(yield* loop.before)) return false
          const slice = page.slice(offset, offset + step)
          offset += slice.length
          const done = yield* loop.unit(options.unit, slice)
          handled += slice.length
          if (!(yield* loop.after(done))) return false
          step = Math.max(
            1,
            Math.min(
              step * options.growth.factor,
              yield* loop.clock.fits(handled, yield* loop.heldMillis),
              options.growth.max
            )
          )
        }
        return true
      })
    yield* Stream.runForEachWhile(Stream.chunks(options.source), handlePage)
    return yield* loop.result
  })

/**
 * A list of units (slices of ids, pushes of one kind), `concurrency` at a time; totals fold in
 * list order whatever order they finish in. Once one unit finds the gate shut or the budget spent,
 * the units not yet started are not started.
 */
export const each = <In, T, C extends Counts, E, R>(options: {
  readonly batch: string
  readonly budget: Duration.Duration
  readonly initial: C
  readonly inputs: ReadonlyArray<In>
  readonly concurrency?: number | undefined
  readonly unit: Unit<In, T, C, E, R>
}) =>
  Effect.gen(function*() {
    const loop = yield* make(options.batch, options.budget, options.initial)
    let stopped = false
    const done = yield* Effect.forEach(options.inputs, (input) =>
      Effect.gen(function*() {
        if (stopped || !(yield* loop.before)) {
          stopped = true
          return Option.none<Counts>()
        }
        const committed = yield* loop.unit(options.unit, input)
        if (yield* loop.clock.spent) stopped = true
        return Option.some(committed)
      }), { concurrency: loop.run.dryRun ? 1 : (options.concurrency ?? 1) })
    for (const committed of done) if (Option.isSome(committed)) loop.fold(committed.value)
    if (stopped && loop.run.dryRun === false && (yield* loop.clock.spent)) loop.setStop("budget")
    return yield* loop.result
  })

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
    const loop = yield* make(options.batch, options.budget, {})
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

/** The held fields of several loops (a batch that runs more than one), summed. */
export const sumHeld = (loops: ReadonlyArray<Held>): Held => ({
  heldMs: loops.reduce((sum, h) => sum + h.heldMs, 0),
  heldBy: [...new Set(loops.flatMap((h) => h.heldBy))].sort()
})

/** A batch that does no unit of work still reports that nothing held it. */
export const NOT_HELD: Held = { heldMs: 0, heldBy: [] }

/**
 * Rows a unit passed over (held by another open transaction, which a page never waits for, or
 * changed meanwhile): one log line per unit that met some, with their ids under `key`; nothing
 * otherwise.
 */
export const logIds = (message: string, key: string, ids: ReadonlyArray<string | number>): Effect.Effect<void> =>
  ids.length === 0 ? Effect.void : Effect.logInfo(message, { [key]: capped(ids), count: ids.length })

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

/** A key whose unit hit a key of the wrong type: permanent and about that key alone. */
export interface KeyFailure<K> {
  readonly of: K
  readonly key: string
  readonly error: string
}

/**
 * The default isolation: a WrongTypeKey is permanent and concerns one key (re-running cannot fix
 * it, and the other keys are fine), so that key is skipped and reported, never retried.
 */
const wrongTypeKey = <K>(of: K, error: unknown): Option.Option<KeyFailure<K>> =>
  error instanceof WrongTypeKey
    ? Option.some({ of, key: error.key, error: error.message })
    : Option.none()

/**
 * `f` for every key concurrently (at most `concurrency` at once); one key's failure neither stops
 * nor hides the others: all finish. A failure `isolate` recognises (permanent, and about that key
 * alone; by default a WrongTypeKey) is returned with the others' results and the run goes on; any
 * other is logged with `logFailure` and fails the whole afterwards, so the run guard records and
 * retries it. The default log lines read "<label> skipped <noun> <key>: …" and
 * "<label> failed for a <noun>", annotated with the key under `noun`.
 */
export const isolatedEach = <K, A, E, R, F = KeyFailure<K>>(
  keys: ReadonlyArray<K>,
  f: (key: K) => Effect.Effect<A, E, R>,
  options: {
    readonly concurrency: number
    readonly label?: string
    readonly noun?: string
    readonly isolate?: (key: K, error: E) => Option.Option<F>
    readonly logIsolated?: (failure: F) => Effect.Effect<void>
    readonly logFailure?: (key: K, cause: Cause.Cause<E>) => Effect.Effect<void>
  }
) =>
  Effect.gen(function*() {
    const { label = "Batch", noun = "key" } = options
    const isolate = options.isolate ?? (wrongTypeKey as (key: K, error: E) => Option.Option<F>)
    const logIsolated = options.logIsolated ?? ((failure: F) => {
      const { of, key, error } = failure as KeyFailure<K>
      return Effect.logError(`${label} skipped ${noun} ${String(of)}: key ${key} holds the wrong type (${error})`).pipe(
        Effect.annotateLogs({ [noun]: of, key })
      )
    })
    const logFailure = options.logFailure ?? ((of: K, cause: Cause.Cause<E>) =>
      Effect.logError(`${label} failed for a ${noun}`, cause).pipe(Effect.annotateLogs({ [noun]: of })))
    const exits = yield* Effect.forEach(keys, (key) => Effect.exit(f(key)), { concurrency: options.concurrency })
    const results: Array<A> = []
    const isolated: Array<F> = []
    let failed: Cause.Cause<E> | undefined
    for (const [i, exit] of exits.entries()) {
      if (Exit.isSuccess(exit)) {
        results.push(exit.value)
        continue
      }
      const known = Option.flatMap(Cause.findErrorOption(exit.cause), (error) => isolate(keys[i]!, error))
      if (Option.isSome(known)) {
        isolated.push(known.value)
        yield* logIsolated(known.value)
      } else {
        yield* logFailure(keys[i]!, exit.cause)
        failed ??= exit.cause
      }
    }
    if (failed !== undefined) return yield* Effect.failCause(failed)
    return { results, isolated }
  })
