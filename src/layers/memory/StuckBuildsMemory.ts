/**
 * The stuck-builds family in memory, for program specs. State is exposed (`MemoryStuckBuilds`) so a
 * spec can seed rows and stage what real tables do: `conflicts.set(id, n)` bumps lock_version before
 * the next n guarded writes (a concurrent writer), `locked` holds rows as another open transaction
 * would, `refused` makes writes of a row fail as a trigger raising would, `zombies` rows whose
 * writes silently change nothing. `onlineRunner` lists builds some online runner could pick.
 */
import * as Context from "effect/Context"
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import { checkFence } from "../../domain/Batch.ts"
import { RowLocked } from "../../domain/Errors.ts"
import { BuildDoomed, BuildDropped } from "../../domain/Events.ts"
import {
  FailureReasons,
  type FailureReasonSet,
  matchesRule,
  reasonCodeOf,
  type StuckRule
} from "../../domain/StuckBuilds.ts"
import { retryOrDoomFamily } from "../../repair/StuckDropRetry.ts"
import { EventLog } from "../../services/EventLog.ts"
import { type FamilyBuild, StuckBuilds } from "../../services/StuckBuilds.ts"
import { keysetOrder, toBuild } from "./BuildsMemory.ts"

export interface FamilyBuildRecord {
  id: number
  projectId: number
  runnerId: number | null
  status: string
  failureReason: number | null
  lockVersion: number
  createdAt: DateTime.Utc
  updatedAt: DateTime.Utc
  scheduledAt: DateTime.Utc | null
  finishedAt: DateTime.Utc | null
}

export class MemoryStuckBuilds extends Context.Service<MemoryStuckBuilds, {
  readonly rows: Map<number, FamilyBuildRecord>
  readonly conflicts: Map<number, number>
  readonly locked: Set<number>
  readonly refused: Set<number>
  readonly zombies: Set<number>
  readonly onlineRunner: Set<number>
  /** Which builds each findStuck call returned, in order. */
  readonly pages: Array<ReadonlyArray<number>>
}>()("sweeper/layers/memory/MemoryStuckBuilds") {
  static readonly layer = Layer.sync(MemoryStuckBuilds, () => ({
    rows: new Map(),
    conflicts: new Map(),
    locked: new Set<number>(),
    refused: new Set<number>(),
    zombies: new Set<number>(),
    onlineRunner: new Set<number>(),
    pages: []
  }))
}

export const StuckBuildsMemory = Layer.effect(
  StuckBuilds,
  Effect.gen(function*() {
    const state = yield* MemoryStuckBuilds
    const events = yield* EventLog
    const matches = (rule: StuckRule, row: FamilyBuildRecord, now: DateTime.Utc) =>
      matchesRule(rule, { ...row, onlineRunner: state.onlineRunner.has(row.id) }, now)

    /** One guarded write, as StuckBuildsSql's: the event when it applied, else why not. */
    const apply = (
      rule: StuckRule,
      build: FamilyBuild,
      now: DateTime.Utc,
      reason: number,
      lockGuard: boolean
    ): BuildDropped | BuildDoomed | "lost" | "locked" | "refused" => {
      const row = state.rows.get(build.id)
      if (row === undefined) return "lost"
      const pending = state.conflicts.get(build.id) ?? 0
      if (pending > 0) {
        state.conflicts.set(build.id, pending - 1)
        row.lockVersion++
      }
      if (!matches(rule, row, now) || (lockGuard && row.lockVersion !== build.lockVersion)) return "lost"
      if (state.locked.has(build.id)) return "locked"
      if (state.refused.has(build.id) || state.zombies.has(build.id)) return "refused"
      row.status = "failed"
      row.failureReason = reason
      row.finishedAt = now
      row.updatedAt = now
      row.lockVersion++
      const fields = { id: build.id, project_id: build.projectId, runner_id: build.runnerId, failure_reason: reason }
      return lockGuard
        ? new BuildDropped({ ...fields, stuck_type: rule.stuckType, rule: rule.name })
        : new BuildDoomed(fields)
    }

    const dropMany = (
      rule: StuckRule,
      reasons: FailureReasonSet,
      builds: ReadonlyArray<FamilyBuild>,
      now: DateTime.Utc
    ) =>
      builds.length === 0 ? Effect.succeed({ dropped: [], locked: [] }) : events.transaction(Effect.gen(function*() {
        yield* checkFence
        const reason = yield* reasonCodeOf(rule, reasons)
        // As on PostgreSQL, a row whose write raises aborts the whole page statement: nothing written.
        if (builds.some((build) => state.refused.has(build.id))) return { dropped: [], locked: [] }
        const dropped: Array<FamilyBuild> = []
        const locked: Array<FamilyBuild> = []
        const appended: Array<BuildDropped | BuildDoomed> = []
        for (const build of builds) {
          const result = apply(rule, build, now, reason, true)
          if (result === "locked") locked.push(build)
          else if (typeof result !== "string") {
            dropped.push(build)
            appended.push(result)
          }
        }
        yield* events.appendAll(appended)
        return { dropped, locked }
      }))

    const write =
      (rule: StuckRule, now: DateTime.Utc, reasonCode: Effect.Effect<number>, lockGuard: boolean) =>
      (build: FamilyBuild) =>
        events.transaction(Effect.gen(function*() {
          yield* checkFence
          const result = apply(rule, build, now, yield* reasonCode, lockGuard)
          if (result === "lost") return false
          if (result === "refused") return "refused" as const
          if (result === "locked") return yield* new RowLocked({ key: `build:${build.id}` })
          yield* events.append(result)
          return true
        }))

    return StuckBuilds.of({
      findStuck: ({ rule, now, after, limit }) =>
        Effect.sync(() => {
          const found = [...state.rows.values()]
            .filter((row) =>
              matches(rule, row, now) &&
              Option.match(after, { onNone: () => true, onSome: (c) => keysetOrder(row, c) > 0 })
            )
            .sort(keysetOrder)
            .slice(0, limit)
          state.pages.push(found.map((row) => row.id))
          return found.map(toBuild)
        }),
      dropMany,
      retryOrDoom: (rule, reasons, lost, now) =>
        retryOrDoomFamily(rule, {
          find: (build) =>
            Effect.sync(() =>
              Option.map(
                Option.filter(Option.fromNullishOr(state.rows.get(build.id)), (row) => matches(rule, row, now)),
                toBuild
              )
            ),
          drop: write(rule, now, reasonCodeOf(rule, reasons), true),
          doom: write(rule, now, Effect.succeed(FailureReasons.data_integrity_failure), false)
        })(lost)
    })
  })
).pipe(Layer.provideMerge(MemoryStuckBuilds.layer))
