/**
 * What the console reads about runs: one run with its timings and error, its repairs
 * paged by keyset, and a batch's runs over a window for the history charts. Read-only, separate
 * from EventLog so paging and the per-run rollup stay out of the append path's contract.
 */
import * as Context from "effect/Context"
import type * as Effect from "effect/Effect"
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
  /**
   * Items the run repaired (builds failed, jobs moved, entries deleted; a dry run: would have), as
   * its RunFinished says; 0 when it does not (still running, killed, or recorded before runs said).
   */
  readonly repairs: number
  /**
   * The pipelines of the builds the run dropped (their BuildDropped events' pipeline_id), smallest
   * first, at most RUN_PIPELINES_MAX: what GitLab recomputes after the run, for an operator to open.
   */
  readonly pipelines: ReadonlyArray<number>
}

/** Pipelines listed on a run page; a run that touched more says so and lists these. */
export const RUN_PIPELINES_MAX = 100

/** One run in a batch's history: one mark per chart. */
export interface RunPoint {
  readonly runId: string
  readonly startedAt: Date | null
  readonly finishedAt: Date
  readonly durationMs: number
  readonly outcome: string
  /** Items repaired, as RunDetail.repairs. A dry run's are what it would have repaired. */
  readonly repairs: number
  /** Dry runs are drawn but left out of every repair total. */
  readonly dryRun: boolean
}

/** A window's runs folded by time: what the long windows chart instead of one mark per run. */
export interface HistoryBucket {
  /** The bucket covers [start, start + bucket). */
  readonly start: Date
  readonly runs: number
  readonly dryRuns: number
  /** Real (not dry) runs by outcome. */
  readonly succeeded: number
  readonly failed: number
  /** Items repaired by the bucket's real runs; dry runs are left out. */
  readonly repairs: number
  readonly durationMsMax: number
  readonly durationMsTotal: number
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
  /**
   * Every finished run of the batch with `since <= finishedAt`, folded into buckets of `bucketMs`
   * aligned on the epoch, oldest first; empty buckets are left out. Nothing is capped.
   */
  buckets(batch: string, since: Date, bucketMs: number): Effect.Effect<ReadonlyArray<HistoryBucket>, SqlError>
}>()("sweeper/services/RunHistory") {}
