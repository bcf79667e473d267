/**
 * The repair loop's core: the unit's types, the run's budget and deadline, and the bookkeeping
 * every loop shares (`loopBookkeeping`: the gate before each unit, held time, the fence, the
 * totals). The loops over it are in UnitLoops.ts, Cadence.ts and IsolatedKeys.ts; RepairLoop.ts is
 * what programs import.
 */
import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Ref from "effect/Ref"
import { checkFence, CurrentRun, reportProgress, wouldChange } from "../domain/Batch.ts"
import type { ShadowProposal } from "../domain/Shadow.ts"
import { addSummaries, capped, mergeSummaries } from "../domain/Summary.ts"
import { HealthGate } from "../services/HealthGate.ts"

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
  /** Reads and decides; never writes. `Effect.succeed` when the input already is the targets. */
  readonly plan: (input: In) => Effect.Effect<ReadonlyArray<T>, E, R>
  /** A dry run's stream for `wouldChange` (e.g. `build:123`). */
  readonly target: (t: T) => string
  /**
   * What the write would do to a target, for shadow mode's ledger (rule, outcome, facts read);
   * undefined for a target the write would pass over.
   */
  readonly propose?: ((t: T) => ShadowProposal | undefined) | undefined
  /** What a dry run counts for these targets (it writes nothing). */
  readonly dry: (targets: ReadonlyArray<T>) => C
  /**
   * The guarded write; `commit` reports counts as they become durable (a retried run keeps them).
   * `readsDone`, run by a write that reads before it writes once those reads are answered, lets a
   * loop that reads ahead (`growingSteps`) send its next read then rather than ahead of them; a
   * write that never runs it has the read-ahead wait for its end.
   */
  readonly write: (
    targets: ReadonlyArray<T>,
    commit: (counts: C) => Effect.Effect<void>,
    readsDone: Effect.Effect<void>
  ) => Effect.Effect<void, E, R>
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
 * and the totals. Every driver (UnitLoops.ts, Cadence.ts) is this plus how its units are sourced.
 */
export const loopBookkeeping = Effect.fnUntraced(
  function*<C extends Counts>(batch: string, fallback: Duration.Duration, initial: C) {
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
    const unit = <In, T, E, R>(spec: Unit<In, T, C, E, R>, input: In, readsDone: Effect.Effect<void> = Effect.void) =>
      Effect.gen(function*() {
        const targets = yield* spec.plan(input)
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
                committed = mergeSummaries(committed, counts)
              })
            ), readsDone))
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
  }
)

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
