/**
 * What waits for a repair right now, per batch, and how old the oldest is.
 * Read from cheap, bounded reads (a capped count; `capped: true` means "more than `count`"),
 * sampled on a timer by the layer and served from memory, so a page view or a scrape never reads a
 * GitLab table. The dashboard's overview and `/metrics` (`sweeper_backlog{batch}`,
 * `sweeper_backlog_oldest_seconds{batch}`) both show `current`.
 */
import { Context, type Effect } from "effect"

/** One kind of waiting thing (e.g. the deferred jobs of one worker). */
export interface BacklogPart {
  readonly label: string
  readonly count: number
  /** More than `count` wait: the read stopped at its cap. */
  readonly capped: boolean
  /** When the oldest waiting thing became due for a repair; null when none or unknown. */
  readonly oldestAt: Date | null
}

export interface BatchBacklog {
  readonly batch: string
  /** What waits, in words ("canceling builds past the 1 h cutoff"). */
  readonly what: string
  readonly count: number
  readonly capped: boolean
  readonly oldestAt: Date | null
  readonly parts: ReadonlyArray<BacklogPart>
  /** Why this batch's backlog could not be read on the last sample (its store down, …). */
  readonly error: string | null
}

export interface BacklogSnapshot {
  /** When it was sampled; null before the first sample finished. */
  readonly sampledAt: Date | null
  readonly batches: ReadonlyArray<BatchBacklog>
}

/** The most entries any backlog read looks at: a count beyond it is reported as "more than". */
export const BACKLOG_CAP = 1000

export class Backlog extends Context.Service<Backlog, {
  /** The latest sample, from memory (never a database or Redis read). */
  readonly current: Effect.Effect<BacklogSnapshot>
  /** Samples every batch now and makes it `current` (the layer's timer calls this). */
  readonly refresh: Effect.Effect<BacklogSnapshot>
}>()("sweeper/services/Backlog") {}
