/**
 * A drop beside GitLab, on GitLab's own DDL (p_ci_builds and p_ci_pipelines with two partitions, and
 * the older plain ci_builds / ci_pipelines; ci_pending_builds, ci_running_builds, the runner
 * sessions and resource groups as GitLab's db/structure.sql has them): what GitLab's `drop!`
 * transition does beyond the row happens in the drop's own statement (processed, the queue rows,
 * the runner session, the resource), and the after-commit jobs are relayed to Sidekiq exactly once
 * in GitLab's wire format (PipelineProcessWorker per pipeline of a page, Ci::BuildFinishedWorker per
 * build, AssignResourceFromResourceGroupWorker per resource group), also when a page is retried and
 * when a relay dies between its push and its DELETE. `doom` is GitLab's `doom!`: both queue rows,
 * nothing else. Builds not dropped, their rows in the side tables, and every pipeline stay as
 * they were.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { DateTime, Effect, Layer, Option, Redacted } from "effect"
import type { SqlClient } from "effect/sql"
import { CurrentRun } from "../../src/domain/Batch.ts"
import { queueKey, type SidekiqJob } from "../../src/domain/Sidekiq.ts"
import { CurrentFailureReasonSet, type FailureReasonSet } from "../../src/domain/StuckBuilds.ts"
import { CurrentTransitionQueues, type TransitionQueues, WORKER_QUEUES } from "../../src/domain/TransitionJobs.ts"
import { BuildsSql } from "../../src/layers/postgres/BuildsSql.ts"
import { EventLogSql } from "../../src/layers/postgres/EventLogSql.ts"
import { relayJobOutbox } from "../../src/layers/postgres/JobOutbox.ts"
import { migrate } from "../../src/layers/postgres/Migrations.ts"
import { layerServer } from "../../src/layers/postgres/Postgres.ts"
import { StuckBuildsSql } from "../../src/layers/postgres/StuckBuildsSql.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { JobQueueRedis } from "../../src/layers/redis/JobQueueRedis.ts"
import { Redis } from "../../src/layers/redis/Redis.ts"
import { RunnerAckQueueRedis } from "../../src/layers/redis/RunnerAckQueueRedis.ts"
import { DropCancelingBuilds } from "../../src/programs/DropCancelingBuilds.ts"
import { DropPendingBuilds } from "../../src/programs/DropPendingBuilds.ts"
import { DropRunningBuilds } from "../../src/programs/DropRunningBuilds.ts"
import { DropScheduledBuilds } from "../../src/programs/DropScheduledBuilds.ts"
import { Builds } from "../../src/services/Builds.ts"
import { JobQueue } from "../../src/services/JobQueue.ts"
import { at } from "../support/clock.ts"
import { createGitLabSchema, type GitLabLayout } from "../support/gitlabSchema.ts"
import { freshDatabase } from "../support/postgres.ts"
import { RedisTest } from "../support/redis.ts"

const NOW = "2026-01-02T05:00:00Z"

type Env =
  | PgClient.PgClient
  | SqlClient.SqlClient
  | Builds
  | JobQueue
  | Redis
  | Layer.Success<typeof StuckBuildsSql>
  | Layer.Success<typeof MetricsPrometheus>
  | Layer.Success<typeof RunnerAckQueueRedis>

/**
 * A fresh database with GitLab's layout (no runners: no runner is online), migrated in gitlab mode;
 * without a layout, Sweeper's own standalone schema (migration 0009's side tables).
 */
const onGitLab = <A, E>(layout: GitLabLayout | "standalone", effect: Effect.Effect<A, E, Env>) =>
  Effect.scoped(Effect.gen(function*() {
    const { url } = yield* freshDatabase
    const base = layerServer(Redacted.make(url))
    yield* Effect.gen(function*() {
      if (layout !== "standalone") yield* createGitLabSchema(layout)
      yield* migrate
    }).pipe(Effect.provide(base))
    const redis = RedisTest
    return yield* effect.pipe(
      Effect.provide(
        Layer.mergeAll(
          StuckBuildsSql,
          BuildsSql,
          MetricsPrometheus,
          RunnerAckQueueRedis,
          JobQueueRedis
        ).pipe(
          Layer.provideMerge(EventLogSql),
          Layer.provideMerge(Layer.merge(base, redis))
        )
      )
    )
  }))

