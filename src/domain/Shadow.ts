/**
 * Shadow mode: a batch that runs beside GitLab's own worker, proposing instead of repairing, so
 * the operator can see on their own data whether Sweeper would do what GitLab does before
 * switching GitLab's worker off. A shadow run is a dry run that records each repair it would make
 * (a candidate: entity, rule, the outcome it would write, the facts it read) in Sweeper's ledger;
 * later runs look at each candidate's own row or key again and give it a verdict.
 *
 * Verdicts, for every batch:
 *   matched      GitLab's worker repaired it the way Sweeper would have;
 *   mismatched   GitLab's worker repaired it another way (another status or reason, the entry
 *                removed but the object left);
 *   sweeperOnly  still as Sweeper found it once GitLab's worker should have run (its cron period
 *                plus its stagger and run time: `SHADOW_WAIT`);
 *   gitlabOnly   repaired by GitLab's worker, never proposed by Sweeper;
 *   ignored      changed by something else (finished, cancelled, re-enqueued, re-registered, gone).
 * These are pure decisions on what was read; reading is the ShadowObserver's.
 */
import * as Context from "effect/Context"
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import { ExportJobStatus } from "./ExportJob.ts"
import { cancelingEnd, CurrentFailureReasonSet, FailureReasons } from "./StuckBuilds.ts"

export const MODES = ["act", "shadow"] as const

export const shadowCapable = (batch: string): boolean => (SHADOW_BATCHES as ReadonlyArray<string>).includes(batch)
export type Mode = typeof MODES[number]

/** `SWEEPER_MODE_DROP_CANCELING_BUILDS`, as the cron variables are named. */
export const modeVariable = (batch: string) => `SWEEPER_MODE_${batch.toUpperCase().replace(/-/g, "_")}`

export const VERDICTS = ["matched", "mismatched", "sweeperOnly", "gitlabOnly", "ignored"] as const
export type Verdict = typeof VERDICTS[number]

/** The verdicts that count against agreement: everything but matched and ignored. */
export const DISAGREEMENTS: ReadonlyArray<Verdict> = ["mismatched", "sweeperOnly", "gitlabOnly"]

/** What a shadow run would have done to one entity (a build, an export job, an upload entry). */
export interface ShadowProposal {
  /** The rule that selected it (e.g. `canceling`, `pending outdated`, `stale entry`). */
  readonly rule: string
  /** What it would write: `{status: "failed", failure_reason: 3}`, `{entry: "deleted", object: "deleted"}`. */
  readonly outcome: Readonly<Record<string, unknown>>
  /** What it read, to tell GitLab's repair from someone else's change later (updated_at, jid, value). */
  readonly facts: Readonly<Record<string, unknown>>
}

/** A proposal as the ledger holds it. */
export interface ShadowCandidate extends ShadowProposal {
  readonly batch: string
  /** The entity's event stream name (`build:123`, `export_job:7`, `direct_upload:uploads:tmp/x`). */
  readonly entity: string
  readonly runId: string | null
  readonly proposedAt: Date
  /** By then GitLab's worker should have run: before it, a candidate still stuck is not yet a verdict. */
  readonly dueAt: Date
}

/**
 * How long after a proposal GitLab's own worker surely had its turn: its cron period, its stagger
 * (StuckCiJobsWorker schedules the drop workers through the hour) and its own run time.
 */
export const SHADOW_WAIT: Readonly<Record<string, Duration.Duration>> = {
  // Ci::StuckBuilds::DropCancelingWorker: hourly (StuckCiJobsWorker at :00, this one at :45).
  "drop-canceling-builds": Duration.minutes(75),
  // DropPendingService (StuckCiJobsWorker, :00), DropRunningWorker (:15), DropScheduledWorker (:30): hourly.
  "drop-pending-builds": Duration.minutes(75),
  "drop-running-builds": Duration.minutes(75),
  "drop-scheduled-builds": Duration.minutes(75),
  // StuckExportJobsWorker: `30 * * * *`.
  "stuck-export-jobs": Duration.minutes(75),
  // DeleteStaleDirectUploadsWorker: `*/6 * * * *`, up to 250 s a run.
  "delete-stale-direct-uploads": Duration.minutes(12),
  // Issues::RescheduleStuckIssueRebalancesWorker: `*/15 * * * *`, one bulk push; its job is then
  // pending (or running) until Sidekiq's issues_rebalancing queue gets to it.
  "reschedule-stuck-issue-rebalances": Duration.minutes(20),
  // ConcurrencyLimit::ResumeWorker: `* * * * *`, each worker's pass again 1 s later while jobs remain.
  "concurrency-limit-resume": Duration.minutes(2)
}

/** The batches shadow mode can reconcile (each ports a GitLab worker whose effect can be read back). */
export const SHADOW_BATCHES = [
  "drop-canceling-builds",
  "drop-pending-builds",
  "drop-running-builds",
  "drop-scheduled-builds",
  "stuck-export-jobs",
  "delete-stale-direct-uploads",
  "reschedule-stuck-issue-rebalances",
  "concurrency-limit-resume"
] as const

