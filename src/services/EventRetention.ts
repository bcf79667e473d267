/**
 * Pruning `sweeper_events` (domain/Retention.ts says what goes and what stays). A store apart from
 * EventLog: only the prune-events batch deletes events, every other caller only appends and reads.
 */
import * as Context from "effect/Context"
import type * as Effect from "effect/Effect"
import type { SqlError } from "effect/sql/SqlError"
import type { FenceError } from "../domain/Errors.ts"

export interface PrunedPage {
  readonly pruned: number
  readonly locked: ReadonlyArray<number>
}

export class EventRetention extends Context.Service<EventRetention, {
  /**
   * The ids of events older than `before` that must survive it: those batch state is folded from
   * (`keptForState`). Computed once per run; events appended later only ever make fewer of them
   * necessary (a newer pause, success or start takes over), so the list stays safe for the run.
   */
  kept(before: Date): Effect.Effect<ReadonlyArray<number>, SqlError>
  /** How many events a prune at `before` would delete (older than it, not in `kept`). */
  countPrunable(before: Date, kept: ReadonlyArray<number>): Effect.Effect<number, SqlError>
  /**
   * Deletes up to `limit` of the oldest prunable events and appends `EventsPruned{before, count}`,
   * in one short transaction that checks the run's lease fence first. Returns the count (`pruned`,
   * 0: done) and the ids of prunable events passed over because another open transaction held
   * their row (`locked`): the DELETE never waits for one, a later page or run deletes it.
   */
  prunePage(before: Date, kept: ReadonlyArray<number>, limit: number): Effect.Effect<PrunedPage, SqlError | FenceError>
}>()("sweeper/services/EventRetention") {}
