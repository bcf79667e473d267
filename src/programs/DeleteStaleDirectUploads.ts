/**
 * delete-stale-direct-uploads — port of GitLab's ObjectStorage::DeleteStaleDirectUploadsWorker. A direct upload
 * registers `<location>:<path>` in the
 * Redis hash `pending_direct_uploads` when it is prepared and removes it when it completes; an entry
 * older than 3 hours belongs to an upload that was abandoned, leaving a half-written object behind.
 * Such objects are deleted, then their events recorded, then their entries removed, in page-sized
 * steps (`StaleUploadRepair`: one layer-side operation, in the order that loses nothing). Walking
 * the hash is cooperative (the repair loop's `growingSteps`): after every step the run stops once
 * its budget (250 s, GitLab's MAX_EXEC_DURATION) is spent, and the next run, six minutes later,
 * carries on. The next page's HSCAN runs beside a step's writes (after its re-read): only reads go
 * ahead, so the budget still stops the writes after the step that spent it.
 *
 * Unlike GitLab: a path keeps every `:` after the first; malformed entries (a value that is not a
 * number would read as 0 — "stale" — under Ruby's to_i; a field or value that is not UTF-8, which a
 * lossy decode would turn into the name of another object) are reported, never deleted; and one
 * object that cannot be deleted keeps its entry without stopping the run. A location without an
 * object store has its entry removed, as GitLab does, but is counted as `skippedNoStore`,
 * never as a deleted object.
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { type Batch, CurrentRun, decisionTime } from "../domain/Batch.ts"
import * as D from "../domain/DirectUpload.ts"
import type { ObjectStorageError } from "../domain/Errors.ts"
import { uploadProposal } from "../domain/Shadow.ts"
import { growingSteps } from "../repair/RepairLoop.ts"
import * as M from "../services/Metrics.ts"
import { PendingDirectUploads } from "../services/PendingDirectUploads.ts"
import { StaleUploadRepair } from "../services/StaleUploadRepair.ts"
import { deleteStaleDirectUploadsBacklog } from "./DeleteStaleDirectUploadsBacklog.ts"

export type { DeleteStaleDirectUploadsSummary } from "../domain/DirectUpload.ts"

const NAME = "delete-stale-direct-uploads"

const run = Effect.fn("DeleteStaleDirectUploads.run")(function*() {
  const pending = yield* PendingDirectUploads
  const repairs = yield* StaleUploadRepair
  const { dryRun } = yield* CurrentRun
  const isStale = D.staleAt(yield* decisionTime)
  const totalPendingEntries = yield* pending.count
  yield* M.setGauge(M.directUploadsPending, totalPendingEntries)
  // A missing object counts as deleted; a location without a store is counted apart.
  const met = new D.UploadsMet<ObjectStorageError>()

  // Walks the hash in steps that grow (1, 8, 64, 512, 4096, a page: see `growingSteps`).
  const { totals: { totalDeletedStaleEntries, vanished }, stop, heldMs, heldBy } = yield* growingSteps({
    batch: NAME,
    budget: D.MAX_EXEC_DURATION,
    source: pending.scan(),
    growth: { first: 1, factor: D.STEP_GROWTH, max: D.SCAN_PAGE_SIZE },
    initial: { totalDeletedStaleEntries: 0, vanished: 0 },
    unit: {
      plan: (entries) => Effect.sync(() => met.sorted(D.staleEntries(entries, isStale))),
      target: (upload) => `direct_upload:${upload.location}:${upload.path}`,
      propose: (upload) => uploadProposal(upload, repairs.wouldRepair([upload])[0] !== "unconfigured"),
      dry: (stale) => met.repaired(D.tallyOutcomes(repairs.wouldRepair(stale))),
      // The step is done (its fields are gone or not ours): a retried attempt will not see these again.
      write: (stale, commit, readsDone) =>
        Effect.flatMap(repairs.repair(stale, readsDone), (outcomes) => {
          const step = met.repaired(D.tallyOutcomes(outcomes))
          return step.totalDeletedStaleEntries + step.vanished > 0 ? commit(step) : Effect.void
        })
    }
  })

  const { invalidEntries, failedDeletes, skippedNoStore } = met
  const summary: D.DeleteStaleDirectUploadsSummary = {
    totalPendingEntries,
    totalDeletedStaleEntries,
    executionTimeout: stop !== "done",
    invalidEntries,
    failedDeletes,
    skippedNoStore,
    vanished,
    heldMs,
    heldBy
  }
  for (const { message, fields } of D.runWarnings(met)) {
    yield* Effect.logWarning(message).pipe(Effect.annotateLogs(fields))
  }
  if (!dryRun) {
    yield* M.incrementEach([
      [M.directUploadsDeletedTotal, totalDeletedStaleEntries],
      [M.directUploadsInvalidEntriesTotal, invalidEntries],
      [M.directUploadsFailedDeletesTotal, failedDeletes],
      [M.directUploadsSkippedNoStoreTotal, skippedNoStore],
      [M.directUploadsVanishedTotal, vanished]
    ])
  }
  yield* Effect.logInfo("Deleted stale direct uploads").pipe(Effect.annotateLogs(D.summaryLogFields(summary, dryRun)))
  return summary
})

export const DeleteStaleDirectUploads = {
  name: NAME,
  worker: "ObjectStorage::DeleteStaleDirectUploadsWorker",
  description: "Deletes objects and pending_direct_uploads entries of direct uploads abandoned for over 3 hours",
  cron: "*/6 * * * *",
  budget: D.MAX_EXEC_DURATION,
  // GitLab relies on deduplicate :until_executed; the scheduler's single flight covers overlap.
  // Single flight cluster-wide: a run past its 6 min tick must not overlap the next one.
  lease: Option.some({ name: "sweeper/delete_stale_direct_uploads", ttl: Duration.minutes(5) }),
  writes: { tables: ["sweeper_events"], redisStores: ["sharedState"] },
  repairedCounts: ["totalDeletedStaleEntries"],
  run: run(),
  backlog: deleteStaleDirectUploadsBacklog
} satisfies Batch<D.DeleteStaleDirectUploadsSummary, unknown, unknown>
