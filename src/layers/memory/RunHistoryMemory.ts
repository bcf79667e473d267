/** RunHistory over the in-memory event log (MemoryEvents), for specs: the same answers, no indexes. */
import { Effect, Layer } from "effect"
import { HISTORY_MAX_RUNS, RunHistory, type RunPoint } from "../../services/RunHistory.ts"
import { runDetailOf } from "../postgres/RunHistorySql.ts"
import { MemoryEvents } from "./EventLogMemory.ts"

const isRepair = (stream: string) => !stream.startsWith("batch:")

export const RunHistoryMemory = Layer.effect(
  RunHistory,
  Effect.gen(function*() {
    const events = yield* MemoryEvents
    const ofRun = (runId: string) => events.filter((e) => e.runId === runId)
    return RunHistory.of({
      run: (runId) =>
        Effect.sync(() => {
          const all = ofRun(runId)
          return runDetailOf(
            runId,
            all.find((e) => e.type === "RunStarted"),
            all.findLast((e) => e.type === "RunFinished"),
            all.filter((e) => e.type === "RepairHeld" || e.type === "RepairReleased"),
            all.filter((e) => isRepair(e.stream)).length
          )
        }),
      repairs: (runId, options) =>
        Effect.sync(() => {
          const found = ofRun(runId).filter((e) =>
            isRepair(e.stream) && (options.after === undefined || e.id > options.after) &&
            (options.type === undefined || e.type === options.type)
          )
          const page = found.slice(0, options.limit)
          return { events: page, next: found.length > options.limit ? page.at(-1)!.id : null }
        }),
      history: (batch, since) =>
        Effect.sync(() => {
          const points: Array<RunPoint> = []
          for (const finished of events) {
            if (
              finished.type !== "RunFinished" || finished.stream !== `batch:${batch}` || finished.runId === null ||
              finished.occurredAt < since
            ) continue
            const all = ofRun(finished.runId)
            points.push({
              runId: finished.runId,
              startedAt: all.find((e) => e.type === "RunStarted")?.occurredAt ?? null,
              finishedAt: finished.occurredAt,
              durationMs: Number(finished.data.duration_ms ?? 0),
              outcome: typeof finished.data.outcome === "string" ? finished.data.outcome : "unknown",
              repairs: all.filter((e) => isRepair(e.stream)).length
            })
          }
          return points.slice(-HISTORY_MAX_RUNS)
        })
    })
  })
)