const asRun =
  (batch: string, reasons: FailureReasonSet, queues?: TransitionQueues) => <A, E, R>(effect: Effect.Effect<A, E, R>) =>
    effect.pipe(
      at(NOW),
      Effect.provideService(CurrentFailureReasonSet, reasons),
      queues === undefined ? (e) => e : Effect.provideService(CurrentTransitionQueues, queues),
      Effect.provideService(CurrentRun, {
        runId: null,
        batch,
        dryRun: false,
        budget: Option.none(),
        fence: Option.none()
      })
    )

const tablesOf = (partitioned: boolean) =>
  partitioned
    ? { builds: "p_ci_builds", pipelines: "p_ci_pipelines" }
    : { builds: "ci_builds", pipelines: "ci_pipelines" }

interface BuildSeed {
  readonly id: number
  readonly pipeline: number
  readonly status: string
  readonly created: string
  readonly updated?: string
  readonly scheduled?: string
  readonly runner?: number
  readonly retried?: boolean
  readonly resourceGroup?: number
}

/** Odd ids in partition 101 on p_ci_builds (so every effect crosses partitions), else 100. */
const partitionOf = (partitioned: boolean, id: number) => partitioned && id % 2 === 1 ? 101 : 100

/**
 * Pipelines 500–505, all running; builds in them; the queue rows, runner sessions and resources
 * GitLab would have for them (one resource per resource group, held by its build).
 */
const seed = (partitioned: boolean, builds: ReadonlyArray<BuildSeed>, queued: {
  readonly pending: ReadonlyArray<number>
  readonly running: ReadonlyArray<number>
}) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const t = tablesOf(partitioned)
    for (const pipeline of [500, 501, 502, 503, 504, 505]) {
      yield* sql`INSERT INTO ${sql(t.pipelines)} (id, partition_id, project_id, status, lock_version, ref, sha,
        created_at, updated_at)
        VALUES (${pipeline}, ${partitionOf(partitioned, pipeline)}, 10, 'running', 0, 'main', 'abc',
          '2026-01-01 00:00:00', '2026-01-01 00:00:00')`
    }
    for (const b of builds) {
      const partition = partitionOf(partitioned, b.id)
      yield* sql`INSERT INTO ${sql(t.builds)} (id, partition_id, project_id, commit_id, type, status, created_at,
        updated_at, scheduled_at, lock_version, runner_id, retried, resource_group_id)
        VALUES (${b.id}, ${partition}, 10, ${b.pipeline}, 'Ci::Build', ${b.status}, ${b.created}::timestamp,
          ${b.updated ?? b.created}::timestamp, ${b.scheduled ?? null}::timestamptz, 0, ${b.runner ?? null},
          ${b.retried ?? null}, ${b.resourceGroup ?? null})`
      if (b.resourceGroup !== undefined) {
        yield* sql`INSERT INTO ci_resource_groups (id, project_id, key, created_at, updated_at)
          VALUES (${b.resourceGroup}, 10, ${`production-${b.resourceGroup}`}, now(), now())`
        yield* sql`INSERT INTO ci_resources (id, resource_group_id, build_id, partition_id, project_id, created_at,
          updated_at) VALUES (${b.resourceGroup * 10}, ${b.resourceGroup}, ${b.id}, ${partition}, 10, now(), now())`
      }
    }
    for (const id of queued.pending) {
      yield* sql`INSERT INTO ci_pending_builds (build_id, project_id, partition_id)
        VALUES (${id}, 10, ${partitionOf(partitioned, id)})`
    }
    for (const id of queued.running) {
      yield* sql`INSERT INTO ci_running_builds (build_id, project_id, runner_id, runner_type, partition_id)
        VALUES (${id}, 10, 2, 3, ${partitionOf(partitioned, id)})`
      yield* sql`INSERT INTO ci_builds_runner_session (build_id, partition_id, project_id, url)
        VALUES (${id}, ${partitionOf(partitioned, id)}, 10, ${`https://runner/${id}`})`
    }
  })

