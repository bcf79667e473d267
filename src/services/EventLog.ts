/**
 * The append-only event log (`sweeper_events`). `append` joins the caller's SQL transaction when
 * there is one, so a repair and its event commit together; the run id comes from `CurrentRun`.
 */
import * as Context from "effect/Context"
import type * as Effect from "effect/Effect"
import type { SqlError } from "effect/sql/SqlError"
import type { DomainEvent, StoredEvent } from "../domain/Events.ts"

export interface EventFilter {
  readonly stream?: string | undefined
  /** Prefix match on the stream, e.g. `build:` or `batch:`. */
  readonly streamPrefix?: string | undefined
  readonly type?: string | undefined
  readonly runId?: string | undefined
  readonly since?: Date | undefined
  readonly until?: Date | undefined
  /** Newest first when set; default oldest first. */
  readonly newestFirst?: boolean | undefined
  readonly limit?: number | undefined
}

export class EventLog extends Context.Service<EventLog, {
  append(event: DomainEvent): Effect.Effect<void, SqlError>
  /** Appends many events in one statement (a page's repairs), in order; nothing for an empty list. */
  appendAll(events: ReadonlyArray<DomainEvent>): Effect.Effect<void, SqlError>
  query(filter: EventFilter): Effect.Effect<ReadonlyArray<StoredEvent>, SqlError>
  /** Runs `effect` atomically with the events it appends (a SQL transaction, or a memory commit). */
  transaction<A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E | SqlError, R>
}>()("sweeper/services/EventLog") {}
