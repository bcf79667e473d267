/**
 * Run summaries travel in RunFinished events, log lines and `--json`: they must stay small whatever
 * the backlog (a 49 k-job repair once made a 1.2 MB event). Id lists keep their first entries and
 * the summary keeps the full count; every repaired entity has its own event with its id.
 */
export const SUMMARY_LIST_CAP = 100

/** The first SUMMARY_LIST_CAP entries. */
export const capped = <A>(list: ReadonlyArray<A>): ReadonlyArray<A> =>
  list.length <= SUMMARY_LIST_CAP ? list : list.slice(0, SUMMARY_LIST_CAP)