/** Every stuck rule's case, two pipelines' worth of builds that are not stuck, a retried stuck build. */
const BUILDS: ReadonlyArray<BuildSeed> = [
  // canceling an hour: drop-canceling (its running row and session went when it left running).
  { id: 1, pipeline: 500, status: "canceling", created: "2026-01-02 03:59:00", runner: 2, resourceGroup: 70 },
  // pending an hour, no runner online: drop-pending's stuck rule; it leaves the runner queue.
  { id: 2, pipeline: 501, status: "pending", created: "2026-01-02 03:59:00" },
  // running without an update for an hour: drop-running; it leaves ci_running_builds and its session.
  { id: 3, pipeline: 502, status: "running", created: "2026-01-02 03:59:00", runner: 2, resourceGroup: 71 },
  { id: 8, pipeline: 502, status: "running", created: "2026-01-02 03:58:00", runner: 2 },
  // scheduled an hour ago: drop-scheduled; scheduled_at cleared as GitLab's before_transition does.
  { id: 4, pipeline: 503, status: "scheduled", created: "2026-01-01 00:00:00", scheduled: "2026-01-02T03:59:00Z" },
  // Not stuck: left exactly as they are, with their queue rows, session and resource.
  { id: 5, pipeline: 504, status: "pending", created: "2026-01-02 04:30:00" },
  { id: 6, pipeline: 504, status: "running", created: "2026-01-02 04:30:00", runner: 2, resourceGroup: 72 },
  // A retried copy stuck in canceling: dropped, processed = true, and no PipelineProcessWorker for it.
  { id: 7, pipeline: 505, status: "canceling", created: "2026-01-02 03:00:00", retried: true }
]
const QUEUED = { pending: [2, 5], running: [3, 6, 8] }

/** The rows of everything that must not change: builds 5 and 6, all pipelines, 5's and 6's side rows. */
const untouched = (partitioned: boolean) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const t = tablesOf(partitioned)
    return {
      builds: yield* sql`SELECT to_jsonb(b) AS row FROM ${sql(t.builds)} b WHERE id IN (5, 6) ORDER BY id`,
      pipelines: yield* sql`SELECT to_jsonb(p) AS row FROM ${sql(t.pipelines)} p ORDER BY id`,
      pending: yield* sql`SELECT to_jsonb(q) AS row FROM ci_pending_builds q WHERE build_id = 5`,
      running: yield* sql`SELECT to_jsonb(q) AS row FROM ci_running_builds q WHERE build_id = 6`,
      sessions: yield* sql`SELECT to_jsonb(s) AS row FROM ci_builds_runner_session s WHERE build_id = 6`,
      resources: yield* sql`SELECT to_jsonb(r) AS row FROM ci_resources r WHERE resource_group_id = 72`
    }
  })

const runAll = (reasons: FailureReasonSet, queues?: TransitionQueues) =>
  Effect.gen(function*() {
    const canceling = yield* DropCancelingBuilds.run.pipe(asRun("drop-canceling-builds", reasons, queues))
    const pending = yield* DropPendingBuilds.run.pipe(asRun("drop-pending-builds", reasons, queues))
    const running = yield* DropRunningBuilds.run.pipe(asRun("drop-running-builds", reasons, queues))
    const scheduled = yield* DropScheduledBuilds.run.pipe(asRun("drop-scheduled-builds", reasons, queues))
    return [canceling.dropped, pending.dropped, running.dropped, scheduled.dropped]
  })

/** The job outbox (both tables) as (worker, queue, args) lines, sorted. */
const outbox = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  const rows = yield* sql<{ worker: string; queue: string; args: ReadonlyArray<number> }>`
    SELECT r->>'worker' AS worker, r->>'queue' AS queue, a AS args
    FROM sweeper_job_outbox_batches o, jsonb_array_elements(o.jobs) r, jsonb_array_elements(r->'args') a
    UNION ALL SELECT worker, queue, args FROM sweeper_job_outbox`
  return rows.map((row) => `${row.worker} ${row.queue} ${JSON.stringify(row.args)}`).toSorted()
})

