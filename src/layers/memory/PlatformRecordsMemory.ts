/**
 * PlatformRecords in memory, for program specs: the ids of the rows that exist, seedable
 * (`MemoryPlatformRecords`), and the id lists each look-up was asked about, for inspection.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { PlatformRecords } from "../../services/PlatformRecords.ts"

export class MemoryPlatformRecords extends Context.Service<MemoryPlatformRecords, {
  readonly namespaces: Set<number>
  readonly projects: Set<number>
  /** Every non-empty look-up, in order. */
  readonly lookups: Array<{ readonly table: "namespaces" | "projects"; readonly ids: ReadonlyArray<number> }>
}>()("sweeper/layers/memory/MemoryPlatformRecords") {
  static readonly layer = Layer.sync(
    MemoryPlatformRecords,
    () => ({ namespaces: new Set<number>(), projects: new Set<number>(), lookups: [] })
  )
}

export const PlatformRecordsMemory = Layer.effect(
  PlatformRecords,
  Effect.gen(function*() {
    const state = yield* MemoryPlatformRecords
    const existing = (table: "namespaces" | "projects") => (ids: ReadonlyArray<number>) =>
      Effect.sync(() => {
        if (ids.length === 0) return []
        state.lookups.push({ table, ids: [...ids] })
        return [...new Set(ids)].filter((id) => state[table].has(id)).sort((a, b) => a - b)
      })
    return PlatformRecords.of({
      existingNamespaceIds: existing("namespaces"),
      existingProjectIds: existing("projects")
    })
  })
).pipe(Layer.provideMerge(MemoryPlatformRecords.layer))
