/**
 * kill -9 mid-run, per batch that can run long: the real CLI
 * (`sweeper run <batch> --json`) on real PostgreSQL and Redis is SIGKILLed three times at seeded
 * random points (after a random number of repairs) once it is repairing, then run to completion. Afterwards:
 *   - SQL batches (repair and event in one transaction): every repaired record has exactly one event;
 *   - delete-stale-direct-uploads (Redis, at-least-once): every deleted upload has at least one
 *     event, and each upload at most one extra per kill (a duplicate needs a crash between a step's INSERT and its compare-and-delete, which duplicates that step's events);
 *   - concurrency-limit-resume (jobs exactly once, events at least once): every deferred job resumed
 *     exactly once, and named by at least one event (a move's event is appended before its journal
 *     is ended, so a kill can repeat it — at most one move per kill — never drop it);
 *   - nothing is repaired twice and no record outside the criteria is touched.
 * A killed holder's exclusive lease is deleted between attempts (as if its TTL had passed).
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { existsSync } from "node:fs"
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { MAX_RESUME_UNLIMITED, workerKeys, workerLeaseName } from "../../src/domain/ConcurrencyLimit.ts"
import { PENDING_DIRECT_UPLOADS_KEY } from "../../src/domain/DirectUpload.ts"
import { FAIL_SLICE } from "../../src/domain/ExportJob.ts"
import { jobStatusKey } from "../../src/domain/SidekiqStatus.ts"
import { Redis } from "../../src/layers/redis/Redis.ts"
import { seedDeferredJobs, seedStuckCancelingBuilds } from "../../src/simulator/Fixtures.ts"
import { PgTest, TestDatabaseUrl } from "../support/postgres.ts"
import { RedisTest, TestRedisUrl } from "../support/redis.ts"
import { eventsPerStream, killRepeatedly, runToEnd } from "./support.ts"

const Platform = () => Layer.mergeAll(PgTest, RedisTest)
const KILLS = 3
/** Two seeds per batch; SWEEPER_FAULT_SEED replays one. */
const SEEDS = process.env.SWEEPER_FAULT_SEED !== undefined ? [Number(process.env.SWEEPER_FAULT_SEED)] : [7, 1009]

const baseEnv = Effect.gen(function*() {
  return {
    DATABASE_URL: yield* TestDatabaseUrl,
    REDIS_URL: yield* TestRedisUrl,
    SWEEPER_DATA_DIR: join(tmpdir(), "sweeper-fault-data")
  }
})

const report = (what: string, figures: Record<string, unknown>) =>
  Effect.sync(() => console.log(`[fault] ${what}`, JSON.stringify(figures)))

