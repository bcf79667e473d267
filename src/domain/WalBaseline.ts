/**
 * A relative `walRate`'s baseline, pure: what a sample says of the platform's normal WAL rate once
 * Sweeper's own writes are taken out of it, and the time window the baseline learns over.
 *
 * PostgreSQL cannot say which backend wrote which WAL bytes (pg_stat_wal is server-wide), so Sweeper's
 * own WAL is measured the one way it can be: the WAL position read when this process starts writing a
 * database (a unit's write, a pass) and when it stops. Those spans are Sweeper's; the platform's rate is
 * what the round's WAL was outside them, over the time outside them:
 *
 *   round:   |-----------------------------------------------|   Δ bytes, Δ ms
 *   spans:        [==own==]          [=own=]                      own bytes, own ms (union of units)
 *   sample:  (Δ bytes − own bytes) / (Δ ms − own ms)
 *
 * The platform's WAL written during a span is counted with Sweeper's (it cannot be told apart), and so
 * is its time: the sample is the platform's rate in the gaps, neither lowered by Sweeper's pauses nor
 * raised by its writes. A round Sweeper wrote through almost entirely says too little to be a sample.
 * Samples older than the window are forgotten on every round, whether or not the round adds one, so a
 * quiet hour's baseline ends with its hour.
 */
import * as Duration from "effect/Duration"
import * as Option from "effect/Option"
import { BASELINE_WINDOW, type Sample } from "./Health.ts"

/** A WAL position and when it was read (epoch milliseconds; bytes since 0/0). */
export interface WalMark {
  readonly at: number
  readonly position: number
}

/** Sweeper's own writing on one database, between two rounds of the sampler. */
export interface OwnWal {
  /** Units of this process writing the database now. */
  readonly writing: number
  /** Where the current span's part not yet taken by a round began (null while none writes). */
  readonly since: WalMark | null
  /** Bytes and milliseconds of spans (or parts of spans) not yet taken by a round. */
  readonly bytes: number
  readonly millis: number
  /** A position could not be read at a span's edge: this round's own share is not known. */
  readonly unmeasured: boolean
}

export const NO_OWN_WAL: OwnWal = { writing: 0, since: null, bytes: 0, millis: 0, unmeasured: false }

/** What a round takes out of its WAL as Sweeper's own. */
export interface OwnShare {
  readonly bytes: number
  readonly millis: number
  readonly unmeasured: boolean
}

/** Whether a unit starting to write now begins a span (and so needs the WAL position read). */
export const startsSpan = (state: OwnWal): boolean => state.writing === 0

/** A unit starts writing; `mark` is the position where a new span begins (None: could not be read). */
export const writeStarted = (state: OwnWal, mark: Option.Option<WalMark>): OwnWal => {
  if (!startsSpan(state)) return { ...state, writing: state.writing + 1 }
  return Option.match(mark, {
    onNone: () => ({ ...state, writing: 1, since: null, unmeasured: true }),
    onSome: (since) => ({ ...state, writing: 1, since })
  })
}

/** Whether a unit that stops writing now ends the span (and so needs the WAL position read). */
export const endsSpan = (state: OwnWal): boolean => state.writing === 1

/** A unit stops writing; `mark` is the position where the span ends, when it ends with this unit. */
export const writeEnded = (state: OwnWal, mark: Option.Option<WalMark>): OwnWal => {
  if (state.writing === 0) return state
  if (!endsSpan(state)) return { ...state, writing: state.writing - 1 }
  const closed = { ...state, writing: 0, since: null }
  if (state.since === null || Option.isNone(mark)) return { ...closed, unmeasured: true }
  return { ...closed, ...spanPart(state, state.since, mark.value) }
}

/** The state with the span from `since` to `mark` added to what the next round takes. */
const spanPart = (state: OwnWal, since: WalMark, mark: WalMark) => ({
  bytes: state.bytes + Math.max(0, mark.position - since.position),
  millis: state.millis + Math.max(0, mark.at - since.at)
})

/**
 * A round at `mark` takes everything Sweeper wrote since the previous round, a span still open
 * included (its part up to `mark`; the rest is the next round's). A round that could not read the
 * position takes nothing: what Sweeper wrote is left for the next round that can.
 */
export const takeOwn = (state: OwnWal, mark: WalMark): readonly [OwnShare, OwnWal] => {
  const open = state.since
  const upTo = open === null ? state : { ...state, ...spanPart(state, open, mark) }
  const share = { bytes: upTo.bytes, millis: upTo.millis, unmeasured: state.unmeasured }
  const next: OwnWal = {
    writing: state.writing,
    since: open === null ? null : { at: Math.max(mark.at, open.at), position: Math.max(mark.position, open.position) },
    bytes: 0,
    millis: 0,
    // A span whose start was not read stays unmeasured until it ends.
    unmeasured: state.writing > 0 && open === null
  }
  return [share, next]
}

/**
 * A round whose gaps between Sweeper's writes are shorter than this share of it says too little of
 * the platform: it adds no sample (the window still moves on).
 */
export const MIN_PLATFORM_SHARE = 0.1

/**
 * The platform's WAL rate (bytes/s) between two rounds, Sweeper's own share taken out; None when it
 * cannot be known (a position not read, Sweeper writing through almost all of the round).
 */
export const platformRate = (previous: WalMark, current: WalMark, own: OwnShare): Option.Option<number> => {
  const millis = current.at - previous.at
  if (millis <= 0 || own.unmeasured) return Option.none()
  const outside = millis - Math.min(own.millis, millis)
  if (outside < millis * MIN_PLATFORM_SHARE) return Option.none()
  const bytes = current.position - previous.position - own.bytes
  return Option.some(Math.max(0, bytes) / (outside / 1000))
}

/** The samples still inside the window at `now`: every round forgets the older ones, sample or not. */
export const windowed = (
  samples: ReadonlyArray<Sample>,
  now: number,
  window: Duration.Duration = BASELINE_WINDOW
): ReadonlyArray<Sample> => {
  const from = now - Duration.toMillis(window)
  const oldest = samples[0]
  return oldest === undefined || oldest.at > from ? samples : samples.filter((sample) => sample.at > from)
}
