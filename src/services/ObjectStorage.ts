/**
 * Object storage as delete-stale-direct-uploads needs it: remove the object a pending direct upload
 * was writing to. "Already gone" is success (`missing`; S3 cannot tell it from `deleted`); a known
 * location with no store configured is `unconfigured` (there is nothing to delete, only the Redis
 * entry to drop). Anything else — auth, network, a missing bucket, a 5xx — is an ObjectStorageError,
 * and the caller keeps the entry for a later run.
 *
 * Backends are layers (local directories, S3-compatible, Azure Blob) picked by the composition root
 * from `SWEEPER_OBJECT_STORAGE`.
 */
import * as Context from "effect/Context"
import type * as Effect from "effect/Effect"
import type * as Result from "effect/Result"
import type { Location } from "../domain/DirectUpload.ts"
import type { ObjectStorageError } from "../domain/Errors.ts"

export type DeleteOutcome = "deleted" | "missing" | "unconfigured"

/** One path's outcome in a bulk delete. */
export type BulkDeleteOutcome = Result.Result<DeleteOutcome, ObjectStorageError>

export class ObjectStorage extends Context.Service<ObjectStorage, {
  /** Whether `location` has a store (false ⇒ every delete there is `unconfigured`). */
  hasStore(location: Location): boolean
  /**
   * Deletes `<path>` in the location's store (after its prefix); any failure other than "not there" is an
   * ObjectStorageError.
   */
  delete(location: Location, path: string): Effect.Effect<DeleteOutcome, ObjectStorageError>
  /**
   * Deletes many objects of one location in as few round trips as the backend allows (S3
   * DeleteObjects: 1,000 keys a request). Never fails as a whole: one outcome per path, in the
   * order given, so one bad object cannot hide the others' results.
   */
  deleteMany(location: Location, paths: ReadonlyArray<string>): Effect.Effect<ReadonlyArray<BulkDeleteOutcome>>
}>()("sweeper/services/ObjectStorage") {}
