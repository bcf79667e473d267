/**
 * The fixture factory: GitLab's own rows and keys, written the way GitLab writes
 * them, one function per thing. The scenarios compose these; end-to-end tests can call them directly.
 *
 * Times come from the caller (the scenario reads the Clock once per tick), and "stuck" is made by
 * back-dating, never by changing Sweeper's thresholds: a build stuck in `canceling` is one whose
 * `updated_at` is more than an hour old, exactly what GitLab would hold after an hour of waiting.
 * Targets the standalone schema (embedded, demos, tests) and `p_ci_builds` when it exists; GitLab's
 * own wider tables (NOT NULL organisation columns and the like) are not filled in.
 *
 * Builds are GitLab's ci tables: they are written and read through the ci database's client
 * (`ciClient`), so a decomposed GitLab (CI_DATABASE_URL, or the demo's second embedded database)
 * gets them where GitLab keeps them; everything else is main's.
 */
import { PgClient } from "@effect/sql-pg"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { workerKeys } from "../domain/ConcurrencyLimit.ts"
import { fieldOf, type Location, PENDING_DIRECT_UPLOADS_KEY } from "../domain/DirectUpload.ts"
import { ExportJobStatus } from "../domain/ExportJob.ts"
import type { RebalanceType } from "../domain/Rebalancing.ts"
import { newJid, queueKey, sidekiqJob } from "../domain/Sidekiq.ts"
import { EXPORT_JOB_STATUS_TTL } from "../domain/SidekiqStatus.ts"
import { CiDatabase } from "../layers/postgres/Databases.ts"
import { JobStatus } from "../services/JobStatus.ts"
import { RebalancingState } from "../services/RebalancingState.ts"
import { SimulatorObjects } from "./Objects.ts"
import { SimulatorStores } from "./Stores.ts"

/** `timestamp without time zone` holding UTC, as GitLab stores build times. */
const utcTimestamp = (millis: number) => new Date(millis).toISOString().replace("T", " ").replace("Z", "")
const instant = (millis: number) => new Date(millis).toISOString()

/**
 * The client of GitLab's ci database: CiDatabase's when the composition has one (every app
 * composition does; it is main's own client when ci is not separate), else the PgClient in context,
 * the one database of a test or benchmark that seeds builds beside its own client.
 */
export const ciClient: Effect.Effect<PgClient.PgClient, never, PgClient.PgClient> = Effect.gen(function*() {
  const ci = yield* Effect.serviceOption(CiDatabase)
  return Option.isSome(ci) ? ci.value.sql : yield* PgClient.PgClient
})

/** A group and a project in it; returns both ids (bigserial). */
export const seedProject = Effect.fn("Seed.project")(function*(name: string, namespaceId?: number) {
  const sql = yield* PgClient.PgClient
  const ns = namespaceId ??
    (yield* sql<
      { id: string }
    >`INSERT INTO namespaces (name, path, type) VALUES (${name}, ${name}, 'Group') RETURNING id`)[0]!.id
  const [project] = yield* sql<
    { id: string }
  >`INSERT INTO projects (namespace_id, name, path) VALUES (${ns}, ${name}, ${name}) RETURNING id`
  return { namespaceId: Number(ns), projectId: Number(project!.id) }
})

/**
 * A project export as GitLab runs one: the Sidekiq status key first (set when the job is pushed),
 * then the row naming its jid in `started`. `relations` makes it a parallel export (one
 * `project_relation_exports` row each). Returns the row id and jid.
 */
