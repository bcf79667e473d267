/**
 * ObjectStorage in memory, for program specs. State is exposed (`MemoryObjectStorage`) so a spec can
 * seed objects (`stores`: a location present there is configured), inject failures per object
 * (`failures`), observe the deletes in order (`deletes`, `onDelete`) and make each delete take time
 * (`latency`, slept on the effect Clock so TestClock drives it).
 */
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { fieldOf, type Location } from "../../domain/DirectUpload.ts"
import { ObjectStorageError } from "../../domain/Errors.ts"
import { type DeleteOutcome, ObjectStorage } from "../../services/ObjectStorage.ts"

export interface MemoryObjectStorageState {
  /** location → the paths stored there. A location without an entry has no store configured. */
  readonly stores: Map<string, Set<string>>
  /** `<location>:<path>` → message: deleting that object fails with ObjectStorageError. */
  readonly failures: Map<string, string>
  /** Every delete, in call order, with what it did. */
  readonly deletes: Array<
    { readonly location: string; readonly path: string; readonly outcome: DeleteOutcome | "failed" }
  >
  /** Called at the start of each delete (e.g. to look at Redis at that moment). */
  onDelete: ((location: string, path: string) => void) | undefined
  /** How long each delete of a configured location takes. */
  latency: Duration.Duration
}

export interface MemoryObjectStorageOptions {
  /** Locations with a (so far empty) store. */
  readonly configured?: ReadonlyArray<Location>
  readonly latency?: Duration.Input
}

export class MemoryObjectStorage extends Context.Service<MemoryObjectStorage, MemoryObjectStorageState>()(
  "sweeper/layers/memory/MemoryObjectStorage"
) {
  static readonly layer = (options: MemoryObjectStorageOptions = {}) =>
    Layer.sync(MemoryObjectStorage, () => ({
      stores: new Map((options.configured ?? []).map((location) => [location, new Set<string>()])),
      failures: new Map(),
      deletes: [],
      onDelete: undefined,
      latency: Duration.fromInputUnsafe(options.latency ?? Duration.zero)
    }))
}

/** Puts objects into a location's store, configuring it if needed. */
export const putObjects = (state: MemoryObjectStorageState, location: Location, ...paths: ReadonlyArray<string>) => {
  const store = state.stores.get(location) ?? new Set<string>()
  for (const path of paths) store.add(path)
  state.stores.set(location, store)
}

export const ObjectStorageMemory = (options: MemoryObjectStorageOptions = {}) =>
  Layer.effect(
    ObjectStorage,
    Effect.gen(function*() {
      const state = yield* MemoryObjectStorage
      const remove = Effect.fnUntraced(
        function*(location: Location, path: string): Effect.fn.Return<DeleteOutcome, ObjectStorageError> {
          state.onDelete?.(location, path)
          const store = state.stores.get(location)
          if (store === undefined) {
            state.deletes.push({ location, path, outcome: "unconfigured" })
            return "unconfigured"
          }
          if (Duration.isGreaterThan(state.latency, Duration.zero)) yield* Effect.sleep(state.latency)
          const failure = state.failures.get(fieldOf(location, path))
          if (failure !== undefined) {
            state.deletes.push({ location, path, outcome: "failed" })
            return yield* new ObjectStorageError({ location, path, message: failure })
          }
          const outcome: DeleteOutcome = store.delete(path) ? "deleted" : "missing"
          state.deletes.push({ location, path, outcome })
          return outcome
        }
      )
      return ObjectStorage.of({
        hasStore: (location) => state.stores.has(location),
        delete: remove,
        deleteMany: (location, paths) => Effect.forEach(paths, (path) => Effect.result(remove(location, path)))
      })
    })
  ).pipe(Layer.provideMerge(MemoryObjectStorage.layer(options)))
