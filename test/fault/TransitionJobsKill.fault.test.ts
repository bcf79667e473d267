/**
 * kill -9 around the push of a drop's after-transition jobs, with the real CLI on GitLab's own DDL
 * (p_ci_builds, p_ci_pipelines): `sweeper run drop-canceling-builds` is SIGKILLed
 *   - between the commit and the push: its Redis connection is cut at the first push (the jobs are
 *     committed in the job outbox, none reached Redis), or
 *   - between the push and the outbox's DELETE: its PostgreSQL connection is cut at the first
 *     DELETE (that batch is in Redis, its rows still in the outbox),
 * then run again to its end. Either way no job is lost and none is pushed twice: one
 * Ci::BuildFinishedWorker per dropped build, PipelineProcessWorker for exactly the pipelines touched,
 * and the outbox empty.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Redacted } from "effect"
import type { SidekiqJob } from "../../src/domain/Sidekiq.ts"
import { migrate } from "../../src/layers/postgres/Migrations.ts"
import { layerServer } from "../../src/layers/postgres/Postgres.ts"
import { Redis } from "../../src/layers/redis/Redis.ts"
import { cutProxy } from "../support/cutProxy.ts"
import { createGitLabSchema } from "../support/gitlabSchema.ts"
import { freshDatabase } from "../support/postgres.ts"
import { startSweeper } from "../support/processes.ts"
import { RedisTest, TestRedisUrl } from "../support/redis.ts"
import { deleteLease, runToEnd } from "./support.ts"

const BUILDS = 200
const PIPELINES = 20
const LEASE = "ci/stuck_builds/drop_canceling_worker"

/** A fresh GitLab-laid-out database: 200 builds stuck in canceling, in 20 pipelines; its URL. */
const gitlabDatabase = Effect.gen(function*() {
  const { url } = yield* freshDatabase
  yield* Effect.gen(function*() {
    yield* createGitLabSchema({ partitioned: true })
    yield* migrate
    const sql = yield* PgClient.PgClient
    yield* sql`INSERT INTO p_ci_pipelines (id, partition_id, project_id, status, lock_version)
      SELECT 1000 + p, 100, 10, 'running', 0 FROM generate_series(1, ${PIPELINES}) p`
    yield* sql`INSERT INTO p_ci_builds (id, partition_id, project_id, commit_id, type, status, created_at, updated_at,
        lock_version)
      SELECT g, 100, 10, 1000 + 1 + g % ${PIPELINES}, 'Ci::Build', 'canceling',
        '2026-01-01 00:00:00'::timestamp + g * interval '1 second', '2026-01-01 00:00:00', 0
      FROM generate_series(1, ${BUILDS}) g`
  }).pipe(Effect.provide(layerServer(Redacted.make(url))))
  return url
})

const onDatabase = (url: string) => <A, E>(effect: Effect.Effect<A, E, PgClient.PgClient>) =>
  Effect.scoped(Effect.provide(effect, layerServer(Redacted.make(url))))

/** Runs the batch as a process, SIGKILLs it once `cut` has happened, and waits for it to die. */
const killAtCut = (env: Record<string, string>, cut: Promise<void>) =>
  Effect.promise(async () => {
    const child = startSweeper("killed", env, ["run", "drop-canceling-builds", "--json"])
    await Promise.race([
      cut,
      child.exited.then((code) => Promise.reject(new Error(`exited (${code}) before the cut:\n${child.output()}`)))
    ])
    child.child.kill("SIGKILL")
    return await child.exited
  })

