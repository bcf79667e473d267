/**
 * Pipelines as the simulated GitLab keeps them, and a stand-in for GitLab's pipeline processing:
 * the pipeline row (ci_pipelines, or p_ci_pipelines beside p_ci_builds), the runner-queue rows a
 * build gets when it becomes pending (ci_pending_builds) or running (ci_running_builds and its runner
 * session), and `processPipeline`, what `PipelineProcessWorker [pipeline_id]` does in GitLab for a
 * pipeline whose jobs were dropped: the status of its latest builds composed as GitLab composes it
 * (`Gitlab::Ci::Status::Composite`), written to the pipeline with its finish time, and the builds
 * marked processed. Stages, needs, hooks and notifications are GitLab's and not played here; this
 * is enough for the demo to show a dropped build's pipeline finishing.
 */
import * as Effect from "effect/Effect"
import { ciClient } from "./Seed.ts"

/** `timestamp without time zone` holding UTC, as GitLab stores pipeline and build times. */
const utcTimestamp = (millis: number) => new Date(millis).toISOString().replace("T", " ").replace("Z", "")

/** The pipelines table beside `builds`: GitLab partitions both alike. */
export const pipelinesTableOf = (builds: "ci_builds" | "p_ci_builds") =>
  builds === "p_ci_builds" ? "p_ci_pipelines" as const : "ci_pipelines" as const

/** Which of GitLab's queue tables the ci database has (a drop's side effects touch only these). */
export const queueTables = Effect.fn("Pipelines.queueTables")(function*() {
  const sql = yield* ciClient
  const [row] = yield* sql<{ pending: boolean; running: boolean; sessions: boolean; pipelines: boolean }>`
    SELECT to_regclass('ci_pending_builds') IS NOT NULL AS pending,
      to_regclass('ci_running_builds') IS NOT NULL AS running,
      to_regclass('ci_builds_runner_session') IS NOT NULL AS sessions,
      to_regclass('ci_pipelines') IS NOT NULL OR to_regclass('p_ci_pipelines') IS NOT NULL AS pipelines`
  return row!
})

/** A pipeline of `projectId` started at `nowMillis`, `running`; returns its id. */
export const seedPipeline = Effect.fn("Pipelines.seed")(function*(options: {
  readonly projectId: number
  readonly nowMillis: number
  readonly builds: "ci_builds" | "p_ci_builds"
}) {
  const sql = yield* ciClient
  const at = utcTimestamp(options.nowMillis)
  const [row] = options.builds === "p_ci_builds"
    ? yield* sql<{ id: string }>`INSERT INTO p_ci_pipelines (id, partition_id, project_id, ref, sha, status,
        lock_version, created_at, updated_at, started_at)
        VALUES (nextval('ci_pipelines_id_seq'), 100, ${options.projectId}, 'main', 'simulated', 'running', 0,
          ${at}::timestamp, ${at}::timestamp, ${at}::timestamp) RETURNING id`
    : yield* sql<{ id: string }>`INSERT INTO ci_pipelines (project_id, ref, sha, status, created_at, updated_at,
        started_at) VALUES (${options.projectId}, 'main', 'simulated', 'running', ${at}::timestamp, ${at}::timestamp,
        ${at}::timestamp) RETURNING id`
  return Number(row!.id)
})

/** What GitLab writes when a build becomes pending: its row in the runner queue. */
export const enqueueBuild = Effect.fn("Pipelines.enqueueBuild")(function*(buildId: number, projectId: number) {
  const sql = yield* ciClient
  yield* sql`INSERT INTO ci_pending_builds (build_id, project_id, partition_id) VALUES (${buildId}, ${projectId}, 100)`
})

/** What GitLab writes when a runner starts a build: its running-build row and the runner's session. */
export const trackRunning = Effect.fn("Pipelines.trackRunning")(
  function*(buildId: number, projectId: number, runnerId: number) {
    const sql = yield* ciClient
    yield* sql`INSERT INTO ci_running_builds (build_id, project_id, runner_id, runner_type, partition_id)
      VALUES (${buildId}, ${projectId}, ${runnerId}, 1, 100)`
    yield* sql`INSERT INTO ci_builds_runner_session (build_id, partition_id, project_id, url)
      VALUES (${buildId}, 100, ${projectId}, ${`https://runner.simulated/session/${buildId}`})`
  }
)

/**
 * GitLab's composite status of a set of job statuses (`Gitlab::Ci::Status::Composite`, allow_failure
 * left out): the first rule that holds, in GitLab's order; no job at all is success.
 */
export const compositeStatus = (statuses: ReadonlyArray<string>): string => {
  const set = new Set(statuses)
  const only = (...allowed: ReadonlyArray<string>) => [...set].every((s) => allowed.includes(s))
  const any = (...wanted: ReadonlyArray<string>) => wanted.some((s) => set.has(s))
  if (set.size === 0) return "success"
  if (only("skipped")) return "skipped"
  if (only("success", "skipped")) return "success"
  if (only("created")) return "created"
  if (only("preparing")) return "preparing"
  if (only("canceled", "success", "skipped")) return "canceled"
  if (only("pending", "created", "skipped")) return "pending"
  if (any("running", "pending")) return "running"
  if (any("waiting_for_resource")) return "waiting_for_resource"
  if (any("waiting_for_callback")) return "waiting_for_callback"
  if (any("manual")) return "manual"
  if (any("scheduled")) return "scheduled"
  if (any("preparing")) return "preparing"
  if (any("created")) return "running"
  if (any("canceling")) return "canceling"
  return "failed"
}

const COMPLETED = ["success", "failed", "canceled", "skipped"]

/**
 * The stand-in for `PipelineProcessWorker [pipeline_id]`: the pipeline's status composed from its
 * latest builds (`retried` not true), written with finished_at once complete, and those builds
 * marked processed. Returns the pipeline's status before and after and whether this call changed it,
 * or null when it does not exist.
 */
export const processPipeline = Effect.fn("Pipelines.process")(function*(
  pipelineId: number,
  nowMillis: number,
  builds: "ci_builds" | "p_ci_builds"
) {
  const sql = yield* ciClient
  const pipelines = pipelinesTableOf(builds)
  const [pipeline] = yield* sql<{ status: string | null }>`SELECT status FROM ${sql(pipelines)}
    WHERE id = ${pipelineId}`
  if (pipeline === undefined) return null
  const latest = yield* sql<{ status: string }>`SELECT status FROM ${sql(builds)}
    WHERE commit_id = ${pipelineId} AND retried IS NOT TRUE`
  const status = compositeStatus(latest.map((row) => row.status))
  const at = utcTimestamp(nowMillis)
  const finished = COMPLETED.includes(status) ? sql`coalesce(finished_at, ${at}::timestamp)` : sql`NULL`
  // Only a status that changes is written (GitLab's set_status is a no-op on the same status), so of
  // two workers processing one pipeline at once, one changes it.
  const changed = yield* sql`UPDATE ${sql(pipelines)} SET status = ${status}, finished_at = ${finished},
    updated_at = ${at}::timestamp, lock_version = lock_version + 1
    WHERE id = ${pipelineId} AND status IS DISTINCT FROM ${status} RETURNING 1`
  yield* sql`UPDATE ${sql(builds)} SET processed = true WHERE commit_id = ${pipelineId} AND retried IS NOT TRUE`
  return { from: pipeline.status ?? "created", to: status, changed: changed.length > 0 }
})
