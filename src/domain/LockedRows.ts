/**
 * Rows skipped because another open transaction held them. Skipping keeps a page from stalling on
 * one lock, and the next run finds the row again; but a row held run after run (a stuck session,
 * a forgotten transaction) would be skipped silently forever. So each row's skips are counted in
 * runs: how many runs in a row skipped it. A run counts a row once however often it meets it (a
 * page revisited, a retried attempt), and a run that gets past the row (repairs it, or finds it no
 * longer a candidate) forgets it. A row skipped in LOCKED_RUNS_WARNING runs in a row is warned about.
 */
import * as Duration from "effect/Duration"

/** A row skipped as locked in this many runs in a row is warned about (each run after, too). */
export const LOCKED_RUNS_WARNING = 3

/**
 * How long a row's count outlives its last skip: longer than the longest period of a batch that
 * skips locked rows (hourly, daily for prune-events within a day's slack), so consecutive runs add
 * up; a row no longer met (deleted elsewhere, so never got past) is forgotten.
 */
export const LOCKED_COUNT_TTL = Duration.days(1)

/**
 * The batch's counts: Sweeper's own hash, one field per row id, its value `<runs> <run id> <last
 * skip, epoch ms>` (`encodeCount`). One key per batch (one hash slot), so a run reads every row it
 * has counted in one round trip and forgets a page's rows in one command.
 */
export const lockedRowsKey = (batch: string) => `sweeper:locked_rows:{${batch}}`

/** One row's count: runs in a row that skipped it, the last of them, and when. */
export interface LockedRowCount {
  readonly runs: number
  readonly run: string
  readonly skippedAt: number
}

export const encodeCount = (count: LockedRowCount): string => `${count.runs} ${count.run} ${count.skippedAt}`

/** The stored form back; a value that is not one (written by something else) is no count. */
export const decodeCount = (value: string | null | undefined): LockedRowCount | undefined => {
  const match = value == null ? null : /^(\d+) (\S+) (\d+)$/.exec(value)
  if (match === null) return undefined
  const [, runs, run, skippedAt] = match
  return runs === undefined || run === undefined || skippedAt === undefined
    ? undefined
    : { runs: Number(runs), run, skippedAt: Number(skippedAt) }
}

/** Whether a count is past LOCKED_COUNT_TTL since its last skip at `now`: then it is forgotten. */
export const countExpired = (count: LockedRowCount, now: number) =>
  now - count.skippedAt >= Duration.toMillis(LOCKED_COUNT_TTL)

/** What one skip of a row in `run` makes of its count, and whether it is the run's first skip of it. */
export const countSkip = (
  previous: LockedRowCount | undefined,
  run: string,
  now: number
): { readonly count: LockedRowCount; readonly first: boolean } => {
  const live = previous === undefined || countExpired(previous, now) ? undefined : previous
  const first = live?.run !== run
  return { count: { runs: (live?.runs ?? 0) + (first ? 1 : 0), run, skippedAt: Math.floor(now) }, first }
}

/** A row's answer to a skip: runs in a row so far (this one included), and whether this run had not counted it yet. */
export interface SkipCount {
  readonly runs: number
  readonly first: boolean
}

/**
 * The rows to warn about: counted LOCKED_RUNS_WARNING runs in a row or more, once per run (on the
 * run's first skip of each).
 */
export const lockedTooOften = (
  ids: ReadonlyArray<string | number>,
  counts: ReadonlyArray<SkipCount>
): ReadonlyArray<{ readonly id: string | number; readonly runs: number }> =>
  ids.flatMap((id, i) => {
    const count = counts[i]
    return count !== undefined && count.first && count.runs >= LOCKED_RUNS_WARNING ? [{ id, runs: count.runs }] : []
  })
