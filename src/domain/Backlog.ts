/**
 * What a batch's backlog reader returns: the things waiting for that batch's repair now, found by
 * the batch's own read and judged by the batch's own decision (the reader sits beside the program
 * and calls the same service method and domain predicate), so the backlog and the run cannot drift.
 */
import * as DateTime from "effect/DateTime"

/** The most entries any backlog read looks at: a count beyond it is reported as "more than". */
export const BACKLOG_CAP = 1000

/** One kind of waiting thing (e.g. the deferred jobs of one worker). */
export interface BacklogPart {
  readonly label: string
  readonly count: number
  /** More than `count` wait: the read stopped at its cap. */
  readonly capped: boolean
  /** When the oldest waiting thing became due for a repair; null when none or unknown. */
  readonly oldestAt: Date | null
}

/** One batch's reading: its parts, and why the figure may be incomplete or old. */
export interface BacklogReading {
  readonly parts: ReadonlyArray<BacklogPart>
  /** More wait than the parts count, beyond what any part says (e.g. more workers than were read). */
  readonly capped?: boolean
  /** The figure rests on knowledge older than one sample (e.g. a keyspace sweep still under way). */
  readonly stale?: boolean
  /** In words, what is capped or stale and why; null when the figure is whole and fresh. */
  readonly note?: string | null
}

export const backlogPart = (
  label: string,
  count: number,
  capped: boolean,
  oldestAt: DateTime.Utc | Date | null
): BacklogPart => ({
  label,
  count,
  capped,
  oldestAt: oldestAt === null ? null : oldestAt instanceof Date ? oldestAt : DateTime.toDateUtc(oldestAt)
})

/** The earliest of some instants; null for none. */
export const earliest = (instants: ReadonlyArray<DateTime.Utc>): DateTime.Utc | null =>
  instants.reduce<DateTime.Utc | null>((min, at) => (min === null || DateTime.isLessThan(at, min) ? at : min), null)