export const seedExportJob = Effect.fn("Seed.exportJob")(function*(options: {
  readonly projectId: number
  readonly createdAtMillis: number
  readonly relations?: ReadonlyArray<string>
  readonly status?: number
}) {
  const sql = yield* PgClient.PgClient
  const jobStatus = yield* JobStatus
  const jid = yield* newJid
  // Tracked before the row exists: a run between the two must see the job as running, not done.
  yield* jobStatus.track(jid, EXPORT_JOB_STATUS_TTL).pipe(Effect.orDie)
  const at = instant(options.createdAtMillis)
  const [row] = yield* sql<
    { id: string }
  >`INSERT INTO project_export_jobs (project_id, jid, status, user_id, created_at, updated_at)
    VALUES (${options.projectId}, ${jid}, ${
    options.status ?? ExportJobStatus.started
  }, 1, ${at}::timestamptz, ${at}::timestamptz) RETURNING id`
  const id = Number(row!.id)
  for (const relation of options.relations ?? []) {
    const relationJid = yield* newJid
    yield* sql`INSERT INTO project_relation_exports (project_export_job_id, project_id, relation, status, jid, created_at, updated_at)
      VALUES (${id}, ${options.projectId}, ${relation}, 1, ${relationJid}, ${at}::timestamptz, ${at}::timestamptz)`
  }
  return { id, jid }
})

/** The export worker finishes: status `finished`, then Sidekiq drops the status key. */
export const finishExportJob = Effect.fn("Seed.finishExportJob")(
  function*(job: { readonly id: number; readonly jid: string }) {
    const sql = yield* PgClient.PgClient
    yield* sql`UPDATE project_export_jobs SET status = ${ExportJobStatus.finished}, updated_at = now() WHERE id = ${job.id}`
    yield* (yield* JobStatus).untrack(job.jid).pipe(Effect.orDie)
  }
)

/** The export worker dies: the status key goes (expired or dropped), the row stays `started`. */
export const killExportJob = Effect.fn("Seed.killExportJob")(function*(job: { readonly jid: string }) {
  yield* (yield* JobStatus).untrack(job.jid).pipe(Effect.orDie)
})

/** Whether builds live in GitLab ≥ 16's partitioned `p_ci_builds` (asked of the ci database). */
export const buildsTable = Effect.fn("Seed.buildsTable")(function*() {
  const sql = yield* ciClient
  const [row] = yield* sql<{ found: boolean }>`SELECT to_regclass('p_ci_builds') IS NOT NULL AS found`
  return row!.found ? "p_ci_builds" as const : "ci_builds" as const
})

/** One `Ci::Build` in `status`, created and last updated `ageMillis` before `nowMillis`. */
export const seedBuild = Effect.fn("Seed.build")(function*(options: {
  readonly projectId: number
  readonly status: string
  readonly nowMillis: number
  readonly ageMillis: number
  /** How long ago it was last updated (a running build's trace); default its age. */
  readonly updatedAgeMillis?: number
  /** A delayed build's start time, as an age (negative: still to come); none by default. */
  readonly scheduledAgeMillis?: number
  /** Its pipeline (commit_id); GitLab's every build has one. Default 1, a pipeline no one plays. */
  readonly pipelineId?: number
  readonly table: "ci_builds" | "p_ci_builds"
}) {
  const sql = yield* ciClient
  const at = utcTimestamp(options.nowMillis - options.ageMillis)
  const updated = utcTimestamp(options.nowMillis - (options.updatedAgeMillis ?? options.ageMillis))
  const started = utcTimestamp(options.nowMillis - options.ageMillis - 60_000)
  const scheduled = options.scheduledAgeMillis === undefined
    ? null
    : new Date(options.nowMillis - options.scheduledAgeMillis).toISOString()
  const [row] = options.table === "p_ci_builds"
    ? yield* sql<
      { id: string }
    >`INSERT INTO p_ci_builds (partition_id, project_id, commit_id, name, status, runner_id, created_at, updated_at,
        started_at, scheduled_at)
        VALUES (100, ${options.projectId}, ${
      options.pipelineId ?? 1
    }, 'rspec', ${options.status}, 7, ${at}::timestamp, ${updated}::timestamp,
          ${started}::timestamp, ${scheduled}::timestamptz) RETURNING id`
    : yield* sql<
      { id: string }
    >`INSERT INTO ci_builds (project_id, commit_id, name, status, runner_id, created_at, updated_at, started_at,
        scheduled_at)
        VALUES (${options.projectId}, ${
      options.pipelineId ?? 1
    }, 'rspec', ${options.status}, 7, ${at}::timestamp, ${updated}::timestamp,
          ${started}::timestamp, ${scheduled}::timestamptz) RETURNING id`
  return Number(row!.id)
})

