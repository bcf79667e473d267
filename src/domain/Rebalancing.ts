/**
 * GitLab's issue-position rebalancing state (`Gitlab::Issues::Rebalancing::State`) as far as
 * reschedule-stuck-issue-rebalances needs it: the shared-state set of running rebalances and the
 * worker that carries one out. Members are written by GitLab's rebalancer, so they are untrusted and
 * decoded with Schema; anything that is not `"1/<id>"` or `"2/<id>"` (including bytes that are not
 * UTF-8) is counted, never fatal, and never acted on.
 */
import * as Duration from "effect/Duration"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import * as SchemaTransformation from "effect/SchemaTransformation"
import { decodeUtf8, escapeBytes } from "./Bytes.ts"
import type { Pending, ShadowCandidate, ShadowProposal, Verdict } from "./Shadow.ts"

/** SADDed by the rebalancer when it starts a rebalance, SREMed when it finishes. */
export const RUNNING_REBALANCES_KEY = "gitlab:issues-position-rebalances:running_rebalances"

/** The container type prefix of a member (`State::NAMESPACE` / `State::PROJECT`). */
export const RebalanceContainer = { namespace: 1, project: 2 } as const
export type RebalanceType = typeof RebalanceContainer[keyof typeof RebalanceContainer]
export const rebalanceTypeName = (
  type: RebalanceType
) => (type === RebalanceContainer.namespace ? "namespace" : "project")

/** `REDIS_EXPIRY_TIME`: the rebalancer refreshes the set's expiry to this on every update. */
export const REDIS_EXPIRY_TIME = Duration.days(10)
/** The rebalancer refuses to start more than this many at once, so the set stays small. */
export const MAX_NUMBER_OF_CONCURRENT_REBALANCES = 5

export const REBALANCING_WORKER = "Issues::RebalancingWorker"
export const REBALANCING_QUEUE = "issues_rebalancing"
/**
 * The class older GitLab releases' reschedule worker pushes instead (`IssueRebalancingWorker`, queue
 * `issue_rebalancing`): the same rebalance as another job, which shadow mode tells apart.
 */
export const LEGACY_REBALANCING_WORKER = "IssueRebalancingWorker"
export const LEGACY_REBALANCING_QUEUE = "issue_rebalancing"
/** GitLab's cron worker this batch ports: the `meta.caller_id` of the jobs it pushes. */
export const RESCHEDULE_WORKER = "Issues::RescheduleStuckIssueRebalancesWorker"

/** `State.recently_finished_key`: set (`true`, for an hour) by the rebalancer when a rebalance finishes. */
export const recentlyFinishedKey = (type: RebalanceType, id: number) =>
  `gitlab:issues-position-rebalances:recently_finished:${type}:${id}`
export const RECENTLY_FINISHED_TTL = Duration.hours(1)

/** `Issues::RebalancingWorker#perform(ignore = nil, project_id = nil, root_namespace_id = nil)`. */
export const rebalancingWorkerArgs = (type: RebalanceType, id: number): ReadonlyArray<number | null> =>
  type === RebalanceContainer.namespace ? [null, null, id] : [null, id, null]

export const rebalanceMember = (type: RebalanceType, id: number) => `${type}/${id}`

/** A database id as the rebalancer writes it: canonical decimal, positive, a safe integer. */
const ContainerId = Schema.String.check(Schema.isPattern(/^[1-9][0-9]*$/)).pipe(
  Schema.decodeTo(Schema.Int.check(Schema.isGreaterThan(0)), SchemaTransformation.numberFromString)
)

/** `"<type>/<id>"` with a known type. */
export const RunningRebalanceMember = Schema.TemplateLiteralParser([
  Schema.Literals([RebalanceContainer.namespace, RebalanceContainer.project]),
  "/",
  ContainerId
])

export interface RunningRebalances {
  /** Ascending, without repeats. */
  readonly namespaceIds: ReadonlyArray<number>
  readonly projectIds: ReadonlyArray<number>
  /** Members of another type, with a non-numeric id, not UTF-8, or not of the form at all. */
  readonly invalidMembers: number
  /** Up to a few invalid members, for the log line (bytes that are not UTF-8 as `\xNN`). */
  readonly invalidSample: ReadonlyArray<string>
}

const INVALID_SAMPLE_SIZE = 5
const decodeMember = Schema.decodeUnknownOption(RunningRebalanceMember)

/**
 * Splits SMEMBERS of the running-rebalances set (GitLab's `fetch_rebalancing_groups_and_projects`).
 * Members are the raw bytes Redis holds (strings are accepted as already-decoded text); a member
 * that is not strict UTF-8 is invalid rather than decoded with replacement characters.
 */
export const parseRunningRebalances = (members: ReadonlyArray<unknown>): RunningRebalances => {
  const namespaceIds = new Set<number>()
  const projectIds = new Set<number>()
  const invalid: Array<string> = []
  for (const member of members) {
    const text = member instanceof Uint8Array ? decodeUtf8(member) : Option.some(member)
    const decoded = Option.flatMap(text, decodeMember)
    if (Option.isNone(decoded)) {
      invalid.push(member instanceof Uint8Array ? escapeBytes(member) : String(member))
      continue
    }
    const [type, , id] = decoded.value
    if (type === RebalanceContainer.namespace) namespaceIds.add(id)
    else projectIds.add(id)
  }
  const ascending = (ids: Set<number>) => [...ids].sort((a, b) => a - b)
  return {
    namespaceIds: ascending(namespaceIds),
    projectIds: ascending(projectIds),
    invalidMembers: invalid.length,
    invalidSample: invalid.slice(0, INVALID_SAMPLE_SIZE)
  }
}

