/**
 * The stuck-builds family's rules, as GitLab's `Ci::StuckBuilds::Drop*Service`s state them: which
 * builds each batch fails, after how long, and with which `failure_reason`. Pure data and functions:
 * the SQL and memory layers read the same rule values, so every backend decides alike.
 *
 * GitLab re-queries "the first 100 matching rows" until the query comes back empty, so a row that
 * cannot leave the scope (a trigger refusing the update, a row another transaction holds) is read
 * again forever. Sweeper walks each rule's scope once, in keyset order, and counts such rows.
 */
import * as Context from "effect/Context"
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import type { BuildStatus } from "./Build.ts"

/**
 * `failure_reason` integers as GitLab's `Enums::Ci::CommitStatus.failure_reasons` defines them. The
 * legacy names keep their numbers in every version; GitLab 19 only adds the split reasons.
 */
export const FailureReasons = {
  stuck_or_timeout_failure: 3,
  stale_schedule: 7,
  job_execution_timeout: 8,
  data_integrity_failure: 12,
  stuck_pending_with_matching_runners: 25,
  stuck_pending_no_matching_runners: 26,
  no_updates_running: 27,
  no_updates_canceling: 28,
  server_timeout_running: 29,
  server_timeout_canceling: 30
} as const
export type FailureReasonName = keyof typeof FailureReasons

/**
 * The waiting-for-ack rule's reason, which GitLab's source does not pin to an integer Sweeper could
 * cite: the rule came with GitLab MR 204709 (≈ 18.x, `runner_provisioning_timeout`), no enum file
 * of that era was found, and in every 19.x enum (`app/models/concerns/enums/ci/commit_status.rb`)
 * 24 is job_execution_server_timeout. Writing a guessed integer would give the build another
 * reason, so the operator names it (`SWEEPER_RUNNER_PROVISIONING_TIMEOUT_REASON`, the value of
 * `Ci::Build.failure_reasons['runner_provisioning_timeout']` in their GitLab); unset, the rule is off.
 */
export const RUNNER_PROVISIONING_TIMEOUT = "runner_provisioning_timeout"
export type RuleReasonName = FailureReasonName | typeof RUNNER_PROVISIONING_TIMEOUT

/** `SWEEPER_RUNNER_PROVISIONING_TIMEOUT_REASON`; none keeps the waiting-for-ack rule off. */
export const RunnerProvisioningTimeoutReason = Context.Reference<Option.Option<number>>(
  "sweeper/domain/StuckBuilds/RunnerProvisioningTimeoutReason",
  { defaultValue: () => Option.none() }
)

/**
 * Which reasons the drops write. "legacy": GitLab before 19.0 (one stuck_or_timeout_failure for
 * every stuck build). "gitlab-19": 19.0's split, so that `retry:when` lists written for 19 match the
 * builds Sweeper fails (a build failed with the legacy reason no longer matches them).
 */
export const FAILURE_REASON_SETS = ["legacy", "gitlab-19"] as const
export type FailureReasonSet = typeof FAILURE_REASON_SETS[number]

/** `SWEEPER_FAILURE_REASONS`; the composition root provides it, a bare program sees the legacy set. */
export const CurrentFailureReasonSet = Context.Reference<FailureReasonSet>(
  "sweeper/domain/StuckBuilds/CurrentFailureReasonSet",
  { defaultValue: () => "legacy" }
)

/** What GitLab's log line calls the drop (`build_stuck_type`). */
export type StuckType = "outdated" | "stuck" | "waiting_for_ack"

export type StuckRuleName =
  | "pending_outdated"
  | "pending_waiting_for_ack"
  | "pending_stuck"
  | "running_outdated"
  | "scheduled_outdated"

export interface StuckRule {
  readonly name: StuckRuleName
  readonly status: Extract<BuildStatus, "pending" | "running" | "scheduled">
  readonly stuckType: StuckType
  /** How long ago the rule's timestamps must be. */
  readonly timeout: Duration.Duration
  /**
   * Which timestamps must be older than the cutoff: created_at and updated_at (pending, running),
   * updated_at alone (a build handed to a runner that never answered: its age since creation says
   * nothing), or scheduled_at (scheduled: a delayed job whose start time passed long ago).
   */
  readonly timestamps: "created_and_updated" | "updated_at" | "scheduled_at"
  /** Also requires that no online runner could pick the build (GitLab's `build.stuck?`). */
  readonly noOnlineRunner: boolean
  /** Only builds a runner was assigned to (runner_id set). */
  readonly runnerAssigned?: boolean
  /**
   * Passes builds whose runner is still within its acknowledgement window (GitLab's Redis entry
   * `runner:build_ack_queue:<id>`): that runner may yet accept the build.
   */
  readonly skipsWaitingForAck?: boolean
  /** The reason sets under which the rule runs at all; every set when absent. */
  readonly sets?: ReadonlyArray<FailureReasonSet>
  readonly reason: Readonly<Record<FailureReasonSet, RuleReasonName>>
}