export const dueAt = (batch: string, proposedAt: Date, wait?: Duration.Duration): Date =>
  new Date(proposedAt.getTime() + Duration.toMillis(wait ?? SHADOW_WAIT[batch] ?? Duration.minutes(75)))

/**
 * A wait for every batch in place of SHADOW_WAIT: only where GitLab's workers run on other timings
 * than GitLab's crons (the demo's simulated GitLab runs them every few seconds, not hourly).
 */
export const ShadowWaitOverride = Context.Reference<Duration.Duration | undefined>(
  "sweeper/domain/Shadow/ShadowWaitOverride",
  { defaultValue: () => undefined }
)

/** Not yet a verdict: GitLab's worker may still have its turn. */
export type Pending = "waiting"

// ---------------------------------------------------------------------------------------------
// Builds (drop-canceling-builds and the stuck-builds family)

/** A build's row as read back: null when it no longer exists. */
export interface BuildReading {
  readonly status: string
  readonly failureReason: number | null
  readonly updatedAt: Date
}

/** Every reason GitLab's stuck-builds workers write (legacy and GitLab 19), and doom's. */
export const STUCK_REASONS: ReadonlySet<number> = new Set(Object.values(FailureReasons))

/**
 * The same way: the status and failure_reason Sweeper would have written. Another way: GitLab's
 * stuck worker wrote another of its reasons, or (a canceling build) GitLab 19's drop, which ends
 * it `canceled` where the seed fails it. Anything else that moved the build out of the rule's
 * status, or touched it (a newer updated_at), is someone else's change.
 */
export const buildVerdict = (
  candidate: Pick<ShadowCandidate, "outcome" | "facts" | "dueAt">,
  now: Date,
  build: BuildReading | null
): Verdict | Pending => {
  if (build === null) return "ignored"
  const fromStatus = candidate.facts.status
  if (build.status === fromStatus) {
    const readAt = typeof candidate.facts.updated_at === "string" ? Date.parse(candidate.facts.updated_at) : NaN
    if (!Number.isNaN(readAt) && build.updatedAt.getTime() > readAt) return "ignored"
    return now.getTime() < candidate.dueAt.getTime() ? "waiting" : "sweeperOnly"
  }
  const wantStatus = candidate.outcome.status
  const wantReason = candidate.outcome.failure_reason ?? null
  if (build.status === wantStatus && (wantReason === null || build.failureReason === wantReason)) return "matched"
  if (build.status === "failed" && build.failureReason !== null && STUCK_REASONS.has(build.failureReason)) {
    return "mismatched"
  }
  if (fromStatus === "canceling" && build.status === "canceled") return "mismatched"
  return "ignored"
}

/** A build's proposal: the rule, what the drop writes, and the row as read. */
export const buildProposal = (
  rule: string,
  outcome: { readonly status: string; readonly failureReason: number | null },
  build: { readonly status: string; readonly lockVersion: number; readonly updatedAt: DateTime.Utc }
): ShadowProposal => ({
  rule,
  outcome: { status: outcome.status, failure_reason: outcome.failureReason },
  facts: { status: build.status, lock_version: build.lockVersion, updated_at: DateTime.formatIso(build.updatedAt) }
})

/** drop-canceling-builds' proposal under the failure-reason set in force (its end: failed or canceled). */
export const cancelingProposal = Effect.map(CurrentFailureReasonSet, (set) => {
  const end = cancelingEnd(set)
  return (build: Parameters<typeof buildProposal>[2]) =>
    buildProposal("canceling", { status: end.status, failureReason: end.written }, build)
})

// ---------------------------------------------------------------------------------------------
// Export jobs (stuck-export-jobs)

export interface ExportJobReading {
  readonly status: number
  readonly jid: string
}

/**
 * The same way: the job failed (GitLab's StuckExportJobsWorker has one outcome, `fail_op`, so
 * there is no other way to repair it: mismatched does not occur). A job that finished, or whose
 * jid changed (re-enqueued), was moved on by something else.
 */
export const exportJobVerdict = (
  candidate: Pick<ShadowCandidate, "facts" | "dueAt">,
  now: Date,
  job: ExportJobReading | null
): Verdict | Pending => {
  if (job === null) return "ignored"
  if (job.jid !== candidate.facts.jid) return "ignored"
  if (job.status === ExportJobStatus.failed) return "matched"
  if (job.status === ExportJobStatus.queued || job.status === ExportJobStatus.started) {
    return now.getTime() < candidate.dueAt.getTime() ? "waiting" : "sweeperOnly"
  }
  return "ignored"
}

/** An export job's proposal: failed, and the jid it was stuck under. */
export const exportJobProposal = (job: { readonly jid: string; readonly status: number }): ShadowProposal => ({
  rule: "sidekiq job completed",
  outcome: { status: ExportJobStatus.failed },
  facts: { jid: job.jid, status: job.status }
})

// ---------------------------------------------------------------------------------------------
// Stale direct uploads (delete-stale-direct-uploads)

