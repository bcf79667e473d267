/**
 * Run summaries travel in RunFinished events, log lines and `--json`: they must stay small whatever
 * the backlog (a 49 k-job repair once made a 1.2 MB event). Id lists keep their first entries and
 * the summary keeps the full count; every repaired entity has its own event with its id.
 */
export const SUMMARY_LIST_CAP = 100

/** The first SUMMARY_LIST_CAP entries. */
export const capped = <A>(list: ReadonlyArray<A>): ReadonlyArray<A> =>
  list.length <= SUMMARY_LIST_CAP ? list : list.slice(0, SUMMARY_LIST_CAP)

const isRecord = (value: unknown): value is Record<string, unknown> =>
  typeof value === "object" && value !== null && !Array.isArray(value)

/**
 * The items a run repaired: the sum of the summary's `fields` that are numbers. Undefined when the
 * batch names no fields or the summary has none of them (a run killed before it reported).
 */
export const repairedItems = (summary: unknown, fields: ReadonlyArray<string> | undefined): number | undefined => {
  if (fields === undefined || !isRecord(summary)) return undefined
  const counts = fields.map((field) => summary[field]).filter((value) => typeof value === "number")
  return counts.length === 0 ? undefined : counts.reduce((sum, n) => sum + n, 0)
}

/*
 * Adding up run summaries: what a run retried by the run guard reports is the sum of its attempts
 * (src/supervisor/RunGuard.ts, `reportProgress` in Batch.ts).
 */

/**
 * `earlier` + `later`: numbers add, booleans OR, lists concatenate (capped like every summary
 * list: the first SUMMARY_LIST_CAP entries), records merge key by key (the later's keys first);
 * anything else: the later value wins.
 */
export const addSummaries = (earlier: unknown, later: unknown): unknown => {
  if (later === undefined) return earlier
  if (typeof earlier === "number" && typeof later === "number") return earlier + later
  if (typeof earlier === "boolean" && typeof later === "boolean") return earlier || later
  if (Array.isArray(earlier) && Array.isArray(later)) return capped([...earlier, ...later])
  if (isRecord(earlier) && isRecord(later)) return mergeSummaries(earlier, later)
  return later
}

/** Two summaries merged key by key, as `addSummaries` merges records (the later's keys first). */
export const mergeSummaries = (
  earlier: Readonly<Record<string, unknown>>,
  later: Readonly<Record<string, unknown>>
): Record<string, unknown> => {
  const merged: Record<string, unknown> = {}
  for (const [key, value] of Object.entries(later)) {
    merged[key] = key in earlier
      ? addSummaries(earlier[key], value)
      : value
  }
  for (const [key, value] of Object.entries(earlier)) if (!(key in later)) merged[key] = value
  return merged
}

/**
 * A run's progress across attempts. Each attempt's reports accumulate in `current`; when another
 * attempt starts, the previous one failed and its reports become `failed`. The final summary is
 * the last attempt's own summary (authoritative for what it did) plus the failed attempts' reports.
 */
export class RunProgress {
  private failed: Record<string, unknown> = {}
  private current: Record<string, unknown> = {}
  private attempts = 0

  readonly report = (counts: Readonly<Record<string, unknown>>): void => {
    this.current = mergeSummaries(this.current, counts)
  }

  newAttempt(): void {
    if (this.attempts++ > 0) this.failed = mergeSummaries(this.failed, this.current)
    this.current = {}
  }

  summarize(lastAttempt: unknown): unknown {
    if (Object.keys(this.failed).length === 0 || !isRecord(lastAttempt)) return lastAttempt
    return addSummaries(this.failed, lastAttempt)
  }

  /**
   * The summary of a run that ended without one (failed, timed out, interrupted): what every
   * attempt reported, the last one included; null when nothing was reported.
   */
  reported(): Record<string, unknown> | null {
    const all = mergeSummaries(this.failed, this.current)
    return Object.keys(all).length === 0 ? null : all
  }
}
