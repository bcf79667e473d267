/**
 * How a run's summary is read, wherever it is shown (the console's card, run page and runs table,
 * `sweeper run` and `sweeper events`): the batch's own repairs first, in the order the batch
 * declares them (`repairedCounts`), then its other counts by name, then what the health gate held.
 * A summary comes back from PostgreSQL's jsonb in jsonb's key order, which put the main count
 * fourth. In a dry run nothing was repaired: its repair counts say what the run would do.
 */
import { batches } from "../programs/index.ts"

const GATE_KEYS: ReadonlyArray<string> = ["held", "heldMs", "heldBy"]

/** A dry run's repair counts, as what it would do. */
const WOULD: Readonly<Record<string, string>> = {
  dropped: "would drop",
  doomed: "would doom",
  failed: "would fail",
  failedJids: "would fail (jids)",
  pruned: "would prune",
  totalDeletedStaleEntries: "would delete",
  enqueuedNamespaces: "would enqueue namespaces",
  enqueuedProjects: "would enqueue projects",
  resumedJobs: "would resume jobs"
}

const isRecord = (value: unknown): value is Record<string, unknown> =>
  typeof value === "object" && value !== null && !Array.isArray(value)

/** The batch's repair counts (`repairedCounts`), in its declared order; none for an unknown batch. */
export const repairedCountsOf = (batch: string): ReadonlyArray<string> =>
  batches.find((b) => b.name === batch)?.repairedCounts ?? []

/** `keys` in reading order: repairs as declared, the rest by name, the health gate's last. */
export const summaryKeyOrder = (keys: ReadonlyArray<string>, repaired: ReadonlyArray<string>): Array<string> => [
  ...repaired.filter((key) => keys.includes(key)),
  ...keys.filter((key) => !repaired.includes(key) && !GATE_KEYS.includes(key)).sort(),
  ...GATE_KEYS.filter((key) => keys.includes(key))
]

/** The summary with its keys in reading order (anything that is not a record, unchanged). */
export const orderedSummary = (summary: unknown, batch: string): unknown =>
  isRecord(summary)
    ? Object.fromEntries(summaryKeyOrder(Object.keys(summary), repairedCountsOf(batch)).map((k) => [k, summary[k]]))
    : summary

/** A dry run's word for one of its repair counts (`would drop`), or undefined for any other key. */
export const dryRunLabel = (key: string, dryRun: boolean): string | undefined => dryRun ? WOULD[key] : undefined
