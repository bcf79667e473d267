/**
 * delete-stale-direct-uploads — port of GitLab's ObjectStorage::DeleteStaleDirectUploadsWorker (seed:
 * delete-stale-direct-uploads.ja.md, SPEC §3). A direct upload registers `<location>:<path>` in the
 * Redis hash `pending_direct_uploads` when it is prepared and removes it when it completes; an entry
 * older than 3 hours belongs to an upload that was abandoned, leaving a half-written object behind.
 * Each such object is deleted, then its event recorded, then its entry removed. Walking the hash is cooperative: after every entry
 * the run stops once its budget (250 s, GitLab's MAX_EXEC_DURATION) is spent, and the next run, six
 * minutes later, carries on.
 *
 * Unlike GitLab: a path keeps every `:` after the first; malformed entries (a value that is not a
 * number would read as 0 — "stale" — under Ruby's to_i; a field or value that is not UTF-8, which a
 * lossy decode would turn into the name of another object) are reported, never deleted; and one
 * object that cannot be deleted keeps its entry without stopping the run. A location without an
 * object store (SPEC §8.4) has its entry removed, as GitLab does, but is counted as `skippedNoStore`,
 * never as a deleted object.
 */
import { Clock, Duration, Effect, Option, Result, Stream } from "effect"
import { type Batch, checkFence, CurrentRun, decisionTime, wouldChange } from "../domain/Batch.ts"
import {
  type InvalidPendingEntry,
  isStale,
  MAX_EXEC_DURATION,
  parseEntry,
  type PendingDirectUpload,
  type RawPendingEntry
} from "../domain/DirectUpload.ts"
import type { ObjectStorageError } from "../domain/Errors.ts"
import { StaleDirectUploadDeleted } from "../domain/Events.ts"
import { EventLog } from "../services/EventLog.ts"
import {
  directUploadsDeletedTotal,
  directUploadsFailedDeletesTotal,
  directUploadsInvalidEntriesTotal,
  directUploadsPending,
  directUploadsSkippedNoStoreTotal,
  increment,
  setGauge
} from "../services/Metrics.ts"
import { ObjectStorage } from "../services/ObjectStorage.ts"
import { PendingDirectUploads } from "../services/PendingDirectUploads.ts"

export interface DeleteStaleDirectUploadsSummary {
  readonly totalPendingEntries: number
  readonly totalDeletedStaleEntries: number
  readonly executionTimeout: boolean
  readonly invalidEntries: number
  readonly failedDeletes: number
  /** Stale entries of a location with no object store configured: field removed, no object deleted. */
  readonly skippedNoStore: number
}

/** How many bad entries / failed deletes the run's single log line for each quotes. */
const LOG_SAMPLE_SIZE = 5
/** Untrusted strings quoted in a log line are cut to this length. */
const clip = (text: string) => (text.length > 200 ? `${text.slice(0, 200)}…` : text)

/**
 * Object, then event, then entry: the entry is the record that the repair is not finished, so it
 * goes last. A crash (kill -9) after the object is deleted leaves the entry; the next run finds the
 * object "missing", which counts as deleted, writes the event and removes the entry. A crash after
 * the event and before HDEL does the same and writes the event a second time. So each deletion has
 * at least one StaleDirectUploadDeleted, never none (the reverse order — entry, then event — lost
 * the event when killed in between, with nothing left to retry).
 *
 * The fence is checked first: a runner whose exclusive lease was taken from it (expired, deleted)
 * deletes nothing more, leaving the rest to the lease's new holder.
 *
 * Returns what happened to the object, or "vanished" when the entry was already gone (the upload
 * completed, or HSCAN returned it twice) and so counts nowhere.
 */
const deleteUpload = Effect.fnUntraced(function*(upload: PendingDirectUpload) {
  const storage = yield* ObjectStorage
  const pending = yield* PendingDirectUploads
  const events = yield* EventLog
  yield* checkFence
  const outcome = yield* storage.delete(upload.location, upload.path)
  // Gone meanwhile: the upload completed (GitLab removed its entry), or HSCAN returned it twice and
  // it was removed earlier in this run. Either way it is not ours to record.
  if (!(yield* pending.exists(upload.field))) return "vanished" as const
  yield* events.append(new StaleDirectUploadDeleted({ location: upload.location, path: upload.path, preparedAt: upload.preparedAt }))
  yield* pending.remove(upload.field)
  return outcome
})

