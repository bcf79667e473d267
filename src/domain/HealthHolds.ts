/**
 * The health gate's holds, as a pure state machine the gate's actor (src/layers/health/HealthGateActor.ts)
 * keeps one of per run. A hold belongs to a run, not to whichever of its waiters saw it first:
 * concurrent units of one run (the resume workers, the export slices) share its holds, so one
 * RepairHeld … RepairReleased pair is written per signal and hold, however many wait on it.
 *
 * - A signal's hold opens when a judgement says held and ends when one says released, or when the
 *   run's last waiter leaves (its deadline, an interruption) with the hold still open.
 * - Held time is wall-clock: the time any hold of the run was open, however many waited. Each
 *   waiter's verdict takes the part of it not yet reported to another (`takeHeld`), so summing
 *   every verdict of a run, as the repair loop does, gives exactly that time.
 */

import type * as Option from "effect/Option"
import { judge, type Reading, type SignalRule } from "./Health.ts"

export interface OpenHold {
  readonly since: number
  readonly value: number | null
  readonly display: string
  readonly threshold: string
}

export interface RunHolds {
  readonly holds: ReadonlyMap<string, OpenHold>
  /** Callers now inside beforeUnit for this run. */
  readonly waiters: number
  /** When the run became held (some hold open), or null while none is. */
  readonly heldSince: number | null
  /** Wall-clock milliseconds of held periods that have ended. */
  readonly heldTotal: number
  /** How much of the held time verdicts have already reported. */
  readonly reported: number
}

export const emptyRun: RunHolds = { holds: new Map(), waiters: 0, heldSince: null, heldTotal: 0, reported: 0 }

export const openHold = (state: RunHolds, signal: string, hold: OpenHold): RunHolds => {
  const holds = new Map(state.holds)
  holds.set(signal, hold)
  return { ...state, holds, heldSince: state.heldSince ?? hold.since }
}

export const closeHold = (state: RunHolds, signal: string, now: number): RunHolds => {
  if (!state.holds.has(signal)) return state
  const holds = new Map(state.holds)
  holds.delete(signal)
  if (holds.size > 0 || state.heldSince === null) return { ...state, holds }
  return { ...state, holds, heldSince: null, heldTotal: state.heldTotal + Math.max(0, now - state.heldSince) }
}

/** Wall-clock held time of the run so far (an open period counted up to `now`). */
export const heldSoFar = (state: RunHolds, now: number): number =>
  state.heldTotal + (state.heldSince === null ? 0 : Math.max(0, now - state.heldSince))

/** The held time not yet reported by any verdict; the state remembers it as reported. */
export const takeHeld = (state: RunHolds, now: number): readonly [number, RunHolds] => {
  const total = heldSoFar(state, now)
  return [Math.max(0, total - state.reported), { ...state, reported: Math.max(state.reported, total) }]
}

export const enter = (state: RunHolds): RunHolds => ({ ...state, waiters: state.waiters + 1 })

/**
 * A waiter leaves. The signals whose holds end with it: every open one when it was the last
 * waiter (nobody is held any more), none otherwise (the others still wait on them).
 */
export const leave = (state: RunHolds): readonly [ReadonlyArray<string>, RunHolds] => {
  const waiters = Math.max(0, state.waiters - 1)
  return [waiters === 0 ? [...state.holds.keys()] : [], { ...state, waiters }]
}

/** Nothing left to remember: no waiter and no open hold (the layer forgets the run). */
export const idle = (state: RunHolds): boolean => state.waiters === 0 && state.holds.size === 0

/** What one check of a run's rules does: holds to open (with the reading that opens them), to close, to keep. */
export interface Check {
  readonly open: ReadonlyArray<{ readonly rule: SignalRule; readonly reading: Reading }>
  readonly close: ReadonlyArray<string>
  readonly keep: ReadonlyArray<string>
}

/**
 * One check: every rule judged on its readings with the run's current holds (the hysteresis of
 * `judge`). `readings` and `baseline` give what the layer last read for a rule on the batch's subjects.
 */
export const check = (
  state: RunHolds,
  rules: ReadonlyArray<SignalRule>,
  readings: (rule: SignalRule) => ReadonlyArray<Reading>,
  baseline: (rule: SignalRule) => Option.Option<number>
): Check => {
  const open: Array<{ rule: SignalRule; reading: Reading }> = []
  const close: Array<string> = []
  const keep: Array<string> = []
  for (const rule of rules) {
    const held = state.holds.has(rule.signal)
    const verdict = judge(rule, held, readings(rule), baseline(rule))
    if (!held && verdict.held) open.push({ rule, reading: verdict.reading })
    else if (held && !verdict.held) close.push(rule.signal)
    else if (held) keep.push(rule.signal)
  }
  return { open, close, keep }
}
