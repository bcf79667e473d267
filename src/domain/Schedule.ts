/**
 * Cron arithmetic for the scheduler, pure: when the next tick is, which ticks a stopped process
 * missed, and what to do about them at start-up.
 */
import * as Cron from "effect/Cron"
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Result from "effect/Result"

export type MissedRunPolicy =
  /** Run the latest missed tick once at start-up if it is younger than one period; skip the rest. */
  | "run-latest-if-recent"
  /** Never catch up: record every missed tick and wait for the next one. */
  | "skip"

export const DEFAULT_MISSED_RUN_POLICY: MissedRunPolicy = "run-latest-if-recent"

/** Missed ticks older than this many are summarised in a log line rather than recorded one by one. */
export const MAX_RECORDED_MISSED_TICKS = 100

/**
 * UTC (the default) as a fixed offset of zero rather than the named zone "UTC": the same instants
 * and calendar fields, without an Intl.DateTimeFormat — creating one pages in ICU's time zone data,
 * about 12 MB of resident memory an idle supervisor does not need. Any other zone is named.
 */
const UTC_NAMES = new Set(["UTC", "Etc/UTC"])
const cronZone = (timezone: string): string | DateTime.TimeZone =>
  UTC_NAMES.has(timezone) ? DateTime.zoneMakeOffset(0) : timezone

export const parseCron = (expression: string, timezone: string): Result.Result<Cron.Cron, string> =>
  Result.mapError(Cron.parse(expression, cronZone(timezone)), (error) => error.message)

export const nextTick = (cron: Cron.Cron, after: Date): Date => Cron.next(cron, after)

/** The latest tick at or before `at`. */
export const latestTick = (cron: Cron.Cron, at: Date): Date => {
  const previous = Cron.prev(cron, new Date(at.getTime() + 1))
  return previous
}

/** The length of the period that starts at `tick`. */
export const periodAt = (cron: Cron.Cron, tick: Date): Duration.Duration =>
  Duration.millis(Cron.next(cron, tick).getTime() - tick.getTime())

/** Never shorter than this: the replicas' clocks and schedulers agree on a tick within far less. */
export const TICK_CLAIM_FLOOR = Duration.minutes(10)
/** Never longer: a daily batch's claim outlives its next tick's. */
export const TICK_CLAIM_CEILING = Duration.hours(25)

/**
 * How long a tick's claim (one replica in the cluster runs it) is kept: two periods, within
 * [TICK_CLAIM_FLOOR, TICK_CLAIM_CEILING]. Another replica fires the same tick within its clock skew,
 * or catches it up at start-up only while it is younger than one period (`planStartup`), and by then
 * the run's RunStarted or TickMissed in the ledger covers it. Claims are never released, so one key a
 * batch a tick is alive at a time for as long as this: at a two-second cadence a day's worth was
 * 43,200 keys a batch; now 300.
 */
export const tickClaimTtl = (period: Duration.Duration): Duration.Duration =>
  Duration.clamp(Duration.times(period, 2), { minimum: TICK_CLAIM_FLOOR, maximum: TICK_CLAIM_CEILING })

/**
 * The length of the period `at` falls in (latest tick to the next one). For an irregular cron
 * (`0 9,17 * * *`) it changes through the day; "two periods without success" is then judged against
 * the period the batch is in now.
 */
export const currentPeriod = (cron: Cron.Cron, at: Date): Duration.Duration => periodAt(cron, latestTick(cron, at))

export interface StartupPlan {
  /** The tick to run now, if any. */
  readonly runTick: Date | undefined
  /** Ticks that will not run, newest first, at most MAX_RECORDED_MISSED_TICKS. */
  readonly missed: ReadonlyArray<Date>
  /** How many missed ticks exist in total (may exceed `missed.length`). */
  readonly missedTotal: number
}

/**
 * What to do at start-up given the last tick this batch is known to have covered (from its events).
 * No history means nothing was missed: the batch was never supposed to have run.
 */
export const planStartup = (
  cron: Cron.Cron,
  lastCovered: Date | undefined,
  now: Date,
  policy: MissedRunPolicy
): StartupPlan => {
  if (lastCovered === undefined) return { runTick: undefined, missed: [], missedTotal: 0 }
  const missed: Array<Date> = []
  let total = 0
  let tick = latestTick(cron, now)
  while (tick.getTime() > lastCovered.getTime()) {
    total++
    if (missed.length < MAX_RECORDED_MISSED_TICKS + 1) missed.push(tick)
    else if (total > 100_000) break
    tick = Cron.prev(cron, tick)
  }
  const newest = missed[0]
  if (newest === undefined) return { runTick: undefined, missed: [], missedTotal: 0 }
  const recent = now.getTime() - newest.getTime() < Duration.toMillis(periodAt(cron, newest))
  if (policy === "run-latest-if-recent" && recent) {
    return { runTick: newest, missed: missed.slice(1, MAX_RECORDED_MISSED_TICKS + 1), missedTotal: total - 1 }
  }
  return { runTick: undefined, missed: missed.slice(0, MAX_RECORDED_MISSED_TICKS), missedTotal: total }
}

/** `drop-canceling-builds` → `SWEEPER_CRON_DROP_CANCELING_BUILDS`. */
export const cronVariable = (batch: string) => `SWEEPER_CRON_${batch.toUpperCase().replace(/-/g, "_")}`

/** `drop-canceling-builds` → `SWEEPER_LEASE_TTL_DROP_CANCELING_BUILDS`. */
export const leaseTtlVariable = (batch: string) => `SWEEPER_LEASE_TTL_${batch.toUpperCase().replace(/-/g, "_")}`

/**
 * How far ahead a cron must have a tick to be accepted: 8 years covers the longest gap between two
 * 29ths of February (2096 → 2104). `0 0 31 2 *` has none and would crash-loop the ticker.
 */
export const CRON_HORIZON = Duration.days(8 * 366)

/** Whether `cron` has a tick after `from` and within `horizon`. */
export const firesWithin = (cron: Cron.Cron, from: Date, horizon: Duration.Duration): boolean => {
  try {
    return Cron.next(cron, from).getTime() - from.getTime() <= Duration.toMillis(horizon)
  } catch {
    // Cron.next throws when its search finds no date at all.
    return false
  }
}
