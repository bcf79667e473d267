/**
 * What the console reads about runs: one run with its timings and error, its repairs
 * paged by keyset, and a batch's runs over a window for the history charts. Read-only, separate
 * from EventLog so paging and the per-run rollup stay out of the append path's contract.
 */
import { Context, type Effect } from "effect"
import type { SqlError } from "effect/sql/SqlError"
import type { StoredEvent } from "../domain/Events.ts"

/** A run as the run page shows it: RunStarted + RunFinished + its holds. */
export interface RunDetail {
  readonly runId: string
  readonly batch: string
  readonly trigger: string | null
  readonly node: string | null
  readonly dryRun: boolean
  readonly startedAt: Date | null
  /** Null while the run is still going (or was killed before its RunFinished). */
  readonly finishedAt: Date | null
  readonly durationMs: number | null
  readonly outcome: string | null
  readonly reason: string | null
  readonly summary: unknown
  /** The error's one line and its cause, as the run guard described it. */
  readonly error: string | null
  /** RepairHeld / RepairReleased events of the run (health gate), oldest first. */
  readonly holds: ReadonlyArray<StoredEvent>
  /** The run's repair events (every stream but `batch:…`). */
  readonly repairs: number
}

/** One run in a batch's history: one mark per chart. */
export interface RunPoint {
  readonly runId: string
  readonly startedAt: Date | null
  readonly finishedAt: Date
  readonly durationMs: number
  readonly outcome: string
  readonly repairs: number
}

export interface RepairPage {
  readonly events: ReadonlyArray<StoredEvent>
  /** The id to pass as `after` for the next page; null on the last page. */
  readonly next: number | null
}

/** At most this many runs per history window: 30 days of an every-minute batch is 43 200. */
export const HISTORY_MAX_RUNS = 2000
export const REPAIRS_PAGE = 100
export const REPAIRS_PAGE_MAX = 1000

export class RunHistory extends Context.Service<RunHistory, {
  /** None-ish: null when no event carries this run id. */
  run(runId: string): Effect.Effect<RunDetail | null, SqlError>
  /**
   * The run's repair events oldest first, `limit` after event id `after` (keyset: a page costs the
   * same on the first page and the hundredth), optionally of one type.
   */
  repairs(
    runId: string,
    options: { readonly after?: number | undefined; readonly type?: string | undefined; readonly limit: number }
  ): Effect.Effect<RepairPage, SqlError>
  /**
   * The batch's finished runs with `since <= finishedAt`, oldest first, at most HISTORY_MAX_RUNS
   * (the newest of them when there are more).
   */
  history(batch: string, since: Date): Effect.Effect<ReadonlyArray<RunPoint>, SqlError>
}>()("sweeper/services/RunHistory") {}