/** BUILD_PENDING_OUTDATED_TIMEOUT: pending for a day, whatever the runners. */
export const PENDING_OUTDATED: StuckRule = {
  name: "pending_outdated",
  status: "pending",
  stuckType: "outdated",
  timeout: Duration.days(1),
  timestamps: "created_and_updated",
  noOnlineRunner: false,
  reason: { legacy: "stuck_or_timeout_failure", "gitlab-19": "stuck_pending_with_matching_runners" }
}

/**
 * BUILD_PENDING_OUTDATED_WAITING_FOR_ACK_TIMEOUT: pending, handed to a runner, no update for an hour,
 * and the runner's acknowledgement window long closed: the runner took the build and went away, so
 * GitLab's own retry-on-no-ack worker missed it. Legacy set only (GitLab 19 removed the rule), and
 * only once the operator has named runner_provisioning_timeout's integer (see above).
 */
export const PENDING_WAITING_FOR_ACK: StuckRule = {
  name: "pending_waiting_for_ack",
  status: "pending",
  stuckType: "waiting_for_ack",
  timeout: Duration.hours(1),
  timestamps: "updated_at",
  noOnlineRunner: false,
  runnerAssigned: true,
  skipsWaitingForAck: true,
  sets: ["legacy"],
  reason: { legacy: "runner_provisioning_timeout", "gitlab-19": "runner_provisioning_timeout" }
}

/**
 * The rules that run under a reason set, in the order given: those of the set, less any whose
 * reason's integer is not known (runner_provisioning_timeout until the operator names it).
 */
export const rulesFor = (
  rules: ReadonlyArray<StuckRule>,
  set: FailureReasonSet,
  provisioningTimeout: Option.Option<number> = Option.none()
): ReadonlyArray<StuckRule> =>
  rules.filter((rule) =>
    (rule.sets === undefined || rule.sets.includes(set)) &&
    (rule.reason[set] !== RUNNER_PROVISIONING_TIMEOUT || Option.isSome(provisioningTimeout))
  )

/** `rulesFor` with the configured reason set and runner_provisioning_timeout integer. */
export const rulesInForce = (rules: ReadonlyArray<StuckRule>) =>
  Effect.map(
    Effect.all([CurrentFailureReasonSet, RunnerProvisioningTimeoutReason]),
    ([set, provisioning]) => rulesFor(rules, set, provisioning)
  )

/** GitLab's shared-state key holding the runner manager a build awaits acknowledgement from. */
export const runnerAckQueueKey = (buildId: number) => `runner:build_ack_queue:${buildId}`

/** How long GitLab waits for a runner's acknowledgement ping (RUNNER_ACK_QUEUE_EXPIRY_TIME). */
export const RUNNER_ACK_QUEUE_EXPIRY = Duration.minutes(2)

/** BUILD_PENDING_STUCK_TIMEOUT: pending for an hour and no online runner can pick it. */
export const PENDING_STUCK: StuckRule = {
  name: "pending_stuck",
  status: "pending",
  stuckType: "stuck",
  timeout: Duration.hours(1),
  timestamps: "created_and_updated",
  noOnlineRunner: true,
  reason: { legacy: "stuck_or_timeout_failure", "gitlab-19": "stuck_pending_no_matching_runners" }
}

/**
 * BUILD_RUNNING_OUTDATED_TIMEOUT: running with no update for an hour. GitLab's newer query also
 * requires created_at before the cutoff (a build cannot have run an hour if created since), which is
 * what lets it use the (status, created_at, project_id) index: kept.
 */
export const RUNNING_OUTDATED: StuckRule = {
  name: "running_outdated",
  status: "running",
  stuckType: "outdated",
  timeout: Duration.hours(1),
  timestamps: "created_and_updated",
  noOnlineRunner: false,
  reason: { legacy: "stuck_or_timeout_failure", "gitlab-19": "no_updates_running" }
}

/** BUILD_SCHEDULED_OUTDATED_TIMEOUT: a delayed job whose scheduled_at passed an hour ago. */
export const SCHEDULED_OUTDATED: StuckRule = {
  name: "scheduled_outdated",
  status: "scheduled",
  stuckType: "outdated",
  timeout: Duration.hours(1),
  timestamps: "scheduled_at",
  noOnlineRunner: false,
  reason: { legacy: "stale_schedule", "gitlab-19": "stale_schedule" }
}

/**
 * GitLab's `Ci::Runner::ONLINE_CONTACT_TIMEOUT`: a runner that contacted GitLab within this is
 * online. A runner contacting less often is offline, and builds only it could take are stuck.
 */
