/** EventLog in memory: the events of a failed `transaction` are rolled back like SQL's. */
import * as Context from "effect/Context"
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import { CurrentRun } from "../../domain/Batch.ts"
import { dataOf, type DomainEvent, type StoredEvent, streamOf } from "../../domain/Events.ts"
import { type EventFilter, EventLog } from "../../services/EventLog.ts"

export class MemoryEvents
  extends Context.Service<MemoryEvents, Array<StoredEvent>>()("sweeper/layers/memory/MemoryEvents")
{
  static readonly layer = Layer.sync(MemoryEvents, () => [])
}

const matches = (filter: EventFilter) => (event: StoredEvent) =>
  (filter.stream === undefined || event.stream === filter.stream) &&
  (filter.streamPrefix === undefined || event.stream.startsWith(filter.streamPrefix)) &&
  (filter.type === undefined || event.type === filter.type) &&
  (filter.runId === undefined || event.runId === filter.runId) &&
  (filter.since === undefined || event.occurredAt >= filter.since) &&
  (filter.until === undefined || event.occurredAt < filter.until)

export const EventLogMemory = Layer.effect(
  EventLog,
  Effect.gen(function*() {
    const events = yield* MemoryEvents
    // Ids only grow, like bigserial: a prune (EventRetentionMemory) removes events from the middle
    // or the end, so the array's length is no id. Specs that push seeded events keep theirs.
    let lastId = 0
    const nextId = () => (lastId = Math.max(lastId, events.at(-1)?.id ?? 0) + 1)
    const append = (event: DomainEvent) =>
      Effect.gen(function*() {
        const run = yield* CurrentRun
        const now = yield* DateTime.now
        events.push({
          id: nextId(),
          stream: streamOf(event),
          type: event._tag,
          data: dataOf(event),
          runId: run.runId,
          occurredAt: DateTime.toDateUtc(now)
        })
      })
    const appendAll = (batch: ReadonlyArray<DomainEvent>) => Effect.forEach(batch, append, { discard: true })
    const query = (filter: EventFilter) =>
      Effect.sync(() => {
        const found = events.filter(matches(filter))
        if (filter.newestFirst === true) found.reverse()
        return filter.limit === undefined ? found : found.slice(0, filter.limit)
      })
    const transaction = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
      Effect.suspend(() => {
        const mark = events.length
        return Effect.onExit(effect, (exit) =>
          Effect.sync(() => {
            if (Exit.isFailure(exit)) events.splice(mark)
          }))
      })
    return EventLog.of({ append, appendAll, query, transaction })
  })
).pipe(Layer.provideMerge(MemoryEvents.layer))
