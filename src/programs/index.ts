/**
 * The batch registry: plain data that the scheduler, CLI, REPL and HTTP API all read. Adding a
 * batch is adding it here.
 */
import * as Effect from "effect/Effect"
import type { Batch } from "../domain/Batch.ts"
import { UnknownBatch } from "../domain/Errors.ts"
import type { PlatformServices } from "../services/Platform.ts"
import { ConcurrencyLimitResume } from "./ConcurrencyLimitResume.ts"
import { DeleteStaleDirectUploads } from "./DeleteStaleDirectUploads.ts"
import { DropCancelingBuilds } from "./DropCancelingBuilds.ts"
import { DropPendingBuilds } from "./DropPendingBuilds.ts"
import { DropRunningBuilds } from "./DropRunningBuilds.ts"
import { DropScheduledBuilds } from "./DropScheduledBuilds.ts"
import { PruneEvents } from "./PruneEvents.ts"
import { RescheduleStuckIssueRebalances } from "./RescheduleStuckIssueRebalances.ts"
import { StuckExportJobs } from "./StuckExportJobs.ts"

export type RegisteredBatch = Batch<unknown, unknown, PlatformServices>

export const batches: ReadonlyArray<RegisteredBatch> = [
  DropCancelingBuilds,
  StuckExportJobs,
  DeleteStaleDirectUploads,
  RescheduleStuckIssueRebalances,
  ConcurrencyLimitResume,
  // GitLab's StuckCiJobsWorker family beside drop-canceling, each on the minute GitLab staggers it to.
  DropPendingBuilds,
  DropRunningBuilds,
  DropScheduledBuilds,
  // Sweeper's own: the eight above port GitLab's workers, this one keeps the event log bounded.
  PruneEvents
]

export const batchNames = batches.map((batch) => batch.name)

export const findBatch = (name: string): Effect.Effect<RegisteredBatch, UnknownBatch> => {
  const batch = batches.find((candidate) => candidate.name === name)
  return batch === undefined ? Effect.fail(new UnknownBatch({ name, known: batchNames })) : Effect.succeed(batch)
}
