/**
 * delete-stale-direct-uploads' backlog: HLEN, then the run's own HSCAN for at most BACKLOG_CAP
 * entries (never the whole hash), sorted by the run's `staleEntries` at the run's cutoff. Each stale
 * entry has been due since it turned three hours old; a hash larger than the sample means "more than".
 */
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import * as Stream from "effect/Stream"
import { BACKLOG_CAP, backlogPart, type BacklogReading, earliest } from "../domain/Backlog.ts"
import { decisionTime } from "../domain/Batch.ts"
import { STALE_AFTER, staleAt, staleEntries } from "../domain/DirectUpload.ts"
import { PendingDirectUploads } from "../services/PendingDirectUploads.ts"

export const deleteStaleDirectUploadsBacklog = Effect.gen(function*() {
  const pending = yield* PendingDirectUploads
  const isStale = staleAt(yield* decisionTime)
  const entries = yield* pending.count
  const sample = yield* Stream.runCollect(Stream.take(pending.scan({ pageSize: BACKLOG_CAP }), BACKLOG_CAP))
  const { stale } = staleEntries(sample, isStale)
  const due = stale.map((upload) => DateTime.addDuration(DateTime.makeUnsafe(upload.preparedAt * 1000), STALE_AFTER))
  return { parts: [backlogPart("stale entries", stale.length, entries > sample.length, earliest(due))] }
}) satisfies Effect.Effect<BacklogReading, unknown, PendingDirectUploads>
