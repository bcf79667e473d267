/**
 * The write step of delete-stale-direct-uploads as one operation, so the program is the
 * seed's flowchart and the order that loses nothing lives with the backends it spans (object
 * storage, the pending hash, the event log): objects, then events, then entries. The entry is the
 * record that the repair is not finished, so it goes last (docs/operations.md, Failure handling).
 */
import * as Context from "effect/Context"
import type * as Effect from "effect/Effect"
import type { SqlError } from "effect/sql/SqlError"
import type { StaleUpload, StaleUploadOutcome } from "../domain/DirectUpload.ts"
import type { ObjectStorageError, RedisError } from "../domain/Errors.ts"

export class StaleUploadRepair extends Context.Service<StaleUploadRepair, {
  /**
   * Repairs a step of stale uploads, each outcome at its upload's index: first every field is
   * compared with the bytes read (the read may be from before a gate hold), and one gone or
   * re-registered since is "vanished": its object is left alone, nothing recorded or removed; the
   * others' objects deleted per location in bulk (one that cannot be deleted keeps its entry, gets
   * no event, and the rest go on); an event for every object deleted, in one INSERT; then their
   * fields removed only while still holding the bytes read. The caller checks the fence before (the
   * repair loop does). `readsDone` runs once the fields are re-read, before the first write (the
   * repair loop then reads its next page beside the writes).
   */
  repair(
    uploads: ReadonlyArray<StaleUpload>,
    readsDone?: Effect.Effect<void>
  ): Effect.Effect<ReadonlyArray<StaleUploadOutcome<ObjectStorageError>>, RedisError | SqlError>
  /**
   * What `repair` would do, writing nothing (a dry run): "deleted", or "unconfigured" for a
   * location without a store.
   */
  wouldRepair(uploads: ReadonlyArray<StaleUpload>): ReadonlyArray<StaleUploadOutcome<ObjectStorageError>>
}>()("sweeper/services/StaleUploadRepair") {}
