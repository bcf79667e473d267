/**
 * StaleUploadRepair over the configured object storage, the pending hash and the event log: one
 * implementation for every backend, since the order of the three writes is the rule.
 */
import { Effect, Layer, Result } from "effect"
import type { Location, StaleUpload, StaleUploadOutcome } from "../../domain/DirectUpload.ts"
import type { ObjectStorageError } from "../../domain/Errors.ts"
import { StaleDirectUploadDeleted } from "../../domain/Events.ts"
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
 * 2. the objects, per location in bulk (`deleteMany`: S3 DeleteObjects, 1,000 keys a request); an
 *    object that cannot be deleted keeps its entry and gets no event, the rest go on;
 * 3. HMGET of the fields: one gone (the upload completed, or HSCAN returned it twice) or changed
 *    (re-registered) since it was read is not ours to record or remove — "vanished";
 * 4. the events, one multi-row INSERT;
 * 5. the fields, one compare-and-delete script call: removed only while still holding the bytes read.
 */
const repairWith = (
  storage: ObjectStorage["Service"],
  pending: PendingDirectUploads["Service"],
  events: EventLog["Service"]
) =>
  Effect.fnUntraced(function*(uploads: ReadonlyArray<StaleUpload>) {
    const results: Array<Repaired> = new Array(uploads.length)
    if (uploads.length === 0) return results
    const byLocation = new Map<Location, Array<number>>()
    uploads.forEach((upload, i) => {
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

    const deleted = uploads.flatMap((upload, i) => typeof results[i] === "string" ? [i] : [])
    const current = yield* pending.values(deleted.map((i) => uploads[i]!.field))
    const ours = deleted.filter((i, n) => {
      const value = current[n]
      const unchanged = value !== null && value !== undefined && Buffer.from(value).equals(uploads[i]!.value)
      if (!unchanged) results[i] = "vanished"
      return unchanged
    })
    yield* events.appendAll(ours.map((i) => {
      const { location, path, preparedAt } = uploads[i]!
      return new StaleDirectUploadDeleted({ location, path, preparedAt })
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