const run = Effect.fn("DeleteStaleDirectUploads.run")(function*() {
  const pending = yield* PendingDirectUploads
  const storage = yield* ObjectStorage
  const { dryRun, budget } = yield* CurrentRun
  const budgetMillis = Duration.toMillis(Option.getOrElse(budget, () => MAX_EXEC_DURATION))
  const startedMillis = yield* Clock.currentTimeMillis
  const now = yield* decisionTime

  const totalPendingEntries = yield* pending.count
  yield* setGauge(directUploadsPending, totalPendingEntries)

  let totalDeletedStaleEntries = 0
  let executionTimeout = false
  const invalid: Array<InvalidPendingEntry> = []
  let invalidEntries = 0
  const failures: Array<ObjectStorageError> = []
  let failedDeletes = 0
  let skippedNoStore = 0

  /** Handles one entry; false once the budget is spent (checked after the entry, so one always runs). */
  const handle = Effect.fnUntraced(function*(raw: RawPendingEntry) {
    const parsed = parseEntry(raw)
    if (Result.isFailure(parsed)) {
      if (invalidEntries++ < LOG_SAMPLE_SIZE) invalid.push(parsed.failure)
    } else if (isStale(parsed.success, now)) {
      // The entry's field goes in either case, so a dry run reports it as a change.
      if (dryRun) yield* wouldChange(`direct_upload:${parsed.success.location}:${parsed.success.path}`)
      const outcome = dryRun
        ? (storage.hasStore(parsed.success.location) ? "deleted" : "unconfigured")
        : yield* deleteUpload(parsed.success).pipe(
          Effect.catchTag("ObjectStorageError", (error) =>
            Effect.sync(() => {
              if (failedDeletes++ < LOG_SAMPLE_SIZE) failures.push(error)
              return "failed" as const
            }))
        )
      // A missing object counts as deleted; a location without a store is counted apart (SPEC §8.4).
      if (outcome === "deleted" || outcome === "missing") totalDeletedStaleEntries++
      else if (outcome === "unconfigured") skippedNoStore++
    }
    const elapsed = (yield* Clock.currentTimeMillis) - startedMillis
    if (elapsed >= budgetMillis) executionTimeout = true
    return !executionTimeout
  })

  yield* Stream.runForEachWhile(pending.scan(), handle)

  if (invalidEntries > 0) {
    yield* Effect.logWarning("Skipped malformed pending direct upload entries").pipe(Effect.annotateLogs({
      invalid_entries: invalidEntries,
      sample: invalid.map(({ field, value, reason }) => ({ field: clip(field), value: clip(value), reason }))
    }))
  }
  if (failedDeletes > 0) {
    yield* Effect.logWarning("Could not delete stale direct upload objects; their entries are kept").pipe(Effect.annotateLogs({
      failed_deletes: failedDeletes,
      sample: failures.map(({ location, path, message }) => ({ location, path, message }))
    }))
  }

  const summary: DeleteStaleDirectUploadsSummary = {
    totalPendingEntries,
    totalDeletedStaleEntries,
    executionTimeout,
    invalidEntries,
    failedDeletes,
    skippedNoStore
  }
  if (!dryRun) {
    yield* increment(directUploadsDeletedTotal, totalDeletedStaleEntries)
    yield* increment(directUploadsInvalidEntriesTotal, invalidEntries)
    yield* increment(directUploadsFailedDeletesTotal, failedDeletes)
    yield* increment(directUploadsSkippedNoStoreTotal, skippedNoStore)
  }
  yield* Effect.logInfo("Deleted stale direct uploads").pipe(Effect.annotateLogs({
    total_pending_entries: totalPendingEntries,
    total_deleted_stale_entries: totalDeletedStaleEntries,
    execution_timeout: executionTimeout,
    invalid_entries: invalidEntries,
    failed_deletes: failedDeletes,
    skipped_no_store: skippedNoStore,
    dry_run: dryRun
  }))
  return summary
})

export const DeleteStaleDirectUploads = {
  name: "delete-stale-direct-uploads",
  worker: "ObjectStorage::DeleteStaleDirectUploadsWorker",
  description: "Deletes objects and pending_direct_uploads entries of direct uploads abandoned for over 3 hours",
  cron: "*/6 * * * *",
  budget: MAX_EXEC_DURATION,
  // GitLab relies on deduplicate :until_executed; the scheduler's single flight covers overlap.
  // Single flight cluster-wide (SPEC §3): a run past its 6 min tick must not overlap the next one.
  lease: Option.some({ name: "sweeper/delete_stale_direct_uploads", ttl: Duration.minutes(5) }),
  run: run()
} satisfies Batch<DeleteStaleDirectUploadsSummary, unknown, unknown>
