/**
 * Builds in memory, for program specs. State is exposed (`MemoryBuilds`) so a spec can seed rows and
 * stage lock conflicts: `conflicts.set(id, n)` makes the next n guarded updates of that build find
 * its lock_version bumped by a concurrent writer, as a real race would.
 */
import { Context, DateTime, Effect, Layer, Option, Order } from "effect"
import { type BuildCursor, type CancelingBuild, FailureReason } from "../../domain/Build.ts"
import { checkFence } from "../../domain/Batch.ts"
import { BuildDoomed, BuildDropped } from "../../domain/Events.ts"
import { Builds } from "../../services/Builds.ts"
import { EventLog } from "../../services/EventLog.ts"

export interface BuildRecord {
  id: number
  projectId: number
  runnerId: number | null
  type: string
  status: string
  failureReason: number | null
  lockVersion: number
  createdAt: DateTime.Utc
  updatedAt: DateTime.Utc
  finishedAt: DateTime.Utc | null
}

export class MemoryBuilds extends Context.Service<MemoryBuilds, {
  readonly rows: Map<number, BuildRecord>
  readonly conflicts: Map<number, number>
  /** Which builds each findStuckCanceling call returned, in order. */
  readonly pages: Array<ReadonlyArray<number>>
}>()("sweeper/layers/memory/MemoryBuilds") {
  static readonly layer = Layer.sync(MemoryBuilds, () => ({ rows: new Map(), conflicts: new Map(), pages: [] }))
}

const toBuild = (row: BuildRecord): CancelingBuild => ({
  id: row.id,
  projectId: row.projectId,
  runnerId: row.runnerId,
  status: row.status,
  lockVersion: row.lockVersion,
  createdAt: row.createdAt,
  updatedAt: row.updatedAt
})

const keysetOrder = Order.combineAll<BuildCursor>([
  Order.mapInput(DateTime.Order, (c: BuildCursor) => c.createdAt),
  Order.mapInput(Order.Number, (c: BuildCursor) => c.projectId),
  Order.mapInput(Order.Number, (c: BuildCursor) => c.id)
])

export const BuildsMemory = Layer.effect(
  Builds,
  Effect.gen(function*() {
    const state = yield* MemoryBuilds
    const events = yield* EventLog

    /** The guarded update; a staged conflict bumps lock_version first, as a concurrent writer would. */
    const update = (id: number, guard: (row: BuildRecord) => boolean, change: (row: BuildRecord) => void) => {
      const row = state.rows.get(id)
      if (row === undefined) return false
      const pending = state.conflicts.get(id) ?? 0
      if (pending > 0) {
        state.conflicts.set(id, pending - 1)
        row.lockVersion++
      }
      if (!guard(row)) return false
      change(row)
      row.lockVersion++
      return true
    }

    const fail = (reason: number, now: DateTime.Utc) => (row: BuildRecord) => {
      row.status = "failed"
      row.failureReason = reason
      row.finishedAt = now
      row.updatedAt = now
    }

    return Builds.of({
      findStuckCanceling: ({ cutoff, after, limit }) =>
        Effect.sync(() => {
          const found = [...state.rows.values()]
            .filter((row) =>
              row.status === "canceling" && row.type === "Ci::Build" &&
              DateTime.isLessThan(row.createdAt, cutoff) && DateTime.isLessThan(row.updatedAt, cutoff) &&
              Option.match(after, { onNone: () => true, onSome: (c) => keysetOrder(row, c) > 0 })
            )
            .sort(keysetOrder)
            .slice(0, limit)
          state.pages.push(found.map((row) => row.id))
          return found.map(toBuild)
        }),
      find: (id) => Effect.sync(() => Option.map(Option.fromNullishOr(state.rows.get(id)), toBuild)),
      drop: (build, now) =>
        events.transaction(Effect.gen(function*() {
          yield* checkFence
          const dropped = update(
            build.id,
            (row) => row.status === "canceling" && row.lockVersion === build.lockVersion,
            fail(FailureReason.stuck_or_timeout_failure, now)
          )
          if (dropped) {
            yield* events.append(new BuildDropped({
              id: build.id,
              project_id: build.projectId,
              runner_id: build.runnerId,
              failure_reason: FailureReason.stuck_or_timeout_failure
            }))
          }
          return dropped
        })),
      doom: (build, now) =>
        events.transaction(Effect.gen(function*() {
          yield* checkFence
          const doomed = update(build.id, (row) => row.status === "canceling", fail(FailureReason.data_integrity_failure, now))
          if (doomed) {
            yield* events.append(new BuildDoomed({
              id: build.id,
              project_id: build.projectId,
              runner_id: build.runnerId,
              failure_reason: FailureReason.data_integrity_failure
            }))
          }
          return doomed
        }))
    })
  })
).pipe(Layer.provideMerge(MemoryBuilds.layer))
