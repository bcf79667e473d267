/**
 * What GitLab's state machine does after it drops a build, beyond the row's UPDATE, as Sweeper
 * reproduces it: the Sidekiq jobs GitLab pushes after the transaction commits (run_after_commit)
 * and the queues they go to. Read in GitLab's `app/models/commit_status.rb`, `app/models/ci/build.rb`
 * and `app/models/ci/processable.rb` (gitlabhq/gitlabhq, 19.3-era master at
 * 41946e65501d176230532ae34b16e64f5cdac462):
 * - `PipelineProcessWorker [pipeline_id]`: CommitStatus's after_transition, for a build that is not
 *   `processed` after its before_save (a latest one: `retried` not true). Its pipeline's stages and
 *   status are recomputed there, which is how a dropped build's pipeline finishes.
 * - `Ci::BuildFinishedWorker [build_id]`: Ci::Build's after_transition to success, failed or
 *   canceled. Not idempotent (it runs the job's hooks, removes its token, schedules the trace
 *   archive): pushed exactly once per build.
 * - `Ci::ResourceGroups::AssignResourceFromResourceGroupWorker [resource_group_id]`: Processable's
 *   after_transition to a completed status, for a build with a resource group, whether or not a
 *   resource was released (GitLab pushes it either way).
 * Pure: names, queues and the routing configuration's meaning; the SQL that writes the jobs into an
 * outbox lives with the drop (layers/postgres/TransitionsSql.ts), the relay in JobOutbox.ts.
 */
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"

export const PIPELINE_PROCESS_WORKER = "PipelineProcessWorker"
export const BUILD_FINISHED_WORKER = "Ci::BuildFinishedWorker"
export const ASSIGN_RESOURCE_WORKER = "Ci::ResourceGroups::AssignResourceFromResourceGroupWorker"

export const TRANSITION_WORKERS = [PIPELINE_PROCESS_WORKER, BUILD_FINISHED_WORKER, ASSIGN_RESOURCE_WORKER] as const
export type TransitionWorker = typeof TRANSITION_WORKERS[number]

/**
 * Each worker's own queue, where GitLab sends it without routing rules: ApplicationWorker's
 * `queue_namespace` joined to the class name underscored without `Worker` (`base_queue_name`), as
 * `app/workers/all_queues.yml` lists them. All three are `queue_namespace :pipeline_processing`.
 */
export const WORKER_QUEUES: Readonly<Record<TransitionWorker, string>> = {
  [PIPELINE_PROCESS_WORKER]: "pipeline_processing:pipeline_process",
  [BUILD_FINISHED_WORKER]: "pipeline_processing:ci_build_finished",
  [ASSIGN_RESOURCE_WORKER]: "pipeline_processing:ci_resource_groups_assign_resource_from_resource_group"
}

/** `sidekiq_options retry: 3` of all three workers: Sidekiq reads it from the job itself. */
export const TRANSITION_JOB_RETRY = 3

/**
 * Where each worker's jobs go. GitLab routes every worker to `default` unless the operator wrote
 * routing rules (`config/settings.rb`, `build_sidekiq_routing_rules`: empty rules mean
 * `[['*', 'default']]`); a routing rule that names no queue keeps the worker's own.
 */
export type TransitionQueues = Readonly<Record<TransitionWorker, string>>

/** A default install: everything on `default`. */
export const DEFAULT_ROUTING: TransitionQueues = {
  [PIPELINE_PROCESS_WORKER]: "default",
  [BUILD_FINISHED_WORKER]: "default",
  [ASSIGN_RESOURCE_WORKER]: "default"
}

/**
 * `SWEEPER_TRANSITION_QUEUES`: `default` (GitLab's default routing), `worker` (each worker's own
 * queue: a GitLab whose routing rules leave these workers on their own queues), or a JSON object
 * naming the queue of some workers (the others on `default`, as GitLab's catch-all rule would).
 */
export const resolveTransitionQueues = (
  setting: "default" | "worker" | Readonly<Partial<Record<TransitionWorker, string>>>
): TransitionQueues =>
  setting === "default"
    ? DEFAULT_ROUTING
    : setting === "worker"
    ? WORKER_QUEUES
    : { ...DEFAULT_ROUTING, ...setting }

/** The queues the drops push to; the composition root provides them from configuration. */
export const CurrentTransitionQueues = Context.Reference<TransitionQueues>(
  "sweeper/domain/TransitionJobs/CurrentTransitionQueues",
  { defaultValue: () => DEFAULT_ROUTING }
)

/** `sweeper doctor`'s lines for the queues. */
export const describeTransitionQueues = (queues: TransitionQueues): ReadonlyArray<string> =>
  TRANSITION_WORKERS.map((worker) => `${worker} → queue:${queues[worker]}`)

/**
 * How long Redis remembers that a relay pushed a batch of the job outbox: a relay repeated within
 * this (a process killed between the push and the outbox's DELETE, restarted later) finds the
 * marker and pushes nothing. One key per page and queue, so a week of them is a few hundred keys.
 */
export const PUSHED_MARKER_TTL = Duration.days(7)

/**
 * A relay's claim on outbox rows: another relay (another replica, or this one after a failed push)
 * takes them over only after this. The push itself is refused by the marker either way, so a claim
 * only keeps two relays from doing the same work.
 */
export const OUTBOX_CLAIM_LEASE = Duration.seconds(60)

/** Outbox batches (one per page write) a relay round takes. */
export const RELAY_BATCHES = 50

/** The marker of one outbox batch pushed to one queue, in the slot of `queue:<queue>` (same Lua script). */
export const pushedMarkerKey = (queue: string, batch: string) => `sweeper:job_outbox:{queue:${queue}}:${batch}`
