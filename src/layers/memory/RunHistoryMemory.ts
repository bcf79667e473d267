/** RunHistory over the in-memory event log (MemoryEvents), for specs: the same answers, no indexes. */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import {
  HISTORY_MAX_RUNS,
  type HistoryBucket,
  RUN_PIPELINES_MAX,
  RunHistory,
  type RunPoint
} from "../../services/RunHistory.ts"
import { runDetailOf } from "../postgres/RunHistorySql.ts"
import { MemoryEvents } from "./EventLogMemory.ts"

const isRepair = (stream: string) => !stream.startsWith("batch:")

export const RunHistoryMemory = Layer.effect(
  RunHistory,
  Effect.gen(function*() {
    const events = yield* MemoryEvents
    const ofRun = (runId: string) => events.filter((e) => e.runId === runId)
    const pointsOf = (batch: string, since: Date) => {
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
          repairs: typeof finished.data.repaired === "number" ? finished.data.repaired : 0,
          dryRun: finished.data.dryRun === true || all.some((e) => e.type === "RunStarted" && e.data.dryRun === true)
        })
      }
      return points
    }
    return RunHistory.of({
      run: (runId) =>
        Effect.sync(() => {
          const all = ofRun(runId)
          return runDetailOf(
            runId,
            all.find((e) => e.type === "RunStarted"),
            all.findLast((e) => e.type === "RunFinished"),
            all.filter((e) => e.type === "RepairHeld" || e.type === "RepairReleased"),
            [
              ...new Set(
                all.flatMap((e) =>
                  e.type === "BuildDropped" && typeof e.data.pipeline_id === "number" ? [e.data.pipeline_id] : []
                )
              )
            ].toSorted((a, b) => a - b).slice(0, RUN_PIPELINES_MAX + 1)
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
      history: (batch, since) => Effect.sync(() => pointsOf(batch, since).slice(-HISTORY_MAX_RUNS)),
      buckets: (batch, since, bucketMs) =>
        Effect.sync(() => {
          const folded = new Map<number, HistoryBucket>()
          for (const point of pointsOf(batch, since)) {
            const start = Math.floor(point.finishedAt.getTime() / bucketMs) * bucketMs
            const b = folded.get(start) ?? {
              start: new Date(start),
              runs: 0,
              dryRuns: 0,
              succeeded: 0,
              failed: 0,
              repairs: 0,
              durationMsMax: 0,
              durationMsTotal: 0
            }
            const real = !point.dryRun
            folded.set(start, {
              ...b,
              runs: b.runs + 1,
              dryRuns: b.dryRuns + (real ? 0 : 1),
              succeeded: b.succeeded + (real && point.outcome === "succeeded" ? 1 : 0),
              failed: b.failed + (real && ["failed", "timed_out", "abandoned"].includes(point.outcome) ? 1 : 0),
              repairs: b.repairs + (real ? point.repairs : 0),
              durationMsMax: Math.max(b.durationMsMax, point.durationMs),
              durationMsTotal: b.durationMsTotal + point.durationMs
            })
          }
          return [...folded.values()].sort((a, b) => a.start.getTime() - b.start.getTime())
        })
    })
  })
)