const EXPECTED_JOBS = (queue: (worker: string) => string) =>
  [
    ...[500, 501, 502, 503].map((p) => `PipelineProcessWorker ${queue("PipelineProcessWorker")} [${p}]`),
    ...[1, 2, 3, 4, 7, 8].map((b) => `Ci::BuildFinishedWorker ${queue("Ci::BuildFinishedWorker")} [${b}]`),
    ...[70, 71].map((g) =>
      `Ci::ResourceGroups::AssignResourceFromResourceGroupWorker ${
        queue("Ci::ResourceGroups::AssignResourceFromResourceGroupWorker")
      } [${g}]`
    )
  ].toSorted()

/** Every job in `queue:<queue>`, parsed. */
const queued = (queue: string) =>
  Effect.flatMap(Redis, (redis) =>
    Effect.map(
      Effect.orDie(redis.use("test.lrange", (client) => client.lrange(queueKey(queue), 0, -1))),
      (raw) => raw.map((payload) => JSON.parse(payload) as SidekiqJob)
    ))

const relayOnce = (relayer = "00000000-0000-4000-8000-000000000001") =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    return yield* relayJobOutbox(sql, yield* JobQueue, relayer)
  })

describe("A drop does what GitLab's transition does, beside GitLab's schema", () => {
  for (const partitioned of [true, false]) {
    const t = tablesOf(partitioned)
    for (const reasons of ["legacy", "gitlab-19"] as const) {
      it.live(`side tables and the after-commit jobs (${t.builds}, ${reasons} reasons)`, () =>
        onGitLab(
          { partitioned },
          Effect.gen(function*() {
            const sql = yield* PgClient.PgClient
            yield* seed(partitioned, BUILDS, QUEUED)
            const before = yield* untouched(partitioned)
            assert.deepStrictEqual(yield* runAll(reasons), [2, 1, 2, 1])

            // The rows: how each ended, processed as GitLab's before_save sets it, scheduled_at cleared.
            const rows = yield* sql<{
              id: string
              status: string
              failure_reason: number | null
              processed: boolean | null
              scheduled_at: Date | null
            }>`SELECT id::text, status, failure_reason, processed, scheduled_at FROM ${sql(t.builds)} ORDER BY id`
            const ended = Object.fromEntries(rows.map((r) => [r.id, [r.status, r.failure_reason, r.processed]]))
            const legacy = reasons === "legacy"
            assert.deepStrictEqual(ended, {
              1: legacy ? ["failed", 3, false] : ["canceled", null, false],
              2: ["failed", legacy ? 3 : 26, false],
              3: ["failed", legacy ? 3 : 27, false],
              4: ["failed", 7, false],
              5: ["pending", null, null],
              6: ["running", null, null],
              7: legacy ? ["failed", 3, true] : ["canceled", null, true],
              8: ["failed", legacy ? 3 : 27, false]
            })
            assert.isNull(rows.find((r) => r.id === "4")!.scheduled_at)

            // The side tables: only the dropped builds' rows went; resources of dropped builds freed.
            const ids = (found: ReadonlyArray<{ build_id: string | null }>) => found.map((r) => r.build_id)
            assert.deepStrictEqual(
              ids(yield* sql<{ build_id: string }>`SELECT build_id::text FROM ci_pending_builds ORDER BY build_id`),
              [
                "5"
              ]
            )
            assert.deepStrictEqual(
              ids(yield* sql<{ build_id: string }>`SELECT build_id::text FROM ci_running_builds ORDER BY build_id`),
              [
                "6"
              ]
            )
            assert.deepStrictEqual(
              ids(
                yield* sql<{ build_id: string }>`SELECT build_id::text FROM ci_builds_runner_session ORDER BY build_id`
              ),
              ["6"]
            )
            assert.deepStrictEqual(
              yield* sql`SELECT resource_group_id::int AS g, build_id::int AS b, partition_id::int AS p
                FROM ci_resources ORDER BY resource_group_id`,
              [{ g: 70, b: null, p: null }, { g: 71, b: null, p: null }, {
                g: 72,
                b: 6,
                p: partitionOf(partitioned, 6)
              }]
            )
            // Builds not dropped, their side rows and every pipeline: byte for byte as before.
            assert.deepStrictEqual(yield* untouched(partitioned), before)

            // The jobs GitLab pushes after commit, in the outbox until relayed: one per pipeline of a
            // page (500 once for builds 3 and 8; none for the retried build's 505), one per build,
            // one per resource group.
            assert.deepStrictEqual(yield* outbox, EXPECTED_JOBS(() => "default"))
            // The run page's pipelines: each dropped build's event names its pipeline.
            const events = yield* sql<{ data: { id: number; pipeline_id?: number; status?: string } }>`
              SELECT data FROM sweeper_events WHERE type = 'BuildDropped' ORDER BY (data->>'id')::int`
            assert.deepStrictEqual(
              events.map((e) => [e.data.id, e.data.pipeline_id, e.data.status]),
              [[1, 500], [2, 501], [3, 502], [4, 503], [7, 505], [8, 502]].map(([id, pipeline]) => [
                id,
                pipeline,
                !legacy && (id === 1 || id === 7) ? "canceled" : undefined
              ])
            )

            // Relayed in GitLab's wire format, then relayed again: nothing more.
            assert.strictEqual(yield* relayOnce(), 12)
            const jobs = yield* queued("default")
            assert.deepStrictEqual(
              jobs.map((job) => `${job.class} ${job.queue} ${JSON.stringify(job.args)}`).toSorted(),
              EXPECTED_JOBS(() => "default")
            )
            for (const job of jobs) {
              assert.match(job.jid, /^[0-9a-f]{24}$/)
              assert.strictEqual(job.retry, 3)
              assert.isAtMost(job.created_at, job.enqueued_at)
            }
            assert.deepStrictEqual(yield* outbox, [])
            assert.strictEqual(yield* relayOnce(), 0)
            assert.lengthOf(yield* queued("default"), 12)
          })
        ), 120_000)
    }
  }

  it.live("each worker on its own queue when routing says so (SWEEPER_TRANSITION_QUEUES=worker)", () =>
    onGitLab(
      { partitioned: true },
      Effect.gen(function*() {
        yield* seed(true, BUILDS, QUEUED)
        yield* runAll("legacy", WORKER_QUEUES)
        const own = (worker: string) => WORKER_QUEUES[worker as keyof typeof WORKER_QUEUES]
        assert.deepStrictEqual(yield* outbox, EXPECTED_JOBS(own))
        yield* relayOnce()
        assert.deepStrictEqual(
          (yield* queued("pipeline_processing:ci_build_finished")).map((j) => j.args[0]).toSorted(),
          [1, 2, 3, 4, 7, 8]
        )
        assert.lengthOf(yield* queued("pipeline_processing:pipeline_process"), 4)
        assert.lengthOf(yield* queued("pipeline_processing:ci_resource_groups_assign_resource_from_resource_group"), 2)
        assert.lengthOf(yield* queued("default"), 0)
      })
    ), 120_000)

  it.live(
    "a page's jobs are one outbox row, each pushed once, in the page's order: pipelines, builds, groups",
    () =>
      onGitLab(
        { partitioned: true },
        Effect.gen(function*() {
          const sql = yield* PgClient.PgClient
          yield* seed(true, BUILDS, QUEUED)
          assert.deepStrictEqual(yield* runAll("legacy"), [2, 1, 2, 1])
          // One row per page written (each run here drops one page), its jobs counted; no row per job.
          const rows = yield* sql<{ size: number }>`SELECT size FROM sweeper_job_outbox_batches ORDER BY id`
          assert.deepStrictEqual(rows.map((row) => row.size), [4, 2, 4, 2])
          assert.lengthOf(yield* sql`SELECT FROM sweeper_job_outbox`, 0)
          assert.strictEqual(yield* relayOnce(), 12)
          assert.strictEqual(yield* relayOnce(), 0)
          assert.lengthOf(yield* sql`SELECT FROM sweeper_job_outbox_batches`, 0)
          // LPUSHed, and Sidekiq takes from the tail: the list reversed is the order they run in.
          const short: Record<string, string> = {
            PipelineProcessWorker: "pipeline",
            "Ci::BuildFinishedWorker": "build",
            "Ci::ResourceGroups::AssignResourceFromResourceGroupWorker": "group"
          }
          assert.deepStrictEqual(
            (yield* queued("default")).toReversed().map((job) => `${short[job.class]} ${job.args}`),
            [
              "pipeline 500",
              "build 1",
              "build 7",
              "group 70",
              "pipeline 501",
              "build 2",
              "pipeline 502",
              "build 3",
              "build 8",
              "group 71",
              "pipeline 503",
              "build 4"
            ]
          )
        })
      ),
    120_000
  )

  for (const partitioned of [true, false]) {
    const t = tablesOf(partitioned)
    it.live(`doom is GitLab's doom!: both queue rows deleted, nothing else (${t.builds})`, () =>
      onGitLab(
        { partitioned },
        Effect.gen(function*() {
          const sql = yield* PgClient.PgClient
          const builds = yield* Builds
          // A canceling build whose queue rows outlived its transitions (zombies), with a session and
          // a resource: and one whose finished_at is already set (doom! keeps it).
          yield* seed(partitioned, [
            { id: 1, pipeline: 500, status: "canceling", created: "2026-01-02 03:00:00", resourceGroup: 70 },
            { id: 3, pipeline: 501, status: "canceling", created: "2026-01-02 03:00:00" }
          ], { pending: [1], running: [1, 3] })
          yield* sql`UPDATE ${sql(t.builds)} SET finished_at = '2026-01-02 03:30:00' WHERE id = 3`
          for (const id of [1, 3]) {
            const build = Option.getOrThrow(
              yield* builds.find({ id, partitionId: partitioned ? partitionOf(true, id) : undefined })
            )
            assert.isTrue(
              yield* builds.doom(build, DateTime.makeUnsafe(NOW)).pipe(asRun("drop-canceling-builds", "legacy"))
            )
          }
          const rows = yield* sql<
            { id: string; status: string; failure_reason: number; processed: boolean | null; finished_at: Date }
          >`
            SELECT id::text, status, failure_reason, processed, finished_at FROM ${sql(t.builds)} ORDER BY id`
          assert.deepStrictEqual(rows.map((r) => [r.id, r.status, r.failure_reason, r.processed]), [
            ["1", "failed", 12, null],
            ["3", "failed", 12, null]
          ])
          assert.strictEqual(rows[0]!.finished_at.toISOString(), "2026-01-02T05:00:00.000Z")
          assert.strictEqual(rows[1]!.finished_at.toISOString(), "2026-01-02T03:30:00.000Z")
          assert.lengthOf(yield* sql`SELECT FROM ci_pending_builds`, 0)
          assert.lengthOf(yield* sql`SELECT FROM ci_running_builds`, 0)
          // No callbacks: the session stays, the resource stays held, no job is owed.
          assert.lengthOf(yield* sql`SELECT FROM ci_builds_runner_session`, 2)
          assert.deepStrictEqual(yield* sql`SELECT build_id::int AS b FROM ci_resources`, [{ b: 1 }])
          assert.deepStrictEqual(yield* outbox, [])
        })
      ), 120_000)
  }

  it.live("a page retried after its commit pushes Ci::BuildFinishedWorker once per build", () =>
    onGitLab(
      { partitioned: true },
      Effect.gen(function*() {
        const builds = yield* Builds
        yield* seed(true, BUILDS.filter((b) => b.status === "canceling"), { pending: [], running: [] })
        const page = yield* builds.findStuckCanceling({
          cutoff: DateTime.makeUnsafe("2026-01-02T04:00:00Z"),
          after: Option.none(),
          limit: 100
        }).pipe(asRun("drop-canceling-builds", "legacy"))
        const first = yield* builds.dropMany(page, DateTime.makeUnsafe(NOW)).pipe(
          asRun("drop-canceling-builds", "legacy")
        )
        // The same page again, as a run that lost the first statement's answer would send it.
        const again = yield* builds.dropMany(page, DateTime.makeUnsafe(NOW)).pipe(
          asRun("drop-canceling-builds", "legacy")
        )
        assert.deepStrictEqual([first.dropped.length, again.dropped.length], [2, 0])
        yield* relayOnce()
        yield* relayOnce()
        const finished = (yield* queued("default")).filter((job) => job.class === "Ci::BuildFinishedWorker")
        assert.deepStrictEqual(finished.map((job) => job.args[0]).toSorted(), [1, 7])
      })
    ), 120_000)

  it.live(
    "a relay round ends with a claim that took fewer than a round's batches: no empty claim after it",
    () =>
      onGitLab(
        { partitioned: false },
        Effect.gen(function*() {
          const sql = yield* PgClient.PgClient
          const queue = yield* JobQueue
          yield* seed(false, BUILDS, QUEUED)
          yield* runAll("legacy")
          // A batch committed while the relay pushes: the relay that claimed the others had taken
          // every claimable batch, so it stops; the new batch waits for the wake its drop sends.
          let pushes = 0
          const late = "00000000-0000-4000-8000-0000000000ff"
          const committing: JobQueue["Service"] = {
            ...queue,
            pushOnce: (request) =>
              Effect.tap(
                queue.pushOnce(request),
                () =>
                  pushes++ === 0
                    ? sql`INSERT INTO sweeper_job_outbox_batches (batch, jobs, size) VALUES (${late}::uuid,
                      '[{"worker": "Ci::BuildFinishedWorker", "queue": "default", "args": [[99]]}]', 1)`.pipe(
                      Effect.orDie,
                      Effect.asVoid
                    )
                    : Effect.void
              )
          }
          yield* relayJobOutbox(sql, committing, "00000000-0000-4000-8000-00000000000d")
          const left = yield* sql<{ batch: string }>`SELECT batch FROM sweeper_job_outbox_batches`
          assert.deepStrictEqual(left.map((row) => row.batch), [late])
          // Its wake's relay pushes it.
          assert.strictEqual(yield* relayJobOutbox(sql, queue, "00000000-0000-4000-8000-00000000000d"), 1)
          assert.deepStrictEqual(yield* outbox, [])
        })
      ),
    120_000
  )

  it.live(
    "a relay that dies between its push and its DELETE, or before its push, loses no job and pushes none twice",
    () =>
      onGitLab(
        { partitioned: true },
        Effect.gen(function*() {
          const sql = yield* PgClient.PgClient
          const queue = yield* JobQueue
          yield* seed(true, BUILDS, QUEUED)
          yield* runAll("legacy")
          const batches = Number(
            (yield* sql<{ n: string }>`SELECT count(*) AS n FROM sweeper_job_outbox_batches`)[0]!.n
          )
          assert.isAtLeast(batches, 4)
          // Relay A claims every batch and dies right after its first push reached Redis: that batch
          // is pushed but not forgotten, the others neither pushed nor forgotten. Another relay,
          // meanwhile, leaves A's claims alone (pushes nothing).
          let pushes = 0
          const dying: JobQueue["Service"] = {
            ...queue,
            pushOnce: (request) => {
              pushes++
              return Effect.andThen(queue.pushOnce(request), Effect.interrupt)
            }
          }
          assert.strictEqual(
            (yield* Effect.exit(relayJobOutbox(sql, dying, "00000000-0000-4000-8000-00000000000a")))._tag,
            "Failure"
          )
          assert.strictEqual(yield* relayJobOutbox(sql, queue, "00000000-0000-4000-8000-00000000000b"), 0)
          assert.strictEqual(pushes, 1)
          assert.lengthOf(yield* outbox, 12, "nothing forgotten: every job still in the outbox")
          assert.isAbove((yield* queued("default")).length, 0)
          // A fresh process's relay at start-up takes over every claim: the batch A pushed is refused
          // by its marker, the rest are pushed, and all are forgotten.
          yield* relayJobOutbox(sql, queue, "00000000-0000-4000-8000-00000000000c", { takeOver: true })
          assert.deepStrictEqual(yield* outbox, [])
          const jobs = yield* queued("default")
          assert.deepStrictEqual(
            jobs.map((job) => `${job.class} ${job.queue} ${JSON.stringify(job.args)}`).toSorted(),
            EXPECTED_JOBS(() => "default")
          )
          // Every marker expires.
          const redis = yield* Redis
          const markers = yield* Effect.orDie(redis.use("test.keys", (client) => client.keys("sweeper:job_outbox:*")))
          assert.strictEqual(markers.length, batches)
          for (const marker of markers) {
            const ttl = yield* Effect.orDie(redis.use("test.ttl", (client) => client.ttl(marker)))
            assert.isAbove(ttl, 6 * 24 * 3600)
          }
        })
      ),
    120_000
  )

  it.live("without the side tables a drop writes the row and its jobs only", () =>
    onGitLab(
      { partitioned: true, withoutTransitionTables: true },
      Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        yield* sql`INSERT INTO p_ci_builds (id, partition_id, project_id, commit_id, type, status, created_at,
          updated_at, lock_version) VALUES (1, 100, 10, 500, 'Ci::Build', 'canceling', '2026-01-02 03:00:00',
          '2026-01-02 03:00:00', 0)`
        const canceling = yield* DropCancelingBuilds.run.pipe(asRun("drop-canceling-builds", "legacy"))
        assert.strictEqual(canceling.dropped, 1)
        assert.deepStrictEqual(yield* outbox, [
          "Ci::BuildFinishedWorker default [1]",
          "PipelineProcessWorker default [500]"
        ])
      })
    ), 120_000)

  it.live(
    "on Sweeper's standalone schema: the same side effects on its own ci_pending_builds, ci_running_builds, ci_resources",
    () =>
      onGitLab(
        "standalone",
        Effect.gen(function*() {
          const sql = yield* PgClient.PgClient
          yield* sql`INSERT INTO ci_pipelines (id, project_id, status) VALUES (500, 10, 'running'), (504, 10, 'running')`
          yield* sql`INSERT INTO ci_builds (id, project_id, commit_id, status, created_at, updated_at, runner_id,
          resource_group_id) VALUES
          (1, 10, 500, 'canceling', '2026-01-02 03:00:00', '2026-01-02 03:00:00', 2, 70),
          (2, 10, 500, 'pending', '2026-01-02 03:00:00', '2026-01-02 03:00:00', NULL, NULL),
          (3, 10, 500, 'running', '2026-01-02 03:00:00', '2026-01-02 03:00:00', 2, NULL),
          (5, 10, 504, 'pending', '2026-01-02 04:30:00', '2026-01-02 04:30:00', NULL, NULL),
          (6, 10, 504, 'running', '2026-01-02 04:30:00', '2026-01-02 04:30:00', 2, NULL)`
          yield* sql`INSERT INTO ci_resource_groups (id, project_id, key) VALUES (70, 10, 'production')`
          yield* sql`INSERT INTO ci_resources (resource_group_id, build_id, project_id) VALUES (70, 1, 10)`
          yield* sql`INSERT INTO ci_pending_builds (build_id, project_id) VALUES (2, 10), (5, 10)`
          yield* sql`INSERT INTO ci_running_builds (build_id, project_id, runner_id, runner_type) VALUES (3, 10, 2, 1),
          (6, 10, 2, 1)`
          yield* sql`INSERT INTO ci_builds_runner_session (build_id, project_id, url) VALUES (3, 10, 'u3'), (6, 10, 'u6')`
          assert.deepStrictEqual(yield* runAll("legacy"), [1, 1, 1, 0])
          const ids = (rows: ReadonlyArray<{ id: string }>) => rows.map((r) => Number(r.id))
          assert.deepStrictEqual(ids(yield* sql<{ id: string }>`SELECT build_id AS id FROM ci_pending_builds`), [5])
          assert.deepStrictEqual(ids(yield* sql<{ id: string }>`SELECT build_id AS id FROM ci_running_builds`), [6])
          assert.deepStrictEqual(ids(yield* sql<{ id: string }>`SELECT build_id AS id FROM ci_builds_runner_session`), [
            6
          ])
          assert.deepStrictEqual(yield* sql`SELECT build_id FROM ci_resources`, [{ build_id: null }])
          assert.deepStrictEqual(
            (yield* sql<{ processed: boolean | null }>`SELECT processed FROM ci_builds ORDER BY id`).map((r) =>
              r.processed
            ),
            [false, false, false, null, null]
          )
          assert.deepStrictEqual(yield* outbox, [
            "Ci::BuildFinishedWorker default [1]",
            "Ci::BuildFinishedWorker default [2]",
            "Ci::BuildFinishedWorker default [3]",
            "Ci::ResourceGroups::AssignResourceFromResourceGroupWorker default [70]",
            "PipelineProcessWorker default [500]",
            "PipelineProcessWorker default [500]",
            "PipelineProcessWorker default [500]"
          ])
        })
      ),
    120_000
  )
})
