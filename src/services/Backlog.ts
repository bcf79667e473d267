/**
 * What waits for a repair right now, per batch, and how old the oldest is. Each batch's figure is
 * its own reader's (`Batch.backlog`, beside its program), judged by the batch's own decisions.
 * Read from cheap, bounded reads (a capped count; `capped: true` means "more than `count`"),
 * sampled on a timer by the layer and served from memory, so a page view or a scrape never reads a
 * GitLab table. The dashboard's overview and `/metrics` (`sweeper_backlog{batch}`,
 * `sweeper_backlog_oldest_seconds{batch}`) both show `current`.
 */
import * as Context from "effect/Context"
import type * as Effect from "effect/Effect"
import type { BacklogPart } from "../domain/Backlog.ts"

export { BACKLOG_CAP, type BacklogPart } from "../domain/Backlog.ts"

export interface BatchBacklog {
  readonly batch: string
  /** What waits, in words ("canceling builds past the 1 h cutoff"). */
  readonly what: string
  readonly count: number
  readonly capped: boolean
  readonly oldestAt: Date | null
  readonly parts: ReadonlyArray<BacklogPart>
  /** The figure rests on knowledge older than this sample (see `note`): it may miss what waits. */
  readonly stale: boolean
  /** In words, what is capped or stale and why; null when the figure is whole and fresh. */
  readonly note: string | null
  /** Why this batch's backlog could not be read on the last sample (its store down, …). */
  readonly error: string | null
}

export interface BacklogSnapshot {
  /** When it was sampled; null before the first sample finished. */
  readonly sampledAt: Date | null
  readonly batches: ReadonlyArray<BatchBacklog>
}

export class Backlog extends Context.Service<Backlog, {
  /** The latest sample, from memory (never a database or Redis read). */
  readonly current: Effect.Effect<BacklogSnapshot>
  /** Samples every batch now and makes it `current` (the layer's timer calls this). */
  readonly refresh: Effect.Effect<BacklogSnapshot>
  /** Samples only these batches (those a run just changed), the others kept as they were. */
  refreshOnly(batches: ReadonlyArray<string>): Effect.Effect<BacklogSnapshot>
}>()("sweeper/services/Backlog") {}
