/**
 * Rows skipped because another open transaction held them. Skipping keeps a page from stalling on
 * one lock, and the next run finds the row again; but a row held run after run (a stuck session,
 * a forgotten transaction) would be skipped silently forever. So each skip is counted per row
 * across runs, and a row skipped in LOCKED_RUNS_WARNING runs in a row is warned about.
 */
import * as Duration from "effect/Duration"

/** A row skipped as locked in this many runs in a row is warned about (each run after, too). */
export const LOCKED_RUNS_WARNING = 3

/**
 * How long a row's count outlives its last skip: longer than the longest period of a batch that
 * skips locked rows (hourly), so consecutive runs add up; a row no longer skipped is forgotten.
 */
export const LOCKED_COUNT_TTL = Duration.days(1)

/** The count's key: Sweeper's own, one per row, all of a batch in one hash slot. */
export const lockedRowKey = (batch: string, id: string | number) => `sweeper:locked_rows:{${batch}}:${id}`

/** The rows whose count reached the warning threshold, with their counts. */
export const lockedTooOften = (
  ids: ReadonlyArray<string | number>,
  counts: ReadonlyArray<number>
): ReadonlyArray<{ readonly id: string | number; readonly runs: number }> =>
  ids.flatMap((id, i) => (counts[i] ?? 0) >= LOCKED_RUNS_WARNING ? [{ id, runs: counts[i]! }] : [])
