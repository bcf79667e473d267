/**
 * ExportJobs in memory, for program specs. State is exposed (`MemoryExportJobs`) so a spec can seed
 * rows and stage the races the program must survive: `afterListEnqueued` hooks run (once each)
 * right after the next step-1 read, e.g. a job re-enqueued with a new jid or finishing; a
 * `beforeFail` hook runs right before the guarded UPDATE of the slice holding that job, as a concurrent writer that
 * wins the race would. `locked.add(id)` holds a row as another open transaction would: the write
 * skips it (ExportJobsSql's SKIP LOCKED) until `locked.delete(id)`.
 */
import * as Context from "effect/Context"
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { checkFence } from "../../domain/Batch.ts"
import { ExportJobFailed } from "../../domain/Events.ts"
import { type EnqueuedExportJob, ExportJobStatus, isEnqueued } from "../../domain/ExportJob.ts"
import { EventLog } from "../../services/EventLog.ts"
import { ExportJobs } from "../../services/ExportJobs.ts"

export interface ExportJobRecord {
  id: number
  projectId: number
  jid: string
  status: number
  createdAt: DateTime.Utc
  updatedAt: DateTime.Utc
}

export interface RelationExportRecord {
  readonly id: number
  readonly projectExportJobId: number
  readonly relation: string
}

export class MemoryExportJobs extends Context.Service<MemoryExportJobs, {
  readonly jobs: Map<number, ExportJobRecord>
  readonly relationExports: Array<RelationExportRecord>
  readonly afterListEnqueued: Array<() => void>
  readonly beforeFail: Map<number, () => void>
  /** Rows held by another open transaction: failMany skips them. */
  readonly locked: Set<number>
  /** The ids each findEnqueued call asked for, in order. */
  readonly reReads: Array<ReadonlyArray<number>>
  /** The size of each failMany slice (one transaction each), in order. */
  readonly failSlices: Array<number>
}>()("sweeper/layers/memory/MemoryExportJobs") {
  static readonly layer = Layer.sync(MemoryExportJobs, () => ({
    jobs: new Map(),
    relationExports: [],
    afterListEnqueued: [],
    beforeFail: new Map(),
    locked: new Set<number>(),
    reReads: [],
    failSlices: []
  }))
}

export const ExportJobsMemory = Layer.effect(
  ExportJobs,
  Effect.gen(function*() {
    const state = yield* MemoryExportJobs
    const events = yield* EventLog
    const byId = (a: { readonly id: number }, b: { readonly id: number }) => a.id - b.id

    const toJob = (row: ExportJobRecord): EnqueuedExportJob => ({
      id: row.id,
      projectId: row.projectId,
      jid: row.jid,
      status: row.status,
      createdAt: row.createdAt,
      updatedAt: row.updatedAt,
      relationExports: state.relationExports.filter((r) => r.projectExportJobId === row.id).length
    })

    return ExportJobs.of({
      listEnqueued: Effect.sync(() => {
        const found = [...state.jobs.values()].filter((row) => isEnqueued(row.status)).sort(byId)
          .map((row) => ({ id: row.id, jid: row.jid }))
        state.afterListEnqueued.splice(0).forEach((hook) => hook())
        return found
      }),
      // The backlog's read: no race hooks, it is not the run's step 1.
      firstEnqueued: (limit) =>
        Effect.sync(() =>
          [...state.jobs.values()].filter((row) => isEnqueued(row.status)).sort(byId).slice(0, limit)
            .map((row) => ({ id: row.id, jid: row.jid }))
        ),
      findEnqueued: (ids) =>
        Effect.sync(() => {
          state.reReads.push([...ids])
          return ids.flatMap((id) => {
            const row = state.jobs.get(id)
            return row !== undefined && isEnqueued(row.status) ? [toJob(row)] : []
          }).sort(byId)
        }),
      failMany: (jobs, now) =>
        events.transaction(Effect.gen(function*() {
          if (jobs.length === 0) return { failed: [], locked: [] }
          state.failSlices.push(jobs.length)
          yield* checkFence
          // As a concurrent writer would, before the slice's UPDATE takes its row locks.
          for (const job of jobs) state.beforeFail.get(job.id)?.()
          const locked: Array<number> = []
          const failed = [...jobs].sort(byId).flatMap((job) => {
            const row = state.jobs.get(job.id)
            if (row === undefined || row.jid !== job.jid || !isEnqueued(row.status)) return []
            if (state.locked.has(job.id)) {
              locked.push(job.id)
              return []
            }
            row.status = ExportJobStatus.failed
            row.updatedAt = now
            return [row]
          })
          yield* events.appendAll(
            failed.map((row) => new ExportJobFailed({ id: row.id, jid: row.jid, project_id: row.projectId }))
          )
          return { failed: failed.map((row) => row.jid), locked }
        }))
    })
  })
).pipe(Layer.provideMerge(MemoryExportJobs.layer))
