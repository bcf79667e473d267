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
