/**
 * The holds the event log says are open: the fold of a batch's RepairHeld / RepairReleased events
 * (its `:health` stream) with the RunFinished events of its runs. A hold belongs to a run: a
 * RepairHeld opens it for its run and signal, the run's RepairReleased for that signal closes it.
 *
 * A hold can be left open by a process that stopped while it was held (killed, restarted): its run
 * wrote RepairHeld and never RepairReleased. The fold says so, with when that run finished once its
 * RunFinished is in the log (any outcome, `abandoned` included: the run guard writes that for a run
 * that can no longer be running), so a restarted gate can close the hold as of its run's end, and
 * `sweeper status` stops showing it. A hold whose run has no RunFinished may still be held by a
 * live run of another process: it is reported, never closed by a process that did not open it.
 */

/** An event as the log stores it (oldest first when folded). */
export interface LedgerEvent {
  readonly type: string
  readonly data: Record<string, unknown>
  readonly runId: string | null
  readonly occurredAt: Date
}

/** A hold whose RepairHeld has no RepairReleased after it. */
export interface LeftOpen {
  readonly batch: string
  readonly signal: string
  readonly runId: string | null
  /** When it was held (the RepairHeld's time, epoch milliseconds). */
  readonly since: number
  /** The RepairHeld's fields, as written (value, threshold, stop, unit, unknown, database). */
  readonly held: Record<string, unknown>
  /** When its run finished (its RunFinished), or null while the log says it has not. */
  readonly finishedAt: number | null
}

const text = (data: Record<string, unknown>, key: string): string => typeof data[key] === "string" ? data[key] : ""

const holdKey = (runId: string | null, signal: string) => `${runId ?? ""}\u0000${signal}`

/** The holds the events leave open, in the order they were opened. */
export const leftOpen = (events: ReadonlyArray<LedgerEvent>): ReadonlyArray<LeftOpen> => {
  const open = new Map<string, LeftOpen>()
  for (const event of events) {
    const signal = text(event.data, "signal")
    if (event.type === "RepairHeld") {
      open.set(holdKey(event.runId, signal), {
        batch: text(event.data, "batch"),
        signal,
        runId: event.runId,
        since: event.occurredAt.getTime(),
        held: event.data,
        finishedAt: null
      })
    } else if (event.type === "RepairReleased") {
      open.delete(holdKey(event.runId, signal))
    } else if (event.type === "RunFinished" && event.runId !== null) {
      for (const [key, hold] of open) {
        if (hold.runId === event.runId) open.set(key, { ...hold, finishedAt: event.occurredAt.getTime() })
      }
    }
  }
  return [...open.values()]
}

/**
 * How long a hold its run never released was held: until its run finished (a hold cannot outlast its
 * run), or until `now` for one whose run the log does not say finished.
 */
export const heldUntilEnd = (hold: LeftOpen, now: number): number => Math.max(0, (hold.finishedAt ?? now) - hold.since)
