/**
 * What each batch running in this process has done so far: units reported
 * (pages, steps, passes: one `reportProgress` each) and the repairs they add up to. The run guard
 * registers a run's progress sink here for the run's lifetime; the views the dashboard and
 * `/api/stream` send read it, so a running batch's card moves while it runs. Process-wide, like the
 * scheduler's actors: a run in another replica shows when its events land.
 */
import type { ProgressSink } from "../domain/Batch.ts"
import type { RunProgress } from "../domain/Summary.ts"

export interface LiveRun {
  readonly runId: string
  readonly startedAt: string
  readonly units: number
  /** The run's summary so far (what its reports add up to, retried attempts included). */
  readonly counts: Record<string, unknown> | null
}

const running = new Map<
  string,
  { readonly runId: string; readonly startedAt: Date; units: number; readonly progress: RunProgress }
>()

/** Registers a run; the returned sink counts units and forwards the counts to `progress`. */
export const trackRun = (
  batch: string,
  runId: string,
  startedAt: Date,
  progress: RunProgress
): ProgressSink & { readonly done: () => void } => {
  const entry = { runId, startedAt, units: 0, progress }
  running.set(batch, entry)
  return {
    report: (counts) => {
      entry.units++
      progress.report(counts)
    },
    done: () => {
      if (running.get(batch) === entry) running.delete(batch)
    }
  }
}

export const liveRun = (batch: string): LiveRun | null => {
  const entry = running.get(batch)
  return entry === undefined
    ? null
    : {
      runId: entry.runId,
      startedAt: entry.startedAt.toISOString(),
      units: entry.units,
      counts: entry.progress.reported()
    }
}
