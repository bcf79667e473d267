/** RebalanceReschedule over the job queue and the event log: the events go in each slice's `beforePush`. */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { RebalanceRescheduled } from "../../domain/Events.ts"
import {
  type RebalanceType,
  REBALANCING_QUEUE,
  REBALANCING_WORKER,
  rebalancingWorkerArgs
} from "../../domain/Rebalancing.ts"
import { EventLog } from "../../services/EventLog.ts"
import { JobQueue } from "../../services/JobQueue.ts"
import { RebalanceReschedule } from "../../services/RebalanceReschedule.ts"

export const RebalanceRescheduleLive = Layer.effect(
  RebalanceReschedule,
  Effect.gen(function*() {
    const jobQueue = yield* JobQueue
    const events = yield* EventLog
    const reschedule = Effect.fnUntraced(function*(type: RebalanceType, ids: ReadonlyArray<number>) {
      // Slices arrive in order: `recorded` is where the next slice starts in `ids`.
      let recorded = 0
      const outcomes = yield* jobQueue.bulkEnqueue({
        workerClass: REBALANCING_WORKER,
        queue: REBALANCING_QUEUE,
        args: ids.map((id) => rebalancingWorkerArgs(type, id)),
        deduplicate: "until_executed"
      }, (slice) => {
        const first = recorded
        recorded += slice.length
        return events.appendAll(slice.map((outcome, i) =>
          new RebalanceRescheduled({
            type,
            id: ids[first + i]!,
            jid: outcome._tag === "Duplicate" ? outcome.existingJid : outcome.jid,
            duplicate: outcome._tag === "Duplicate"
          })
        ))
      })
      const enqueued = outcomes.filter((outcome) => outcome._tag === "Enqueued").length
      return { enqueued, duplicates: ids.length - enqueued }
    })
    return RebalanceReschedule.of({ reschedule })
  })
)