/**
 * A direct upload that was prepared at `preparedAtMillis` and never finished: its object in the
 * location's store (local directory, S3 bucket or Azure container, when one is configured) and its
 * `pending_direct_uploads` field. Returns the field and where the object went, if anywhere.
 */
export const seedPendingUpload = Effect.fn("Seed.pendingUpload")(function*(options: {
  readonly location: Location
  readonly path: string
  readonly preparedAtMillis: number
}) {
  const stores = yield* SimulatorStores
  const object = yield* (yield* SimulatorObjects).put(options.location, options.path)
  const field = fieldOf(options.location, options.path)
  yield* stores.hset("sharedState", PENDING_DIRECT_UPLOADS_KEY, {
    [field]: String(Math.floor(options.preparedAtMillis / 1000))
  })
  return { field, object }
})

/** `count` issues of a project with the positions a busy project ends up with: gaps, ties, nulls. */
export const seedIssues = Effect.fn("Seed.issues")(function*(projectId: number, count: number) {
  const sql = yield* PgClient.PgClient
  for (let i = 0; i < count; i++) {
    const position = i % 4 === 0 ? null : i % 3 === 0 ? 500 : 1000 * (count - i)
    yield* sql`INSERT INTO issues (project_id, title, relative_position) VALUES (${projectId}, ${`Issue ${
      i + 1
    }`}, ${position})`
  }
})

/** A rebalancer that started (SADD, 10-day expiry) and died before finishing. */
export const stallRebalance = Effect.fn("Seed.stallRebalance")(function*(type: RebalanceType, id: number) {
  yield* (yield* RebalancingState).track(type, id).pipe(Effect.orDie)
})

/** A Sidekiq client push of a job: what GitLab does for every `perform_async`. */
export const pushJob = Effect.fn("Seed.pushJob")(function*(options: {
  readonly workerClass: string
  readonly args: ReadonlyArray<unknown>
  readonly queue: string
  readonly nowMillis: number
}) {
  const stores = yield* SimulatorStores
  const job = sidekiqJob({ ...options, jid: yield* newJid })
  yield* stores.lpush("queues", queueKey(options.queue), JSON.stringify(job))
  return job
})

/** GitLab's throttling middleware deferring a job: RPUSH `{args, context, buffered_at}`. */
export const deferJob = Effect.fn("Seed.deferJob")(
  function*(worker: string, args: ReadonlyArray<unknown>, nowMillis: number) {
    const stores = yield* SimulatorStores
    yield* stores.rpush(
      "sharedState",
      workerKeys(worker).deferred,
      JSON.stringify({
        args,
        context: { "meta.caller_id": "Simulator", "meta.feature_category": "release_evidence" },
        buffered_at: nowMillis / 1000
      })
    )
  }
)

/** Ages used by the scenarios: past each batch's threshold with margin, and well inside it. */
export const AGES = {
  /** Builds: 1 h `TIMEOUT` → two hours in `canceling` is stuck, ten minutes is not. */
  stuckBuild: Duration.hours(2),
  recentBuild: Duration.minutes(10),
  /** Pending builds: a day → two days pending is outdated whatever the runners. */
  outdatedPendingBuild: Duration.days(2),
  /** Uploads: 3 h → four hours pending is stale, ten minutes is fresh. */
  staleUpload: Duration.hours(4),
  freshUpload: Duration.minutes(10),
  /** Parallel exports: 6 h grace → seven hours old is past it. */
  oldParallelExport: Duration.hours(7)
} as const