/** The queue's jobs and the outbox after the final run: each build finished once, each pipeline processed. */
const checkExactlyOnce = (url: string) =>
  Effect.gen(function*() {
    const redis = yield* Redis
    const raw = yield* Effect.orDie(redis.use("test.lrange", (c) => c.lrange("queue:default", 0, -1)))
    const jobs = raw.map((payload) => JSON.parse(payload) as SidekiqJob)
    const finished = jobs.filter((j) => j.class === "Ci::BuildFinishedWorker").map((j) => Number(j.args[0]))
    assert.strictEqual(finished.length, BUILDS, "one Ci::BuildFinishedWorker per build, none twice")
    assert.deepStrictEqual(finished.toSorted((a, b) => a - b), Array.from({ length: BUILDS }, (_, i) => i + 1))
    const processed = new Set(jobs.filter((j) => j.class === "PipelineProcessWorker").map((j) => Number(j.args[0])))
    assert.deepStrictEqual([...processed].toSorted(), Array.from({ length: PIPELINES }, (_, i) => 1001 + i))
    const left = yield* onDatabase(url)(Effect.flatMap(PgClient.PgClient, (sql) =>
      sql<{ outbox: string; failed: string }>`SELECT (SELECT count(*) FROM sweeper_job_outbox_batches) AS outbox,
        (SELECT count(*) FROM p_ci_builds WHERE status = 'failed' AND lock_version = 1) AS failed`))
    assert.deepStrictEqual([Number(left[0]!.outbox), Number(left[0]!.failed)], [0, BUILDS])
  })

describe("kill -9 around the push of a drop's jobs", () => {
  it.live("between the commit and the push: no job lost, none twice", () =>
    Effect.gen(function*() {
      const url = yield* gitlabDatabase
      const redisUrl = new URL(yield* TestRedisUrl)
      const proxy = yield* cutProxy({ host: redisUrl.hostname, port: Number(redisUrl.port || 6379) })
      // The first push of a job batch never reaches Redis: its marker key names it.
      proxy.cutOn(Buffer.from("sweeper:job_outbox:"), 1)
      const proxied = new URL(redisUrl)
      proxied.port = String(proxy.port)
      const env = { DATABASE_URL: url, SWEEPER_DROP_BATCH_SIZE: "50" }
      yield* killAtCut({ ...env, REDIS_URL: proxied.toString() }, proxy.cut)
      const owed = yield* onDatabase(url)(
        Effect.flatMap(PgClient.PgClient, (sql) =>
          sql<{ n: string }>`SELECT count(*) AS n FROM sweeper_job_outbox_batches`)
      )
      assert.isAbove(Number(owed[0]!.n), 0, "the killed run had committed jobs it never pushed")

      yield* deleteLease(LEASE)
      const last = yield* runToEnd("drop-canceling-builds", { ...env, REDIS_URL: redisUrl.toString() })
      assert.strictEqual(last.output.outcome, "succeeded", last.stderr)
      yield* checkExactlyOnce(url)
    }).pipe(Effect.scoped, Effect.provide(Layer.fresh(RedisTest))), 180_000)

  it.live(
    "between the push and the outbox's DELETE: the pushed batch is not pushed again",
    () =>
      Effect.gen(function*() {
        const url = yield* gitlabDatabase
        const target = new URL(url)
        const proxy = yield* cutProxy({ host: target.hostname, port: Number(target.port || 5432) })
        proxy.cutOn(Buffer.from("DELETE FROM sweeper_job_outbox_batches"), 1)
        const proxied = new URL(url)
        proxied.port = String(proxy.port)
        const redisUrl = yield* TestRedisUrl
        const env = { REDIS_URL: redisUrl, SWEEPER_DROP_BATCH_SIZE: "50" }
        yield* killAtCut({ ...env, DATABASE_URL: proxied.toString() }, proxy.cut)
        const redis = yield* Redis
        const pushed = yield* Effect.orDie(redis.use("test.llen", (c) => c.llen("queue:default")))
        assert.isAbove(pushed, 0, "the killed run's first batch reached Redis before its DELETE")

        yield* deleteLease(LEASE)
        const last = yield* runToEnd("drop-canceling-builds", { ...env, DATABASE_URL: url })
        assert.strictEqual(last.output.outcome, "succeeded", last.stderr)
        yield* checkExactlyOnce(url)
      }).pipe(Effect.scoped, Effect.provide(Layer.fresh(RedisTest))),
    180_000
  )
})
