/**
 * The sources of units a program's loop walks, each the repair loop's bookkeeping
 * (`loopBookkeeping` in LoopBookkeeping.ts) plus how its units are found: keyset pages with read-ahead,
 * a write repeated until it changes nothing, scan steps that grow, a list.
 */
import * as Arr from "effect/Array"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Option from "effect/Option"
import * as Pull from "effect/Pull"
import * as Stream from "effect/Stream"
import type { FenceError } from "../domain/Errors.ts"
import { type Counts, loopBookkeeping, type Unit } from "./LoopBookkeeping.ts"

/**
 * Keyset pages with read-ahead: the next page is read (on another pooled connection) while the
 * current one is written; a short page is the last. With `writesInFlight` n > 1, up to n pages are
 * written at once, each started while the ones before it still commit (their statements on pooled
 * connections of their own): for writes whose pages share no row and claim without waiting. Each
 * page passes the gate before its write starts, and their counts fold in page order; once the
 * budget is spent no page starts, and the ones in flight finish (up to n − 1 past the one that spent it).
 * `revisit` is housekeeping after commit, walked one page behind the committed ones (see
 * DropCancelingBuilds): each committed page start is walked twice, and the walk's failure fails
 * nothing.
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
  readonly writesInFlight?: number | undefined
}) =>
  Effect.gen(function*() {
    const loop = yield* loopBookkeeping(options.batch, options.budget, options.initial)
    const inFlight = loop.run.dryRun ? 1 : Math.max(1, options.writesInFlight ?? 1)
    const revisit = (after: Option.Option<Cur>) =>
      options.revisit === undefined ? Effect.void : options.revisit(after).pipe(Effect.ignore)
    // Pages being written, the oldest first, each with the cursor it starts after.
    const writing: Array<
      { readonly write: Fiber.Fiber<Counts, E | FenceError>; readonly startsAfter: Option.Option<Cur> }
    > = []
    // The starts of the last two pages committed, the newer last.
    let committed: ReadonlyArray<Option.Option<Cur>> = []
    /** Waits for the oldest write and folds it in; false once the budget is spent. */
    const settleOldest = Effect.gen(function*() {
      const [oldest] = writing.splice(0, 1)
      if (oldest === undefined) return true
      const done = yield* Fiber.join(oldest.write)
      if (!loop.run.dryRun) committed = [...committed, oldest.startsAfter].slice(-2)
      return yield* loop.after(done)
    })
    let startsAfter = Option.none<Cur>()
    let page = yield* options.read(startsAfter)
    while (Arr.isReadonlyArrayNonEmpty(page) && (yield* loop.before)) {
      const upTo = options.cursor(Arr.lastNonEmpty(page))
      writing.push({ write: yield* Effect.forkChild(loop.unit(options.unit, page)), startsAfter })
      startsAfter = Option.some(upTo)
      // The read writes nothing (no fence needed), its rows are strictly after this page in keyset
      // order, and each row's guard is checked again when its own page is written. Before it, this
      // fiber revisits from the start of the older of the last two committed pages. If a write
      // fails, the loop fails when it is joined, and the writes still in flight are interrupted.
      const next = page.length < options.size ? Effect.succeed<ReadonlyArray<A>>([]) : options.read(startsAfter)
      const twoBefore = Arr.head(committed)
      page =
        yield* (loop.run.dryRun || Option.isNone(twoBefore) ? next : Effect.andThen(revisit(twoBefore.value), next))
      if (writing.length >= inFlight && !(yield* settleOldest)) break
    }
    while (writing.length > 0) yield* settleOldest
    // The last pages written have not been walked twice yet.
    const unwalked = Arr.head(committed)
    if (Option.isSome(unwalked)) yield* revisit(unwalked.value)
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
    const loop = yield* loopBookkeeping(options.batch, options.budget, options.initial)
    if (loop.run.dryRun) {
      if (yield* loop.before) loop.fold(yield* options.dry)
      return yield* loop.result
    }
    // Set by each write: a field, so the loop's condition visibly reads state the unit changes.
    const pending = { more: true }
    const unit: Unit<ReadonlyArray<null>, null, C, E, R> = {
      plan: Effect.succeed,
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
 *
 * The next page is read while the current page's last step writes, from the moment that write's own
 * reads are answered (its `readsDone`): a read sent before them would queue ahead of them on the
 * same server. Only the read goes ahead: every step still writes after the one before it has
 * finished and the budget and the gate were checked, and a page read past the budget is dropped.
 */
export const growingSteps = <In, T, C extends Counts, E, R, E2, R2>(options: {
  readonly batch: string
  readonly budget: Duration.Duration
  readonly initial: C
  readonly source: Stream.Stream<In, E2, R2>
  readonly growth: Growth
  readonly unit: Unit<ReadonlyArray<In>, T, C, E, R>
}) =>
  Effect.scoped(Effect.gen(function*() {
    const loop = yield* loopBookkeeping(options.batch, options.budget, options.initial)
    const pull = yield* Stream.toPull(options.source)
    const nextPage = Pull.catchDone(pull, () => Effect.succeed(undefined))
    let step = options.growth.first
    let handled = 0
    let page: ReadonlyArray<In> | undefined = yield* nextPage
    while (page !== undefined) {
      let following: ReadonlyArray<In> | undefined = undefined
      for (let offset = 0; offset < page.length;) {
        if (!(yield* loop.before)) return yield* loop.result
        // At full size, a page's rest too short to be worth a step of its own goes with this one (a
        // scan's page size is a hint: HSCAN's page of 5000 often comes back a few entries longer).
        const rest = page.length - (offset + step)
        const end = step >= options.growth.max && rest <= options.growth.max / options.growth.factor
          ? page.length
          : offset + step
        const slice = page.slice(offset, end)
        offset += slice.length
        let done: Counts
        if (offset < page.length || loop.run.dryRun) {
          done = yield* loop.unit(options.unit, slice)
        } else {
          const readsDone = yield* Deferred.make<void>()
          const [written, read] = yield* Effect.all([
            loop.unit(options.unit, slice, Deferred.succeed(readsDone, undefined)).pipe(
              Effect.ensuring(Deferred.succeed(readsDone, undefined))
            ),
            Effect.andThen(Deferred.await(readsDone), nextPage)
          ], { concurrency: 2 })
          done = written
          following = read
        }
        handled += slice.length
        if (!(yield* loop.after(done))) return yield* loop.result
        step = Math.max(
          1,
          Math.min(
            step * options.growth.factor,
            yield* loop.clock.fits(handled, yield* loop.heldMillis),
            options.growth.max
          )
        )
      }
      page = loop.run.dryRun ? yield* nextPage : following
    }
    return yield* loop.result
  }))

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
    const loop = yield* loopBookkeeping(options.batch, options.budget, options.initial)
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