/** A stale entry's proposal: delete its object and the entry; the field and value as read (base64). */
export const uploadProposal = (
  upload: { readonly field: Uint8Array; readonly value: Uint8Array; readonly path: string },
  hasStore: boolean
): ShadowProposal => ({
  rule: "stale entry",
  outcome: { entry: "deleted", object: hasStore ? "deleted" : "no store" },
  facts: {
    field: Buffer.from(upload.field).toString("base64"),
    value: Buffer.from(upload.value).toString("base64"),
    path: upload.path
  }
})

/**
 * The same way: the entry removed. Another way: the entry removed but its path has a second `:` —
 * GitLab keeps the path only up to it and deletes that object, not the upload's, which stays in the
 * bucket. An entry whose value changed is a new upload registered under the same field. `value` is
 * the entry's value now (base64), null when the field is gone.
 */
export const uploadVerdict = (
  candidate: Pick<ShadowCandidate, "facts" | "dueAt">,
  now: Date,
  value: string | null
): Verdict | Pending => {
  if (value === null) return String(candidate.facts.path ?? "").includes(":") ? "mismatched" : "matched"
  if (value !== candidate.facts.value) return "ignored"
  return now.getTime() < candidate.dueAt.getTime() ? "waiting" : "sweeperOnly"
}

// ---------------------------------------------------------------------------------------------
// The report

export interface ShadowSample {
  readonly entity: string
  readonly verdict: Verdict
  readonly rule: string
  readonly outcome: Readonly<Record<string, unknown>>
  readonly facts: Readonly<Record<string, unknown>>
  /** What was read back when the verdict was given. */
  readonly observed: Readonly<Record<string, unknown>> | null
  readonly settledAt: string
}

/** How many proposals got each verdict, and how many have none yet. */
export interface VerdictCounts {
  readonly matched: number
  readonly mismatched: number
  readonly sweeperOnly: number
  readonly gitlabOnly: number
  readonly ignored: number
  /** Proposals with no verdict yet (GitLab's worker may still run). */
  readonly waiting: number
}

export interface ShadowBatchReport extends VerdictCounts {
  readonly batch: string
  /** matched / (matched + mismatched + sweeperOnly + gitlabOnly); null when none of those. */
  readonly agreement: number | null
  /** The latest disagreements, at most SHADOW_SAMPLES, each with the facts behind it. */
  readonly samples: ReadonlyArray<ShadowSample>
}

export const SHADOW_SAMPLES = 10

export const agreementOf = (counts: Pick<ShadowBatchReport, Exclude<Verdict, "ignored">>): number | null => {
  const judged = counts.matched + counts.mismatched + counts.sweeperOnly + counts.gitlabOnly
  return judged === 0 ? null : counts.matched / judged
}

// ---------------------------------------------------------------------------------------------
// gitlabOnly: which of GitLab's repairs a batch answers for

/** The batches whose entities are builds. */
export const BUILD_BATCHES: ReadonlyArray<string> = [
  "drop-canceling-builds",
  "drop-pending-builds",
  "drop-running-builds",
  "drop-scheduled-builds"
]

/**
 * Failed builds a batch answers for when GitLab failed them: the reasons its worker writes, and
 * whether the build had started (pending builds never did; running and canceling ones did). Under
 * the legacy reasons a started build failed stuck_or_timeout_failure may have been running or
 * canceling: it is counted for drop-running-builds only (drop-canceling-builds' gitlabOnly then
 * reads server_timeout_canceling alone, GitLab 19's canceled end writing no reason at all).
 */
export const gitlabOnlyBuilds = (
  batch: string,
  set: "legacy" | "gitlab-19"
): { readonly reasons: ReadonlyArray<number>; readonly started: boolean } | null => {
  const r = FailureReasons
  switch (batch) {
    case "drop-pending-builds":
      return {
        reasons: set === "legacy"
          ? [r.stuck_or_timeout_failure]
          : [r.stuck_pending_with_matching_runners, r.stuck_pending_no_matching_runners],
        started: false
      }
    case "drop-running-builds":
      return {
        reasons: set === "legacy" ? [r.stuck_or_timeout_failure] : [r.no_updates_running, r.server_timeout_running],
        started: true
      }
    case "drop-canceling-builds":
      return set === "legacy" ? null : { reasons: [r.server_timeout_canceling], started: true }
    case "drop-scheduled-builds":
      return { reasons: [r.stale_schedule], started: false }
    default:
      return null
  }
}

/** How far back gitlabOnly looks for builds GitLab failed: their creation (a stuck build is old). */
export const GITLAB_ONLY_CREATED_WITHIN = Duration.days(7)
/** How far back gitlabOnly looks for GitLab's repairs (a repair seen once is recorded once). */
export const GITLAB_ONLY_REPAIRED_WITHIN = Duration.days(1)
/** Rows a gitlabOnly read examines per run at most: beyond it, the count is a sample (`bounded`). */
export const GITLAB_ONLY_BOUND = 5000
/** Jobs of a Sidekiq queue a gitlabOnly read looks at per queue (the rebalancing queue, a worker's queue). */
export const GITLAB_ONLY_QUEUE_BOUND = 1000
/** Open proposals judged per run at most (each read by its own key). */
export const RECONCILE_BOUND = 10_000
