/**
 * Builds in memory, for program specs. State is exposed (`MemoryBuilds`) so a spec can seed rows and
 * stage lock conflicts: `conflicts.set(id, n)` makes the next n guarded updates of that build find
 * its lock_version bumped by a concurrent writer, as a real race would; `locked.add(id)` holds the
 * row as another open transaction would (`FOR UPDATE`) until `locked.delete(id)`: writes skip it.
 */
import * as Context from "effect/Context"
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Order from "effect/Order"
import { checkFence } from "../../domain/Batch.ts"
import { type BuildCursor, type CancelingBuild, FailureReason } from "../../domain/Build.ts"
import { RowLocked } from "../../domain/Errors.ts"
import { BuildDoomed, BuildDropped } from "../../domain/Events.ts"
import { cancelingEnd, CurrentFailureReasonSet, type FailureReasonSet } from "../../domain/StuckBuilds.ts"
import { retryOrDoom } from "../../repair/DropRetry.ts"
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
  /** Rows held by another open transaction: writes skip them (BuildsSql's SKIP LOCKED). */
  readonly locked: Set<number>
  /** Which builds each findStuckCanceling call returned, in order. */
  readonly pages: Array<ReadonlyArray<number>>
  /** Write transactions begun (drop, dropMany, doom), committed or not. */
  transactions: number
}>()("sweeper/layers/memory/MemoryBuilds") {
  static readonly layer = Layer.sync(
    MemoryBuilds,
    () => ({ rows: new Map(), conflicts: new Map(), locked: new Set<number>(), pages: [], transactions: 0 })
  )
}

/** A stored build as the page reads return it (BuildsMemory and StuckBuildsMemory alike). */
export const toBuild = (
  row: Pick<BuildRecord, "id" | "projectId" | "runnerId" | "status" | "lockVersion" | "createdAt" | "updatedAt">
): CancelingBuild => ({
  id: row.id,
  projectId: row.projectId,
  runnerId: row.runnerId,
  status: row.status,
  lockVersion: row.lockVersion,
  createdAt: row.createdAt,
  updatedAt: row.updatedAt
})

/** The keyset order of the build walks: (created_at, project_id, id). */
export const keysetOrder = Order.combineAll<BuildCursor>([
  Order.mapInput(DateTime.Order, (c: BuildCursor) => c.createdAt),
  Order.mapInput(Order.Number, (c: BuildCursor) => c.projectId),
  Order.mapInput(Order.Number, (c: BuildCursor) => c.id)
])

export const BuildsMemory = Layer.effect(
  Builds,
  Effect.gen(function*() {
    const state = yield* MemoryBuilds
    const events = yield* EventLog

    /**
     * The guarded update of one row (status canceling, and for a drop the lock_version read), as
     * BuildsSql's; its event when it applied. A staged conflict bumps lock_version first, as a
     * concurrent writer would. A locked row that still matches the guard is "locked", untouched.
     */
    const applyGuarded = (
      build: CancelingBuild,
      now: DateTime.Utc,
      outcome: "dropped" | "doomed",
      set: FailureReasonSet
    ) => {
      const row = state.rows.get(build.id)
      if (row === undefined) return undefined
      const pending = state.conflicts.get(build.id) ?? 0
      if (pending > 0) {
        state.conflicts.set(build.id, pending - 1)
        row.lockVersion++
      }
      if (row.status !== "canceling" || (outcome === "dropped" && row.lockVersion !== build.lockVersion)) {
        return undefined
      }
      if (state.locked.has(build.id)) return "locked" as const
      // A drop ends as the reason set says (canceled under gitlab-19, as GitLab's drop!); a doom as doom!.
      const end = outcome === "dropped" ? cancelingEnd(set) : {
        status: "failed" as const,
        written: FailureReason.data_integrity_failure,
        reason: FailureReason.data_integrity_failure
      }
      row.status = end.status
      if (end.written !== null) row.failureReason = end.written
      row.finishedAt = outcome === "doomed" && row.finishedAt !== null ? row.finishedAt : now
      row.updatedAt = now
      row.lockVersion++
      const fields = {
        id: build.id,
        project_id: build.projectId,
        runner_id: build.runnerId,
        failure_reason: end.reason
      }
      return outcome === "dropped"
        ? new BuildDropped(end.status === "canceled" ? { ...fields, status: end.status } : fields)
        : new BuildDoomed(fields)
    }

    const failBuild = (build: CancelingBuild, now: DateTime.Utc, outcome: "dropped" | "doomed") =>
      events.transaction(Effect.gen(function*() {
        state.transactions++
        yield* checkFence
        const event = applyGuarded(build, now, outcome, yield* CurrentFailureReasonSet)
        if (event === undefined) return false
        if (event === "locked") return yield* new RowLocked({ key: `build:${build.id}` })
        yield* events.append(event)
        return true
      }))

    /** A page in one transaction, the fence checked once, as BuildsSql's. */
    const dropMany = (builds: ReadonlyArray<CancelingBuild>, now: DateTime.Utc) =>
      builds.length === 0 ? Effect.succeed({ dropped: [], locked: [] }) : events.transaction(Effect.gen(function*() {
        state.transactions++
        yield* checkFence
        const set = yield* CurrentFailureReasonSet
        const dropped: Array<CancelingBuild> = []
        const locked: Array<CancelingBuild> = []
        const appended: Array<BuildDropped | BuildDoomed> = []
        for (const build of builds) {
          const event = applyGuarded(build, now, "dropped", set)
          if (event === undefined) continue
          if (event === "locked") {
            locked.push(build)
            continue
          }
          dropped.push(build)
          appended.push(event)
        }
        yield* events.appendAll(appended)
        return { dropped, locked }
      }))

    const find = ({ id }: { readonly id: number }) =>
      Effect.sync(() => Option.map(Option.fromNullishOr(state.rows.get(id)), toBuild))
    const drop = (build: CancelingBuild, now: DateTime.Utc) => failBuild(build, now, "dropped")
    const doom = (build: CancelingBuild, now: DateTime.Utc) => failBuild(build, now, "doomed")
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
      find,
      drop,
      dropMany,
      // No index, no dead entries.
      revisitWritten: () => Effect.void,
      doom,
      retryOrDoom: retryOrDoom({ find, drop, doom })
    })
  })
).pipe(Layer.provideMerge(MemoryBuilds.layer))