/**
 * A run's per-type counts of jobs pushed, `n` for `type` (the summary's enqueuedNamespaces /
 * enqueuedProjects); no type (a unit with no container) counts nothing.
 */
export const enqueuedCounts = (type: RebalanceType | undefined, n: number) => ({
  enqueuedNamespaces: type === RebalanceContainer.namespace ? n : 0,
  enqueuedProjects: type === RebalanceContainer.project ? n : 0
})

/** The ids read from Redis whose container the database no longer has, as the run's log line names them. */
export const goneContainers = (
  read: Pick<RunningRebalances, "namespaceIds" | "projectIds">,
  existing: { readonly namespaces: ReadonlyArray<number>; readonly projects: ReadonlyArray<number> }
) => ({
  namespace_ids: read.namespaceIds.filter((id) => !existing.namespaces.includes(id)),
  project_ids: read.projectIds.filter((id) => !existing.projects.includes(id))
})

/** The run's two units of work, namespaces then projects: each one bulk push of the containers that still exist. */
export const rebalanceUnits = (
  existing: { readonly namespaces: ReadonlyArray<number>; readonly projects: ReadonlyArray<number> }
) =>
  [
    { type: RebalanceContainer.namespace, ids: existing.namespaces },
    { type: RebalanceContainer.project, ids: existing.projects }
  ] as const

/**
 * The containers of one unit still in the running set as read again right before their push (a unit
 * may have waited on the health gate; a rebalance that finished meanwhile must not get a new full
 * rebalance).
 */
export const stillRunning = (type: RebalanceType, ids: ReadonlyArray<number>, members: ReadonlyArray<unknown>) => {
  const running = parseRunningRebalances(members)
  const runningIds = new Set(type === RebalanceContainer.namespace ? running.namespaceIds : running.projectIds)
  return ids.filter((id) => runningIds.has(id)).map((id) => ({ type, id }))
}

// ---------------------------------------------------------------------------------------------
// Shadow mode (docs/from-gitlab-workers.md): what a proposal is, and its verdict

/** What a rebalance's own keys say now. */
export interface RebalanceReading {
  /** Its member is still in the running-rebalances set. */
  readonly running: boolean
  /** GitLab's `recently_finished` mark: the rebalance ran to its end within the last hour. */
  readonly finished: boolean
  /** The jid holding the until_executed claim of the job Sweeper would push (pending or running), or null. */
  readonly job: string | null
  /** The same for the legacy `IssueRebalancingWorker` job older GitLab releases push instead. */
  readonly legacyJob: string | null
}

/** A rebalance's proposal: the Issues::RebalancingWorker job Sweeper would push for its container. */
export const rebalanceProposal = (
  container: { readonly type: RebalanceType; readonly id: number }
): ShadowProposal => ({
  rule: "still running",
  outcome: {
    job: REBALANCING_WORKER,
    queue: REBALANCING_QUEUE,
    args: rebalancingWorkerArgs(container.type, container.id)
  },
  facts: { member: rebalanceMember(container.type, container.id) }
})

/** `rebalance:1/5` → the container. */
export const rebalanceOfEntity = (entity: string): { readonly type: RebalanceType; readonly id: number } => {
  const [type, id] = entity.slice("rebalance:".length).split("/")
  return { type: Number(type) === RebalanceContainer.project ? 2 : 1, id: Number(id) }
}

/**
 * The same way: GitLab's worker re-enqueued the same job (its until_executed claim is held: pending
 * or running), or the rebalance ran to its end (GitLab's `recently_finished` mark, not there when
 * proposed: `facts.finished_before`). Another way: the
 * rebalance re-enqueued as the legacy `IssueRebalancingWorker`. Out of the running set with neither
 * mark nor job: removed by something else (by hand, the set expired).
 */
export const rebalanceVerdict = (
  candidate: Pick<ShadowCandidate, "dueAt" | "facts">,
  now: Date,
  reading: RebalanceReading
): Verdict | Pending => {
  if (reading.job !== null || (reading.finished && candidate.facts.finished_before !== true)) return "matched"
  if (reading.legacyJob !== null) return "mismatched"
  if (!reading.running) return "ignored"
  return now.getTime() < candidate.dueAt.getTime() ? "waiting" : "sweeperOnly"
}

const RescheduledJob = Schema.Struct({
  class: Schema.Literal(REBALANCING_WORKER),
  args: Schema.Tuple([Schema.Unknown, Schema.NullOr(Schema.Int), Schema.NullOr(Schema.Int)]),
  "meta.caller_id": Schema.Literal(RESCHEDULE_WORKER)
})
const decodeRescheduled = Schema.decodeUnknownOption(Schema.fromJsonString(RescheduledJob))

/**
 * The container of a job in `queue:issues_rebalancing` that GitLab's reschedule worker pushed (its
 * `meta.caller_id`); None for any other job (a rebalance started by a position update, say).
 */
export const rescheduledRebalance = (
  raw: Uint8Array
): Option.Option<{ readonly type: RebalanceType; readonly id: number }> =>
  Option.flatMap(
    Option.flatMap(decodeUtf8(raw), decodeRescheduled),
    ({ args: [, project, namespace] }) =>
      namespace !== null && namespace > 0
        ? Option.some({ type: RebalanceContainer.namespace, id: namespace })
        : project !== null && project > 0
        ? Option.some({ type: RebalanceContainer.project, id: project })
        : Option.none()
  )
