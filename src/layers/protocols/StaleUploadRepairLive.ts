/**
 * StaleUploadRepair over the configured object storage, the pending hash and the event log: one
 * implementation for every backend, since the order of the three writes is the rule.
 */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Result from "effect/Result"
import type { Location, StaleUpload, StaleUploadOutcome } from "../../domain/DirectUpload.ts"
import type { ObjectStorageError } from "../../domain/Errors.ts"
import { StaleDirectUploadDeleted, StaleDirectUploadEntryRemoved } from "../../domain/Events.ts"
import { EventLog } from "../../services/EventLog.ts"
import { ObjectStorage } from "../../services/ObjectStorage.ts"
import { PendingDirectUploads } from "../../services/PendingDirectUploads.ts"
import { StaleUploadRepair } from "../../services/StaleUploadRepair.ts"

/** What became of one stale upload in a step's repair. */
type Repaired = StaleUploadOutcome<ObjectStorageError>

/**
 * Repairs a slice of stale uploads in page-sized steps, in the order that loses nothing:
 * objects, then events, then entries. The entry is the record that the repair is not finished, so
 * it goes last. A crash (kill -9) after the objects are deleted leaves the entries; the next run
 * finds those objects "missing", which counts as deleted, writes the events and removes the
 * entries. A crash after the INSERT and before the compare-and-delete does the same and writes those
 * events a second time. So each deletion has at least one StaleDirectUploadDeleted, never none.
 *
 * 1. the fence, once (checked by the repair loop before the write): a runner whose exclusive lease
 *    was taken from it deletes nothing more;
 * 2. HMGET of the fields: the step's entries were read by HSCAN maybe long ago (a gate hold comes
 *    between the read and the step), so one gone (the upload completed) or changed (re-registered)
 *    since is not ours — "vanished": its object, by now a finished file, is left alone;
 * 3. the objects still ours, per location in bulk (`deleteMany`: S3 DeleteObjects, 1,000 keys a
 *    request); an object that cannot be deleted keeps its entry and gets no event, the rest go on;
 * 4. the events, one multi-row INSERT, for every object deleted — also one whose entry changed in
 *    the moment between 2 and 3: the object is gone either way, and its event says so;
 * 5. the fields, one compare-and-delete script call: removed only while still holding the bytes read
 *    (an entry re-registered in that moment stays, for its new upload).
 */
const repairWith = (
  storage: ObjectStorage["Service"],
  pending: PendingDirectUploads["Service"],
  events: EventLog["Service"]
) =>
  Effect.fnUntraced(function*(uploads: ReadonlyArray<StaleUpload>, readsDone: Effect.Effect<void> = Effect.void) {
    const results: Array<Repaired> = new Array(uploads.length)
    if (uploads.length === 0) return results
    const current = yield* pending.values(uploads.map((upload) => upload.field))
    yield* readsDone
    const byLocation = new Map<Location, Array<number>>()
    uploads.forEach((upload, i) => {
      const value = current[i]
      if (value === null || value === undefined || !Buffer.from(value).equals(upload.value)) {
        results[i] = "vanished"
        return
      }
      const indexes = byLocation.get(upload.location) ?? []
      indexes.push(i)
      byLocation.set(upload.location, indexes)
    })
    for (const [location, indexes] of byLocation) {
      const outcomes = yield* storage.deleteMany(location, indexes.map((i) => uploads[i]!.path))
      indexes.forEach((i, n) => {
        const outcome = outcomes[n]!
        results[i] = Result.isSuccess(outcome) ? outcome.success : { failed: outcome.failure }
      })
    }
    // Deleted, already missing, or a location without a store: each recorded, its entry removed.
    // Without a store no object was touched: that event says the entry alone went.
    const ours = uploads.flatMap((_, i) => typeof results[i] === "string" && results[i] !== "vanished" ? [i] : [])
    yield* events.appendAll(ours.map((i) => {
      const { location, path, preparedAt } = uploads[i]!
      return results[i] === "unconfigured"
        ? new StaleDirectUploadEntryRemoved({ location, path, preparedAt, reason: "no object store" })
        : new StaleDirectUploadDeleted({ location, path, preparedAt })
    }))
    yield* pending.removeUnchanged(ours.map((i) => ({ field: uploads[i]!.field, value: uploads[i]!.value })))
    return results
  })

export const StaleUploadRepairLive = Layer.effect(
  StaleUploadRepair,
  Effect.gen(function*() {
    const storage = yield* ObjectStorage
    const repair = repairWith(storage, yield* PendingDirectUploads, yield* EventLog)
    return StaleUploadRepair.of({
      repair,
      // The entry's field goes in either case, so a dry run reports it as a change.
      wouldRepair: (uploads) =>
        uploads.map((upload): Repaired => storage.hasStore(upload.location) ? "deleted" : "unconfigured")
    })
  })
)
