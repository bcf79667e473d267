/**
 * delete-stale-direct-uploads — port of GitLab's ObjectStorage::DeleteStaleDirectUploadsWorker (seed:
 * delete-stale-direct-uploads.ja.md, SPEC §3). A direct upload registers `<location>:<path>` in the
 * Redis hash `pending_direct_uploads` when it is prepared and removes it when it completes; an entry
 * older than 3 hours belongs to an upload that was abandoned, leaving a half-written object behind.
 * Such objects are deleted, then their events recorded, then their entries removed, in page-sized
 * steps (see `repairAll`). Walking the hash is cooperative (the repair loop's `growingSteps`): after
 * every step the run stops once its budget (250 s, GitLab's MAX_EXEC_DURATION) is spent, and the
 * next run, six minutes later, carries on.
 *
 * Unlike GitLab: a path keeps every `:` after the first; malformed entries (a value that is not a
 * number would read as 0 — "stale" — under Ruby's to_i; a field or value that is not UTF-8, which a
 * lossy decode would turn into the name of another object) are reported, never deleted; and one
 * object that cannot be deleted keeps its entry without stopping the run. A location without an
 * object store (SPEC §8.4) has its entry removed, as GitLab does, but is counted as `skippedNoStore`,
 * never as a deleted object.
 */
import { Duration, Effect, Option, Result } from "effect"
import { type Batch, CurrentRun, decisionTime } from "../domain/Batch.ts"
import {
  type InvalidPendingEntry,
  staleAt,
  type Location,
  MAX_EXEC_DURATION,
  parseEntry,
  type PendingDirectUpload,
  type RawPendingEntry,
  SCAN_PAGE_SIZE,
  type StaleUploadOutcome,
  tallyOutcomes
} from "../domain/DirectUpload.ts"
import type { ObjectStorageError } from "../domain/Errors.ts"
import { StaleDirectUploadDeleted } from "../domain/Events.ts"
import { growingSteps, type Held } from "../runtime/RepairLoop.ts"
import { EventLog } from "../services/EventLog.ts"
import {
  directUploadsDeletedTotal,
  directUploadsFailedDeletesTotal,
  directUploadsInvalidEntriesTotal,
  directUploadsPending,
  directUploadsSkippedNoStoreTotal,
  directUploadsVanishedTotal,
  increment,
  setGauge
} from "../services/Metrics.ts"
import { ObjectStorage } from "../services/ObjectStorage.ts"
import { PendingDirectUploads } from "../services/PendingDirectUploads.ts"

export interface DeleteStaleDirectUploadsSummary extends Held {
  readonly totalPendingEntries: number
  readonly totalDeletedStaleEntries: number
  readonly executionTimeout: boolean
  readonly invalidEntries: number
  readonly failedDeletes: number
  /** Stale entries of a location with no object store configured: field removed, no object deleted. */
  readonly skippedNoStore: number
  /** Stale entries gone or re-registered between the read and the repair: neither removed nor recorded. */
  readonly vanished: number
}

/** How much larger each step may be than the one before (the repair loop's `growingSteps`: 1, 8, 64, 512, 4096, a page: five steps to full pages where doubling took thirteen). */
const STEP_GROWTH = 8
/** How many bad entries / failed deletes the run's single log line for each quotes. */
const LOG_SAMPLE_SIZE = 5
/** Untrusted strings quoted in a log line are cut to this length. */
const clip = (text: string) => (text.length > 200 ? `${text.slice(0, 200)}…` : text)

