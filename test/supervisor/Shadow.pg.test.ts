/**
 * Shadow mode on a real PostgreSQL and Redis, GitLab's workers played by the test (it writes what
 * they would): a shadow run writes nothing outside Sweeper's own tables (GitLab's tables and every
 * Redis key compared before and after), records its proposals, and a later run gives each one its
 * verdict — matched, mismatched, sweeperOnly, ignored — and counts GitLab's unproposed repairs
 * (gitlabOnly), per batch: every class for the rebalances and the concurrency-limit resume too.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, layer } from "@effect/vitest"
import { Effect, Layer, Option } from "effect"
import { createHash } from "node:crypto"
import { SweeperConfig, TuningFromConfig } from "../../src/config/Config.ts"
import type { Batch } from "../../src/domain/Batch.ts"
import { workerKeys } from "../../src/domain/ConcurrencyLimit.ts"
import { PENDING_DIRECT_UPLOADS_KEY } from "../../src/domain/DirectUpload.ts"
import {
  LEGACY_REBALANCING_QUEUE,
  LEGACY_REBALANCING_WORKER,
  RebalanceContainer,
  REBALANCING_QUEUE,
  REBALANCING_WORKER,
  RESCHEDULE_WORKER,
  RUNNING_REBALANCES_KEY
} from "../../src/domain/Rebalancing.ts"
import { runnerAckQueueKey, RunnerProvisioningTimeoutReason } from "../../src/domain/StuckBuilds.ts"
import { ObjectStorageLocal } from "../../src/layers/objectStorage/ObjectStorageLocal.ts"
import { MainDatabaseLive, SingleDatabase } from "../../src/layers/postgres/Databases.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { SharedStateRedis } from "../../src/layers/redis/Redis.ts"
import { ConcurrencyLimitResume } from "../../src/programs/ConcurrencyLimitResume.ts"
import { DeleteStaleDirectUploads } from "../../src/programs/DeleteStaleDirectUploads.ts"
import { DropCancelingBuilds } from "../../src/programs/DropCancelingBuilds.ts"
import { DropPendingBuilds } from "../../src/programs/DropPendingBuilds.ts"
import { DropRunningBuilds } from "../../src/programs/DropRunningBuilds.ts"
import { RescheduleStuckIssueRebalances } from "../../src/programs/RescheduleStuckIssueRebalances.ts"
import { StuckExportJobs } from "../../src/programs/StuckExportJobs.ts"
import { JobQueue } from "../../src/services/JobQueue.ts"
import { RebalancingState } from "../../src/services/RebalancingState.ts"
import { ShadowLedger } from "../../src/services/ShadowLedger.ts"
import { RedisServices, RepairSteps, ShadowLayers, SqlBackends } from "../../src/supervisor/App.ts"
import { runBatch } from "../../src/supervisor/RunGuard.ts"
import { runCli } from "../support/cli.ts"
import { PgTest, TestDatabaseUrl } from "../support/postgres.ts"
import { RedisTopologyTest, scanKeys, TestRedisStores } from "../support/redisTopology.ts"

const Platform = Layer.mergeAll(ShadowLayers, RepairSteps).pipe(
  Layer.provideMerge(Layer.mergeAll(SqlBackends, ObjectStorageLocal({}), TuningFromConfig)),
  Layer.provideMerge(RedisServices),
  Layer.provideMerge(MetricsPrometheus),
  Layer.provideMerge(Layer.mergeAll(SingleDatabase, MainDatabaseLive)),
  Layer.provideMerge(SweeperConfig.layerWith({})),
  Layer.provideMerge(Layer.mergeAll(PgTest, RedisTopologyTest("single")))
)

const shadow = <S, E, R>(batch: Batch<S, E, R>): Batch<S, E, R> => ({ ...batch, mode: "shadow" })

const reset = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  yield* sql`TRUNCATE ci_builds, project_export_jobs, projects, namespaces, sweeper_events, sweeper_shadow_candidates
    RESTART IDENTITY CASCADE`
  yield* (yield* TestRedisStores).flush
})

/** GitLab's tables (every table not Sweeper's) and every Redis key with its value, as one fingerprint each. */
const gitlabState = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  const tables = yield* sql<{ table_name: string }>`SELECT table_name FROM information_schema.tables
    WHERE table_schema = 'public' AND table_type = 'BASE TABLE' AND table_name NOT LIKE 'sweeper_%'
    ORDER BY table_name`
  const rows: Record<string, string> = {}
  for (const { table_name } of tables) {
    const [row] = yield* sql.unsafe<{ digest: string | null }>(
      `SELECT md5(string_agg(t::text, '|' ORDER BY t::text)) AS digest FROM "${table_name}" t`
    )
    rows[table_name] = row?.digest ?? "empty"
  }
  const redis = (yield* SharedStateRedis).client
  const keys = (yield* Effect.promise(() => scanKeys(redis))).sort()
  const values: Record<string, string> = {}
  for (const key of keys) {
    const dumped = yield* Effect.promise(() => redis.dumpBuffer(key))
    values[key] = createHash("sha256").update(dumped ?? Buffer.alloc(0)).digest("hex")
  }
  return { rows, values }
})