export const RUNNER_ONLINE_CONTACT_TIMEOUT = Duration.hours(2)

/**
 * How drop-canceling-builds ends a stuck canceling build. `gitlab-19`: as GitLab's own drop does
 * (DropCancelingService calls `drop!(:no_updates_canceling)`, and CommitStatus's `drop` event has
 * `transition canceling: :canceled`; only `before_transition any => :failed` writes a failure
 * reason, and Ci::Build's canceling → canceled hook writes one only for server_timeout_canceling):
 * `canceled`, failure_reason left as it is. The reason dropped with (no_updates_canceling) is only
 * in Sweeper's event. `legacy`: the seed's `failed` with stuck_or_timeout_failure (3).
 */
export interface CancelingEnd {
  readonly status: "failed" | "canceled"
  /** What failure_reason is set to; null: left as it is. */
  readonly written: number | null
  /** The reason of the drop, as the event records it. */
  readonly reason: number
}

export const cancelingEnd = (set: FailureReasonSet): CancelingEnd =>
  set === "gitlab-19"
    ? { status: "canceled", written: null, reason: FailureReasons.no_updates_canceling }
    : {
      status: "failed",
      written: FailureReasons.stuck_or_timeout_failure,
      reason: FailureReasons.stuck_or_timeout_failure
    }

export const reasonOf = (rule: StuckRule, set: FailureReasonSet) => rule.reason[set]

/**
 * The integer a rule writes under `set`: GitLab's enum value, or for runner_provisioning_timeout the
 * operator's. A rule whose integer is not known never runs (`rulesFor`), so asking is a defect.
 */
export const reasonCodeOf = (rule: StuckRule, set: FailureReasonSet): Effect.Effect<number> => {
  const name = reasonOf(rule, set)
  if (name !== RUNNER_PROVISIONING_TIMEOUT) return Effect.succeed(FailureReasons[name])
  return Effect.flatMap(RunnerProvisioningTimeoutReason, (configured) =>
    Option.match(configured, {
      onNone: () => Effect.die(new Error(`${rule.name} runs only once runner_provisioning_timeout's integer is set`)),
      onSome: Effect.succeed
    }))
}

/** Everything strictly before this instant is "older than" the rule's timeout. */
export const ruleCutoff = (rule: StuckRule, now: DateTime.Utc): DateTime.Utc =>
  DateTime.subtractDuration(now, rule.timeout)

/** A build as the family's rules read it. */
export interface FamilyBuildFacts {
  readonly status: string
  readonly createdAt: DateTime.Utc
  readonly updatedAt: DateTime.Utc
  readonly scheduledAt: DateTime.Utc | null
  /** Whether some online runner could pick this build (only read by rules with `noOnlineRunner`). */
  readonly onlineRunner: boolean
  /** Only read by rules with `runnerAssigned`. */
  readonly runnerId?: number | null
}

/** The rule's decision for one build at `now`: the same predicate every backend's query states. */
export const matchesRule = (rule: StuckRule, build: FamilyBuildFacts, now: DateTime.Utc): boolean => {
  if (build.status !== rule.status) return false
  if (rule.runnerAssigned === true && (build.runnerId ?? null) === null) return false
  const cutoff = ruleCutoff(rule, now)
  const old = rule.timestamps === "scheduled_at"
    ? build.scheduledAt !== null && DateTime.isLessThan(build.scheduledAt, cutoff)
    : rule.timestamps === "updated_at"
    ? DateTime.isLessThan(build.updatedAt, cutoff)
    : DateTime.isLessThan(build.createdAt, cutoff) && DateTime.isLessThan(build.updatedAt, cutoff)
  return old && (!rule.noOnlineRunner || !build.onlineRunner)
}

/** The reason-set line `sweeper doctor` prints. */
export const describeReasonSet = (set: FailureReasonSet, provisioningTimeout: Option.Option<number> = Option.none()) =>
  set === "legacy"
    ? "failure reasons: legacy (before GitLab 19.0): stuck builds fail with stuck_or_timeout_failure (3), " +
      "stuck canceling builds too (failed); " + Option.match(provisioningTimeout, {
        onNone: () =>
          "pending builds their runner never acknowledged: rule off (SWEEPER_RUNNER_PROVISIONING_TIMEOUT_REASON unset)",
        onSome: (code) => `pending builds their runner never acknowledged with runner_provisioning_timeout (${code})`
      })
    : "failure reasons: gitlab-19: pending stuck_pending_with_matching_runners (25) / " +
      "stuck_pending_no_matching_runners (26), running no_updates_running (27), " +
      "scheduled stale_schedule (7); stuck canceling builds end canceled (dropped for no_updates_canceling, " +
      "failure_reason left as it is, as GitLab's drop! of a canceling build)"
