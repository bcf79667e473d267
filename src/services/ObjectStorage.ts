/**
 * Object storage as delete-stale-direct-uploads needs it: remove the object a pending direct upload
 * was writing to. "Already gone" is success (`missing`); a known location with no store configured
 * is `unconfigured` (there is nothing to delete, only the Redis entry to drop).
 */
import { Context, type Effect } from "effect"
import type { Location } from "../domain/DirectUpload.ts"
import type { ObjectStorageError } from "../domain/Errors.ts"

export type DeleteOutcome = "deleted" | "missing" | "unconfigured"

export class ObjectStorage extends Context.Service<ObjectStorage, {
  /** Deletes `<root of location>/<path>`; any failure other than "not there" is an ObjectStorageError. */
  delete(location: Location, path: string): Effect.Effect<DeleteOutcome, ObjectStorageError>
}>()("sweeper/services/ObjectStorage") {}