/** GitLab's worker window has passed for every open proposal (what an hour and a quarter would do). */
const windowPassed = Effect.flatMap(
  PgClient.PgClient,
  (sql) => sql`UPDATE sweeper_shadow_candidates SET due_at = now() - interval '1 second' WHERE verdict IS NULL`
)

const verdicts = (batch: string) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const rows = yield* sql<{ entity: string; verdict: string | null }>`SELECT entity, verdict
      FROM sweeper_shadow_candidates WHERE batch = ${batch} AND verdict IS NOT NULL ORDER BY entity, proposed_at DESC`
    // Each entity's first proposal's verdict (a later one for the same entity comes first, and is overwritten).
    return Object.fromEntries(rows.map((row) => [row.entity, row.verdict]))
  })

layer(Platform, { excludeTestServices: true, timeout: 60_000 })("shadow mode on PostgreSQL and Redis", (it) => {
  it.effect("drop-canceling-builds: nothing of GitLab's written; each proposal judged against GitLab's drop", () =>
    Effect.gen(function*() {
      yield* reset
      const sql = yield* PgClient.PgClient
      yield* sql`INSERT INTO ci_builds (id, project_id, status, lock_version, created_at, updated_at, started_at)
        SELECT i, 1, 'canceling', 0, now() AT TIME ZONE 'UTC' - interval '3 hours',
          now() AT TIME ZONE 'UTC' - interval '2 hours', now() AT TIME ZONE 'UTC' - interval '3 hours'
        FROM generate_series(1, 6) AS i`
      const before = yield* gitlabState
      const first = yield* runBatch(shadow(DropCancelingBuilds), { trigger: "manual" })
      assert.strictEqual(first.outcome, "succeeded", first.error)
      assert.isTrue(first.dryRun)
      assert.deepStrictEqual(yield* gitlabState, before)
      assert.deepInclude(first.summary as object, { dropped: 6 })
      assert.deepInclude((first.summary as { shadow: object }).shadow, { proposed: 6, waiting: 6, matched: 0 })

      // GitLab's DropCancelingWorker (and the world) at work:
      yield* sql`UPDATE ci_builds SET status = 'failed', failure_reason = 3 WHERE id = 1` // the seed's drop
      yield* sql`UPDATE ci_builds SET status = 'canceled' WHERE id = 2` // GitLab 19's drop
      yield* sql`UPDATE ci_builds SET status = 'failed', failure_reason = 12 WHERE id = 3` // doomed
      yield* sql`UPDATE ci_builds SET status = 'success' WHERE id = 4` // finished meanwhile
      yield* sql`DELETE FROM ci_builds WHERE id = 5` // gone
      // build 6: GitLab's loop never got past it

      // Before GitLab's window: only what changed is judged, the still-stuck one waits.
      const early = yield* runBatch(shadow(DropCancelingBuilds), { trigger: "manual" })
      assert.deepInclude((early.summary as { shadow: object }).shadow, {
        matched: 1,
        mismatched: 2,
        ignored: 2,
        sweeperOnly: 0,
        waiting: 1
      })
      yield* windowPassed
      const late = yield* runBatch(shadow(DropCancelingBuilds), { trigger: "manual" })
      assert.deepInclude((late.summary as { shadow: object }).shadow, { sweeperOnly: 1, waiting: 0, proposed: 1 })
      assert.deepStrictEqual(yield* verdicts("drop-canceling-builds"), {
        "build:1": "matched",
        "build:2": "mismatched",
        "build:3": "mismatched",
        "build:4": "ignored",
        "build:5": "ignored",
        // Still stuck once GitLab's window is over: the next run proposes it again, a new open row.
        "build:6": "sweeperOnly"
      })
      const [report] = yield* (yield* ShadowLedger).report({
        since: new Date(Date.now() - 3_600_000),
        batches: ["drop-canceling-builds"]
      })
      assert.deepInclude(report!, { matched: 1, mismatched: 2, sweeperOnly: 1, gitlabOnly: 0, ignored: 2 })
      assert.strictEqual(report!.agreement, 0.25)
      assert.sameMembers(report!.samples.map((s) => s.entity), ["build:2", "build:3", "build:6"])

      // The operator's view: `sweeper shadow report --json`, one object per batch.
      const env = { DATABASE_URL: yield* TestDatabaseUrl, ...(yield* TestRedisStores).env }
      const cli = yield* Effect.promise(() =>
        runCli(["shadow", "report", "--batch", "drop-canceling-builds", "--since", "1d", "--json"], env)
      )
      assert.strictEqual(cli.code, 0, cli.stderr)
      const printed = JSON.parse(cli.stdout) as ReadonlyArray<Record<string, unknown>>
      assert.strictEqual(printed.length, 1)
      assert.deepInclude(printed[0]!, {
        batch: "drop-canceling-builds",
        matched: 1,
        mismatched: 2,
        sweeperOnly: 1,
        gitlabOnly: 0,
        ignored: 2,
        agreement: 0.25
      })
      const sample = (printed[0]!.samples as ReadonlyArray<Record<string, unknown>>).find((x) => x.entity === "build:2")
      assert.deepInclude(sample!, { verdict: "mismatched", rule: "canceling" })
      assert.deepStrictEqual(sample!.outcome, { status: "failed", failure_reason: 3 })
      assert.deepInclude(sample!.observed as object, { status: "canceled" })
      const text = yield* Effect.promise(() => runCli(["shadow", "report", "--since", "1d"], env))
      assert.include(text.stdout, "drop-canceling-builds: agreement 25.0% — matched 1, mismatched 2, sweeperOnly 1")
    }))

  it.effect("drop-running-builds: a build GitLab failed as stuck that Sweeper never proposed is gitlabOnly, once", () =>
    Effect.gen(function*() {
      yield* reset
      const sql = yield* PgClient.PgClient
      yield* sql`INSERT INTO ci_builds (id, project_id, status, failure_reason, created_at, updated_at, started_at, finished_at)
        VALUES
          (10, 1, 'failed', 3, now() AT TIME ZONE 'UTC' - interval '3 hours', now() AT TIME ZONE 'UTC',
            now() AT TIME ZONE 'UTC' - interval '3 hours', now() AT TIME ZONE 'UTC'),
          (11, 1, 'failed', 1, now() AT TIME ZONE 'UTC' - interval '3 hours', now() AT TIME ZONE 'UTC',
            now() AT TIME ZONE 'UTC' - interval '3 hours', now() AT TIME ZONE 'UTC'),
          (12, 1, 'running', NULL, now() AT TIME ZONE 'UTC' - interval '3 hours',
            now() AT TIME ZONE 'UTC' - interval '2 hours', now() AT TIME ZONE 'UTC' - interval '3 hours', NULL)`
      const before = yield* gitlabState
      const first = yield* runBatch(shadow(DropRunningBuilds), { trigger: "manual" })
      assert.strictEqual(first.outcome, "succeeded", first.error)
      assert.deepStrictEqual(yield* gitlabState, before)
      // 10 (stuck_or_timeout_failure) is GitLab's; 11 (script_failure) is not a stuck reason.
      assert.deepInclude((first.summary as { shadow: object }).shadow, { proposed: 1, gitlabOnly: 1 })
      // GitLab's DropRunningWorker drops 12 as Sweeper proposed.
      yield* sql`UPDATE ci_builds SET status = 'failed', failure_reason = 3, finished_at = now() AT TIME ZONE 'UTC'
        WHERE id = 12`
      const second = yield* runBatch(shadow(DropRunningBuilds), { trigger: "manual" })
      // 12 is matched, not gitlabOnly (it was proposed); 10 is not counted twice.
      assert.deepInclude((second.summary as { shadow: object }).shadow, { matched: 1, gitlabOnly: 0 })
      assert.deepStrictEqual(yield* verdicts("drop-running-builds"), {
        "build:10": "gitlabOnly",
        "build:12": "matched"
      })
    }))

  it.effect("drop-pending-builds: one proposal per build, by the first rule that would drop it; none while its runner may still ack", () =>
    Effect.gen(function*() {
      yield* reset
      const sql = yield* PgClient.PgClient
      // Both pending for two hours with a runner; 21's runner may still acknowledge it.
      yield* sql`INSERT INTO ci_builds (id, project_id, status, runner_id, created_at, updated_at)
        SELECT i, 1, 'pending', 7, now() AT TIME ZONE 'UTC' - interval '2 hours',
          now() AT TIME ZONE 'UTC' - interval '2 hours'
        FROM generate_series(20, 21) AS i`
      const redis = (yield* SharedStateRedis).client
      yield* Effect.promise(() => redis.set(runnerAckQueueKey(21), "7", "EX", 600))
      const run = yield* runBatch(shadow(DropPendingBuilds), { trigger: "manual" }).pipe(
        Effect.provideService(RunnerProvisioningTimeoutReason, Option.some(24))
      )
      assert.strictEqual(run.outcome, "succeeded", run.error)
      // Both matched by two rules; each proposed once, by the first rule that would drop it. 21 is
      // passed over by the waiting-for-ack rule, so only the stuck rule (no online runner) proposes it.
      assert.deepInclude((run.summary as { shadow: object }).shadow, { proposed: 2 })
      const open = yield* (yield* ShadowLedger).open("drop-pending-builds", 10)
      assert.deepStrictEqual(open.map((c) => [c.entity, c.rule]), [
        ["build:20", "pending waiting_for_ack"],
        ["build:21", "pending stuck"]
      ])
    }))

  it.effect("stuck-export-jobs: matched, sweeperOnly, ignored (re-enqueued, finished), gitlabOnly", () =>
    Effect.gen(function*() {
      yield* reset
      const sql = yield* PgClient.PgClient
      yield* sql`INSERT INTO namespaces (id, name, path) VALUES (1, 'n', 'n')`
      yield* sql`INSERT INTO projects (id, namespace_id, name, path) VALUES (1, 1, 'p', 'p')`
      // Jobs 1–4 stuck (their Sidekiq status keys gone); 5 failed by GitLab, never proposed.
      yield* sql`INSERT INTO project_export_jobs (id, project_id, jid, status, created_at, updated_at)
        SELECT i, 1, 'jid-' || i, 1, now() - interval '8 hours', now() - interval '8 hours'
        FROM generate_series(1, 4) AS i`
      yield* sql`INSERT INTO project_export_jobs (id, project_id, jid, status, created_at, updated_at)
        VALUES (5, 1, 'jid-5', 3, now() - interval '8 hours', now())`
      const before = yield* gitlabState
      const first = yield* runBatch(shadow(StuckExportJobs), { trigger: "manual" })
      assert.strictEqual(first.outcome, "succeeded", first.error)
      assert.deepStrictEqual(yield* gitlabState, before)
      assert.deepInclude((first.summary as { shadow: object }).shadow, { proposed: 4, gitlabOnly: 1 })

      yield* sql`UPDATE project_export_jobs SET status = 3, updated_at = now() WHERE id = 1` // GitLab's fail_op
      yield* sql`UPDATE project_export_jobs SET jid = 'jid-2b' WHERE id = 2` // re-enqueued
      yield* sql`UPDATE project_export_jobs SET status = 2 WHERE id = 3` // finished after all
      yield* windowPassed
      const second = yield* runBatch(shadow(StuckExportJobs), { trigger: "manual" })
      assert.deepInclude((second.summary as { shadow: object }).shadow, {
        matched: 1,
        ignored: 2,
        sweeperOnly: 1,
        gitlabOnly: 0
      })
      assert.deepStrictEqual(yield* verdicts("stuck-export-jobs"), {
        "export_job:1": "matched",
        "export_job:2": "ignored",
        "export_job:3": "ignored",
        "export_job:4": "sweeperOnly",
        "export_job:5": "gitlabOnly"
      })
    }))

  it.effect("delete-stale-direct-uploads: matched, mismatched (GitLab's path cut at a second colon), ignored, sweeperOnly", () =>
    Effect.gen(function*() {
      yield* reset
      const redis = (yield* SharedStateRedis).client
      const old = String(Math.floor(Date.now() / 1000) - 4 * 3600)
      yield* Effect.promise(() =>
        redis.hset(PENDING_DIRECT_UPLOADS_KEY, {
          "uploads:tmp/a": old,
          "uploads:tmp/b:c": old,
          "uploads:tmp/d": old,
          "uploads:tmp/e": old
        })
      )
      const before = yield* gitlabState
      const first = yield* runBatch(shadow(DeleteStaleDirectUploads), { trigger: "manual" })
      assert.strictEqual(first.outcome, "succeeded", first.error)
      assert.deepStrictEqual(yield* gitlabState, before)
      assert.deepInclude((first.summary as { shadow: object }).shadow, { proposed: 4, waiting: 4 })

      // GitLab's DeleteStaleDirectUploadsWorker removes a and b:c; d is registered again by a new upload.
      yield* Effect.promise(() => redis.hdel(PENDING_DIRECT_UPLOADS_KEY, "uploads:tmp/a", "uploads:tmp/b:c"))
      yield* Effect.promise(() =>
        redis.hset(PENDING_DIRECT_UPLOADS_KEY, "uploads:tmp/d", String(Date.now() / 1000 | 0))
      )
      yield* windowPassed
      const second = yield* runBatch(shadow(DeleteStaleDirectUploads), { trigger: "manual" })
      assert.deepInclude((second.summary as { shadow: object }).shadow, {
        matched: 1,
        mismatched: 1,
        ignored: 1,
        sweeperOnly: 1
      })
      assert.deepStrictEqual(yield* verdicts("delete-stale-direct-uploads"), {
        "direct_upload:uploads:tmp/a": "matched",
        "direct_upload:uploads:tmp/b:c": "mismatched",
        "direct_upload:uploads:tmp/d": "ignored",
        "direct_upload:uploads:tmp/e": "sweeperOnly"
      })
    }))

  it.effect("reschedule-stuck-issue-rebalances: nothing of GitLab's written; matched, mismatched, sweeperOnly, ignored, gitlabOnly", () =>
    Effect.gen(function*() {
      yield* reset
      const sql = yield* PgClient.PgClient
      const redis = (yield* SharedStateRedis).client
      const state = yield* RebalancingState
      const jobs = yield* JobQueue
      yield* sql`INSERT INTO namespaces (id, name, path) SELECT i, 'n' || i, 'n' || i FROM generate_series(1, 9) AS i`
      yield* sql`INSERT INTO projects (id, namespace_id, name, path) VALUES (1, 1, 'p', 'p')`
      for (const id of [1, 2, 3, 4]) yield* state.track(RebalanceContainer.namespace, id)
      yield* state.track(RebalanceContainer.project, 1)
      // A member Sweeper refuses ("09" is no canonical id) and GitLab's `to_i` reads as namespace 9.
      yield* Effect.promise(() => redis.sadd(RUNNING_REBALANCES_KEY, "1/09"))
      const before = yield* gitlabState
      const first = yield* runBatch(shadow(RescheduleStuckIssueRebalances), { trigger: "manual" })
      assert.strictEqual(first.outcome, "succeeded", first.error)
      assert.isTrue(first.dryRun)
      assert.deepStrictEqual(yield* gitlabState, before)
      assert.deepInclude((first.summary as { shadow: object }).shadow, { proposed: 5, waiting: 5, gitlabOnly: 0 })

      // GitLab's RescheduleStuckIssueRebalancesWorker and the rebalancer at work:
      const gitlabPush = (workerClass: string, queue: string, args: ReadonlyArray<ReadonlyArray<unknown>>) =>
        jobs.bulkEnqueue({
          workerClass,
          queue,
          args,
          deduplicate: "until_executed",
          extra: { "meta.caller_id": RESCHEDULE_WORKER }
        })
      // 1/1 re-enqueued as Sweeper would; 1/9 too (from the member Sweeper refused).
      yield* gitlabPush(REBALANCING_WORKER, REBALANCING_QUEUE, [[null, null, 1], [null, null, 9]])
      yield* state.finish(RebalanceContainer.namespace, 2) // 1/2's rebalance ran to its end
      // 1/3 re-enqueued by an older GitLab as the legacy IssueRebalancingWorker
      yield* gitlabPush(LEGACY_REBALANCING_WORKER, LEGACY_REBALANCING_QUEUE, [[null, null, 3]])
      yield* Effect.promise(() => redis.srem(RUNNING_REBALANCES_KEY, "1/4")) // removed by hand: no mark
      // 2/1: GitLab's worker never got to it

      const early = yield* runBatch(shadow(RescheduleStuckIssueRebalances), { trigger: "manual" })
      assert.deepInclude((early.summary as { shadow: object }).shadow, {
        matched: 2,
        mismatched: 1,
        ignored: 1,
        sweeperOnly: 0,
        gitlabOnly: 1
      })
      yield* windowPassed
      const late = yield* runBatch(shadow(RescheduleStuckIssueRebalances), { trigger: "manual" })
      assert.deepInclude((late.summary as { shadow: object }).shadow, { sweeperOnly: 1, gitlabOnly: 0 })
      const judged = yield* verdicts("reschedule-stuck-issue-rebalances")
      assert.deepStrictEqual(judged, {
        "rebalance:1/1": "matched",
        "rebalance:1/2": "matched",
        "rebalance:1/3": "mismatched",
        "rebalance:1/4": "ignored",
        "rebalance:1/9": "gitlabOnly",
        "rebalance:2/1": "sweeperOnly"
      })
      // 1/1's job is pending: Sweeper's act run would push nothing (a duplicate), so no new proposal.
      const open = yield* (yield* ShadowLedger).open("reschedule-stuck-issue-rebalances", 10)
      assert.notInclude(open.map((c) => c.entity), "rebalance:1/1")
    }))

  it.effect("concurrency-limit-resume: nothing of GitLab's written; matched, mismatched, sweeperOnly, ignored, gitlabOnly", () =>
    Effect.gen(function*() {
      yield* reset
      const redis = (yield* SharedStateRedis).client
      const element = (worker: string, i: number) =>
        JSON.stringify({ args: [worker, i], context: {}, buffered_at: 1_700_000_000 + i })
      const defer = (worker: string, limit: number, count: number) =>
        Effect.promise(async () => {
          const keys = workerKeys(worker)
          await redis.set(keys.currentLimit, String(limit))
          for (let i = 0; i < count; i += 500) {
            await redis.rpush(
              keys.deferred,
              ...Array.from({ length: Math.min(500, count - i) }, (_, j) => element(worker, i + j))
            )
          }
        })
      yield* defer("Shadow::MatchedWorker", 2, 5)
      yield* defer("Shadow::FewerWorker", 2, 5)
      yield* defer("Shadow::StuckWorker", 2, 5)
      yield* defer("Shadow::LimitChangedWorker", 2, 5)
      yield* defer("Shadow::ClearedWorker", 1, 2000)
      // No free slot by Sweeper's count (one resumed job not yet started): Sweeper proposes nothing.
      yield* defer("Shadow::UnproposedWorker", 1, 3)
      yield* Effect.promise(() => redis.set(workerKeys("Shadow::UnproposedWorker").pendingResumed, "1", "EX", 60))
      const before = yield* gitlabState
      const first = yield* runBatch(shadow(ConcurrencyLimitResume), { trigger: "manual" })
      assert.strictEqual(first.outcome, "succeeded", first.error)
      assert.isTrue(first.dryRun)
      assert.deepStrictEqual(yield* gitlabState, before)
      assert.deepInclude((first.summary as { shadow: object }).shadow, { proposed: 5, waiting: 5 })

      // GitLab's ResumeWorker (and the world) at work: resumed jobs go to `queue:default`.
      const resume = (worker: string, count: number) =>
        Effect.promise(async () => {
          const taken = await redis.lpop(workerKeys(worker).deferred, count)
          for (const raw of taken ?? []) {
            const deferred = JSON.parse(raw) as { args: Array<unknown>; buffered_at: number }
            await redis.lpush(
              "queue:default",
              JSON.stringify({
                class: worker,
                args: deferred.args,
                jid: `gitlab-${worker}-${deferred.buffered_at}`,
                queue: "default",
                concurrency_limit_resume: true,
                concurrency_limit_buffered_at: deferred.buffered_at
              })
            )
          }
        })
      yield* resume("Shadow::MatchedWorker", 2) // the same two jobs
      yield* resume("Shadow::FewerWorker", 1) // one of the two
      yield* resume("Shadow::UnproposedWorker", 1) // GitLab counts a free slot Sweeper did not
      yield* Effect.promise(() => redis.set(workerKeys("Shadow::LimitChangedWorker").currentLimit, "-1"))
      yield* Effect.promise(() => redis.del(workerKeys("Shadow::ClearedWorker").deferred)) // cleared by hand
      // Shadow::StuckWorker: ResumeWorker never got to it

      const early = yield* runBatch(shadow(ConcurrencyLimitResume), { trigger: "manual" })
      assert.deepInclude((early.summary as { shadow: object }).shadow, {
        matched: 1,
        mismatched: 1,
        ignored: 2,
        sweeperOnly: 0,
        gitlabOnly: 1
      })
      yield* windowPassed
      const late = yield* runBatch(shadow(ConcurrencyLimitResume), { trigger: "manual" })
      assert.deepInclude((late.summary as { shadow: object }).shadow, { sweeperOnly: 1, gitlabOnly: 0 })
      assert.deepStrictEqual(yield* verdicts("concurrency-limit-resume"), {
        "concurrency_limit:Shadow::MatchedWorker": "matched",
        "concurrency_limit:Shadow::FewerWorker": "mismatched",
        "concurrency_limit:Shadow::StuckWorker": "sweeperOnly",
        "concurrency_limit:Shadow::LimitChangedWorker": "ignored",
        "concurrency_limit:Shadow::ClearedWorker": "ignored",
        "concurrency_limit:Shadow::UnproposedWorker": "gitlabOnly"
      })
    }))
})