describe("kill -9 mid-run, then run to completion", () => {
  for (const seed of SEEDS) {
    it.live(
      `drop-canceling-builds (seed ${seed}): every stuck build failed once, exactly one BuildDropped each`,
      () =>
        Effect.gen(function*() {
          const STUCK = 1000
          const sql = yield* PgClient.PgClient
          yield* seedStuckCancelingBuilds(STUCK)
          // Outside the criteria: canceling but recent, and old but running.
          yield* sql`INSERT INTO ci_builds (project_id, status, created_at, updated_at)
          SELECT 1, 'canceling', now() AT TIME ZONE 'UTC', now() AT TIME ZONE 'UTC' FROM generate_series(1, 100)`
          yield* sql`INSERT INTO ci_builds (project_id, status, created_at, updated_at)
          SELECT 1, 'running', '2026-01-01', '2026-01-01' FROM generate_series(1, 100)`
          const outside = sql<{ id: string; status: string; lock_version: number; updated_at: Date }>`
          SELECT id, status, lock_version, updated_at FROM ci_builds WHERE id > ${STUCK} ORDER BY id`
          const outsideBefore = yield* outside

          // Pages of 50: twenty statements a run, so a kill can land between them on a fast machine
          // too (one page of 1000 commits every repair at once and ends the run before any kill).
          const env = { ...(yield* baseEnv), SWEEPER_DROP_BATCH_SIZE: "50" }
          const kills = yield* killRepeatedly({
            batch: "drop-canceling-builds",
            env,
            repairEvent: "BuildDropped",
            kills: KILLS,
            seed,
            maxRepairs: STUCK / (2 * KILLS),
            jitterMs: 20,
            lease: "ci/stuck_builds/drop_canceling_worker"
          })
          const last = yield* runToEnd("drop-canceling-builds", env)
          assert.strictEqual(last.output.outcome, "succeeded", last.stderr)

          const builds = yield* sql<{ n: string; once: string }>`
          SELECT count(*) AS n, count(*) FILTER (WHERE lock_version = 1) AS once FROM ci_builds
          WHERE id <= ${STUCK} AND status = 'failed' AND failure_reason = 3`
          assert.strictEqual(Number(builds[0]!.n), STUCK, "every stuck build is failed")
          assert.strictEqual(Number(builds[0]!.once), STUCK, "each was updated exactly once (lock_version 0 → 1)")
          const events = yield* eventsPerStream("BuildDropped")
          assert.strictEqual(events.size, STUCK)
          for (let id = 1; id <= STUCK; id++) assert.strictEqual(events.get(`build:${id}`), 1, `build ${id}`)
          assert.deepStrictEqual(yield* outside, outsideBefore, "builds outside the criteria are untouched")
          yield* report("drop-canceling-builds", {
            seed,
            kills: KILLS,
            ...kills,
            records: STUCK,
            events: [...events.values()].reduce((a, b) => a + b, 0)
          })
        }).pipe(Effect.provide(Platform())),
      240_000
    )

    it.live(
      `stuck-export-jobs (seed ${seed}): every completed job failed once, exactly one ExportJobFailed each`,
      () =>
        Effect.gen(function*() {
          // Failed in slices of FAIL_SLICE (1000), one transaction each: enough slices that three
          // kills, each after one to two slices, leave work for the final run.
          const STUCK = 15 * FAIL_SLICE
          const RUNNING = 200
          const sql = yield* PgClient.PgClient
          const redis = yield* Redis
          yield* sql`INSERT INTO namespaces (id, name, path, type) VALUES (10, 'gitlab-org', 'gitlab-org', 'Group')`
          yield* sql`INSERT INTO projects (id, namespace_id, name, path) VALUES (20, 10, 'gitlab', 'gitlab')`
          yield* sql`INSERT INTO project_export_jobs (id, project_id, jid, status, user_id, created_at, updated_at)
          SELECT g, 20, 'jid-' || g, g % 2, 1, '2026-01-01', '2026-01-01' FROM generate_series(1, ${STUCK + RUNNING}) g`
          // Outside the criteria: jobs whose Sidekiq job still runs (status key present).
          const running = Array.from({ length: RUNNING }, (_, i) => `jid-${STUCK + 1 + i}`)
          yield* redis.use(
            "test.mset",
            (client) => client.mset(Object.fromEntries(running.map((jid) => [jobStatusKey(jid), "1"])))
          )
          const outside = sql<{ id: string; status: number; updated_at: Date }>`
          SELECT id, status, updated_at FROM project_export_jobs WHERE id > ${STUCK} ORDER BY id`
          const outsideBefore = yield* outside

          const env = yield* baseEnv
          const kills = yield* killRepeatedly({
            batch: "stuck-export-jobs",
            env,
            repairEvent: "ExportJobFailed",
            kills: KILLS,
            seed,
            maxRepairs: 2 * FAIL_SLICE,
            jitterMs: 100
          })
          const last = yield* runToEnd("stuck-export-jobs", env)
          assert.strictEqual(last.output.outcome, "succeeded", last.stderr)

          const failed = yield* sql<
            { n: string }
          >`SELECT count(*) AS n FROM project_export_jobs WHERE id <= ${STUCK} AND status = 3`
          assert.strictEqual(Number(failed[0]!.n), STUCK)
          const events = yield* eventsPerStream("ExportJobFailed")
          assert.strictEqual(events.size, STUCK)
          for (let id = 1; id <= STUCK; id++) {
            assert.strictEqual(events.get(`export_job:${id}`), 1, `export job ${id}`)
          }
          assert.deepStrictEqual(yield* outside, outsideBefore, "jobs still running are untouched")
          yield* report("stuck-export-jobs", {
            seed,
            kills: KILLS,
            ...kills,
            records: STUCK,
            events: [...events.values()].reduce((a, b) => a + b, 0)
          })
        }).pipe(Effect.provide(Platform())),
      240_000
    )

    it.live(
      `delete-stale-direct-uploads (seed ${seed}): every stale upload deleted, at least one event each, at most one step's extra events per kill`,
      () =>
        Effect.gen(function*() {
          const STALE = 3000
          const FRESH = 200
          const root = yield* Effect.acquireRelease(
            Effect.promise(() => mkdtemp(join(tmpdir(), "sweeper-fault-objects-"))),
            (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true }))
          )
          yield* Effect.promise(() => mkdir(join(root, "tmp/uploads"), { recursive: true }))
          const nowSeconds = Math.floor(Date.now() / 1000)
          const entries: Record<string, string> = {}
          for (let i = 0; i < STALE + FRESH; i++) {
            const path = `tmp/uploads/${i < STALE ? "stale" : "fresh"}-${i}`
            entries[`artifacts:${path}`] = String(i < STALE ? nowSeconds - 4 * 3600 : nowSeconds - 600)
            yield* Effect.promise(() => writeFile(join(root, path), "half an upload"))
          }
          const redis = yield* Redis
          yield* redis.use("test.hset", (client) => client.hset(PENDING_DIRECT_UPLOADS_KEY, entries))

          const env = { ...(yield* baseEnv), SWEEPER_OBJECT_STORAGE: JSON.stringify({ artifacts: root }) }
          const kills = yield* killRepeatedly({
            batch: "delete-stale-direct-uploads",
            env,
            repairEvent: "StaleDirectUploadDeleted",
            kills: KILLS,
            seed,
            maxRepairs: STALE / (2 * KILLS),
            jitterMs: 20,
            lease: "sweeper/delete_stale_direct_uploads"
          })
          const last = yield* runToEnd("delete-stale-direct-uploads", env)
          assert.strictEqual(last.output.outcome, "succeeded", last.stderr)

          const left = yield* redis.use("test.hgetall", (client) => client.hgetall(PENDING_DIRECT_UPLOADS_KEY))
          assert.deepStrictEqual(
            Object.keys(left).sort(),
            Object.keys(entries).filter((field) => field.includes("/fresh-")).sort()
          )
          const events = yield* eventsPerStream("StaleDirectUploadDeleted")
          let duplicates = 0
          for (let i = 0; i < STALE; i++) {
            const n = events.get(`direct_upload:artifacts:tmp/uploads/stale-${i}`) ?? 0
            assert.isAtLeast(n, 1, `stale upload ${i} has no event`)
            duplicates += n - 1
            assert.isFalse(existsSync(join(root, `tmp/uploads/stale-${i}`)))
          }
          assert.strictEqual(events.size, STALE, "no event for a fresh upload")
          // Repairs go in steps (one INSERT of the step's events, then one compare-and-delete of its
          // fields): a kill between the two duplicates that step's events, so up to one step per kill,
          // and one upload at most once per kill.
          for (const n of events.values()) {
            assert.isAtMost(n, 1 + KILLS, "an upload duplicated more often than it was killed")
          }
          assert.isBelow(duplicates, STALE, "a duplicate needs a kill between the INSERT and the compare-and-delete")
          for (let i = STALE; i < STALE + FRESH; i++) {
            assert.isTrue(existsSync(join(root, `tmp/uploads/fresh-${i}`)))
          }
          yield* report("delete-stale-direct-uploads", {
            seed,
            kills: KILLS,
            ...kills,
            records: STALE,
            events: STALE + duplicates,
            duplicates
          })
        }).pipe(Effect.provide(Platform())),
      240_000
    )
    it.live(
      `concurrency-limit-resume (seed ${seed}, black box): no deferred job lost or resumed twice; every resumed job has at least one event`,
      () =>
        Effect.gen(function*() {
          // Enough for three kills mid-run: with limit 0 passes of up to 5000 run back to back.
          const JOBS = 100_000
          const WORKER = "Releases::CreateEvidenceWorker"
          const keys = workerKeys(WORKER)
          const redis = yield* Redis
          yield* seedDeferredJobs(redis.client, { worker: WORKER, jobs: JOBS })
          // Limit 0: unlimited, up to 5000 jobs per pass, passes back to back.
          const env = { ...(yield* baseEnv), SWEEPER_CONCURRENCY_LIMITS: JSON.stringify({ [WORKER]: { limit: 0 } }) }
          const kills = yield* killRepeatedly({
            batch: "concurrency-limit-resume",
            env,
            repairEvent: "ConcurrencyLimitJobsResumed",
            kills: KILLS,
            seed,
            // One event per pass of up to 5000 jobs: kill within the first two passes.
            maxRepairs: 2,
            jitterMs: 200,
            lease: workerLeaseName(WORKER)
          })
          while ((yield* redis.use("test.llen", (client) => client.llen(keys.deferred))) > 0) {
            const last = yield* runToEnd("concurrency-limit-resume", env, "--budget", "20s")
            assert.strictEqual(last.output.outcome, "succeeded", last.stderr)
          }

          const queued = (yield* redis.use("test.lrange", (client) => client.lrange("queue:default", 0, -1)))
            .map((raw) => JSON.parse(raw) as { jid: string; args: ReadonlyArray<number> })
          const resumed = queued.map((job) => job.args[0]!).sort((a, b) => a - b)
          assert.deepStrictEqual(resumed, Array.from({ length: JOBS }, (_, i) => i), "every job resumed exactly once")
          const sql = yield* PgClient.PgClient
          const recorded = yield* sql<{ jids: ReadonlyArray<string> }>`
          SELECT data->'jids' AS jids FROM sweeper_events WHERE type = 'ConcurrencyLimitJobsResumed'`
          const eventJids = recorded.flatMap((row) => row.jids)
          const queuedJids = new Set(queued.map((job) => job.jid))
          assert.isTrue(eventJids.every((jid) => queuedJids.has(jid)), "an event names only jobs that were resumed")
          const withEvent = new Set(eventJids)
          const missing = queued.filter((job) => !withEvent.has(job.jid))
          assert.deepStrictEqual(
            missing.map((job) => job.args[0]).slice(0, 10),
            [],
            `${missing.length} resumed jobs have no event`
          )
          // A duplicate needs a kill between a move's event and the end of its journal: then the
          // recovery appends that move's event again — at most one move (MAX_RESUME_UNLIMITED jobs) per kill.
          const duplicated = eventJids.length - withEvent.size
          assert.isAtMost(duplicated, KILLS * MAX_RESUME_UNLIMITED, "more duplicate events than one move per kill")
          yield* report("concurrency-limit-resume", {
            seed,
            kills: KILLS,
            ...kills,
            records: JOBS,
            jobsWithEvent: withEvent.size,
            duplicateJobEvents: duplicated
          })
        }).pipe(Effect.provide(Platform())),
      240_000
    )
  }
})
