/**
 * Every service a registered batch may need: the registry types its batches with it and the
 * composition root provides it, so neither has to import the other.
 */
import type { Builds } from "./Builds.ts"
import type { ConcurrencyLimits } from "./ConcurrencyLimits.ts"
import type { EventLog } from "./EventLog.ts"
import type { EventRetention } from "./EventRetention.ts"
import type { ExportJobs } from "./ExportJobs.ts"
import type { JobQueue } from "./JobQueue.ts"
import type { JobStatus } from "./JobStatus.ts"
import type { Lease } from "./Lease.ts"
import type { Metrics } from "./Metrics.ts"
import type { ObjectStorage } from "./ObjectStorage.ts"
import type { PendingDirectUploads } from "./PendingDirectUploads.ts"
import type { PlatformRecords } from "./PlatformRecords.ts"
import type { RebalanceReschedule } from "./RebalanceReschedule.ts"
import type { RebalancingState } from "./RebalancingState.ts"
import type { RunnerAckQueue } from "./RunnerAckQueue.ts"
import type { StaleUploadRepair } from "./StaleUploadRepair.ts"
import type { StuckBuilds } from "./StuckBuilds.ts"

export type PlatformServices =
  | Builds
  | StuckBuilds
  | EventLog
  | EventRetention
  | Lease
  | ExportJobs
  | JobStatus
  | PendingDirectUploads
  | ObjectStorage
  | JobQueue
  | RebalancingState
  | RunnerAckQueue
  | PlatformRecords
  | ConcurrencyLimits
  | Metrics
  | StaleUploadRepair
  | RebalanceReschedule
