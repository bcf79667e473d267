/** EventRetention over the memory event store: the domain rule (`prunable`) applied directly. */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { checkFence } from "../../domain/Batch.ts"
import { EventsPruned } from "../../domain/Events.ts"
import { prunable } from "../../domain/Retention.ts"
import { EventLog } from "../../services/EventLog.ts"
import { EventRetention } from "../../services/EventRetention.ts"
import { MemoryEvents } from "./EventLogMemory.ts"

export const EventRetentionMemory = Layer.effect(
  EventRetention,
  Effect.gen(function*() {
    const events = yield* MemoryEvents
    const log = yield* EventLog
    // Oldest first by time, as the SQL store pages by occurred_at.
    const victims = (before: Date, kept: ReadonlyArray<number>) => {
      const keep = new Set(kept)
      return events.filter((e) => e.occurredAt.getTime() < before.getTime() && !keep.has(e.id))
        .sort((a, b) => a.occurredAt.getTime() - b.occurredAt.getTime() || a.id - b.id)
    }
    return EventRetention.of({
      kept: (before) =>
        Effect.sync(() => {
          const gone = new Set(prunable(events, before).map((e) => e.id))
          return events.filter((e) => e.occurredAt.getTime() < before.getTime() && !gone.has(e.id)).map((e) => e.id)
        }),
      countPrunable: (before, kept) => Effect.sync(() => victims(before, kept).length),
      prunePage: (before, kept, limit) =>
        log.transaction(Effect.gen(function*() {
          yield* checkFence
          const page = victims(before, kept).slice(0, limit)
          // No other transactions in memory: nothing is ever held.
          if (page.length === 0) return { pruned: 0, locked: [] }
          yield* log.append(new EventsPruned({ before: before.toISOString(), count: page.length }))
          // Last, after everything that could fail: the memory transaction rolls back appends only.
          const gone = new Set(page.map((e) => e.id))
          const remaining = events.filter((e) => !gone.has(e.id))
          events.splice(0, events.length, ...remaining)
          return { pruned: page.length, locked: [] }
        }))
    })
  })
)