/** What became of one stale upload in a page's repair. */
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
const repairAll = Effect.fnUntraced(function*(uploads: ReadonlyArray<PendingDirectUpload & { readonly value: Uint8Array }>) {
  const storage = yield* ObjectStorage
  const pending = yield* PendingDirectUploads
  const events = yield* EventLog
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

const NAME = "delete-stale-direct-uploads"

const run = Effect.fn("DeleteStaleDirectUploads.run")(function*() {
  const pending = yield* PendingDirectUploads
  const storage = yield* ObjectStorage
  const { dryRun } = yield* CurrentRun
  const isStale = staleAt(yield* decisionTime)
  const totalPendingEntries = yield* pending.count
  yield* setGauge(directUploadsPending, totalPendingEntries)
  const invalid: Array<InvalidPendingEntry> = []
  const failures: Array<ObjectStorageError> = []
  const counts = { invalidEntries: 0, failedDeletes: 0, skippedNoStore: 0 }

  // Walks the hash in steps that grow (1, 8, 64, 512, 4096, a page: see `growingSteps`).
  const { totals: { totalDeletedStaleEntries, vanished }, stop, heldMs, heldBy } = yield* growingSteps({
    batch: NAME, budget: MAX_EXEC_DURATION, source: pending.scan(), growth: { first: 1, factor: STEP_GROWTH, max: SCAN_PAGE_SIZE },
    initial: { totalDeletedStaleEntries: 0, vanished: 0 },
    unit: {
      plan: (slice: ReadonlyArray<RawPendingEntry>) => Effect.succeed(slice.flatMap((raw) => {
        const parsed = parseEntry(raw)
        if (Result.isFailure(parsed) && counts.invalidEntries++ < LOG_SAMPLE_SIZE) invalid.push(parsed.failure)
        return Result.isSuccess(parsed) && isStale(parsed.success) ? [{ ...parsed.success, value: raw.value }] : []
      })),
      // The entry's field goes in either case, so a dry run reports it as a change.
      target: (upload) => `direct_upload:${upload.location}:${upload.path}`,
      dry: (stale) => {
        const noStore = stale.filter((upload) => !storage.hasStore(upload.location)).length
        counts.skippedNoStore += noStore
        return { totalDeletedStaleEntries: stale.length - noStore, vanished: 0 }
      },
      write: (stale, commit) => Effect.gen(function*() {
        // A missing object counts as deleted; a location without a store is counted apart (SPEC §8.4).
        const tally = tallyOutcomes(yield* repairAll(stale))
        counts.skippedNoStore += tally.skippedNoStore
        for (const failure of tally.failed) if (counts.failedDeletes++ < LOG_SAMPLE_SIZE) failures.push(failure)
        // The step is done (its fields are gone or not ours): a retried attempt will not see these again.
        if (tally.deleted + tally.vanished > 0) yield* commit({ totalDeletedStaleEntries: tally.deleted, vanished: tally.vanished })
      })
    }
  })

  const { invalidEntries, failedDeletes, skippedNoStore } = counts
  if (invalidEntries > 0) yield* Effect.logWarning("Skipped malformed pending direct upload entries").pipe(Effect.annotateLogs({ invalid_entries: invalidEntries, sample: invalid.map(({ field, value, reason }) => ({ field: clip(field), value: clip(value), reason })) }))
  if (failedDeletes > 0) yield* Effect.logWarning("Could not delete stale direct upload objects; their entries are kept").pipe(Effect.annotateLogs({ failed_deletes: failedDeletes, sample: failures.map(({ location, path, message }) => ({ location, path, message })) }))
  const executionTimeout = stop !== "done"
  if (!dryRun) {
    yield* increment(directUploadsDeletedTotal, totalDeletedStaleEntries)
    yield* increment(directUploadsInvalidEntriesTotal, invalidEntries)
    yield* increment(directUploadsFailedDeletesTotal, failedDeletes)
    yield* increment(directUploadsSkippedNoStoreTotal, skippedNoStore)
    yield* increment(directUploadsVanishedTotal, vanished)
  }
  yield* Effect.logInfo("Deleted stale direct uploads").pipe(Effect.annotateLogs({
    total_pending_entries: totalPendingEntries, total_deleted_stale_entries: totalDeletedStaleEntries, execution_timeout: executionTimeout,
    invalid_entries: invalidEntries, failed_deletes: failedDeletes, skipped_no_store: skippedNoStore, vanished, dry_run: dryRun
  }))
  return { totalPendingEntries, totalDeletedStaleEntries, executionTimeout, ...counts, vanished, heldMs, heldBy } satisfies DeleteStaleDirectUploadsSummary
})

export const DeleteStaleDirectUploads = {
  name: NAME,
  worker: "ObjectStorage::DeleteStaleDirectUploadsWorker",
  description: "Deletes objects and pending_direct_uploads entries of direct uploads abandoned for over 3 hours",
  cron: "*/6 * * * *",
  budget: MAX_EXEC_DURATION,
  // GitLab relies on deduplicate :until_executed; the scheduler's single flight covers overlap.
  // Single flight cluster-wide (SPEC §3): a run past its 6 min tick must not overlap the next one.
  lease: Option.some({ name: "sweeper/delete_stale_direct_uploads", ttl: Duration.minutes(5) }),
  writes: { tables: ["sweeper_events"], redisStores: ["sharedState"] },
  run: run()
} satisfies Batch<DeleteStaleDirectUploadsSummary, unknown, unknown>
