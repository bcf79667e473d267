/**
 * Interop with a real Sidekiq (Debian's `ruby-sidekiq`, Sidekiq 6.4): the jobs Sweeper enqueues —
 * rebalancing jobs from reschedule-stuck-issue-rebalances, resumed jobs from
 * concurrency-limit-resume, and the jobs GitLab's transition pushes after a build is dropped
 * (PipelineProcessWorker, Ci::BuildFinishedWorker, AssignResourceFromResourceGroupWorker, here on
 * their own queues) — are run by Sidekiq with GitLab's class and args, and none of them lands in
 * Sidekiq's `retry` or `dead` set. The stand-in workers, named like GitLab's, record what they ran
 * to a Redis list; Sidekiq runs on the test's claimed Redis db and is always stopped afterwards.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Redacted } from "effect"
import { type ChildProcess, spawn, spawnSync } from "node:child_process"
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { workerKeys } from "../../src/domain/ConcurrencyLimit.ts"
import type { SidekiqJob } from "../../src/domain/Sidekiq.ts"
import { WORKER_QUEUES } from "../../src/domain/TransitionJobs.ts"
import { migrate } from "../../src/layers/postgres/Migrations.ts"
import { layerServer } from "../../src/layers/postgres/Postgres.ts"
import { Redis } from "../../src/layers/redis/Redis.ts"
import { runCli } from "../support/cli.ts"
import { createGitLabSchema } from "../support/gitlabSchema.ts"
import { freshDatabase, PgTest, TestDatabaseUrl } from "../support/postgres.ts"
import { waitFor } from "../support/processes.ts"
import { RedisTest, TestRedisUrl } from "../support/redis.ts"

const RAN = "interop:ran"
const EVIDENCE = "Releases::CreateEvidenceWorker"

/** GitLab's two worker classes, as far as Sidekiq needs them: run, and record class, args and jid. */
const WORKERS_RB = `
require "sidekiq"
require "json"

module Recording
  def perform(*args)
    Sidekiq.redis { |r| r.rpush("${RAN}", JSON.generate({ "class" => self.class.name, "args" => args, "jid" => jid })) }
  end
end

module Issues
  class RebalancingWorker
    include Sidekiq::Worker
    include Recording
  end
end

module Releases
  class CreateEvidenceWorker
    include Sidekiq::Worker
    include Recording
  end
end

class PipelineProcessWorker
  include Sidekiq::Worker
  include Recording
end

module Ci
  class BuildFinishedWorker
    include Sidekiq::Worker
    include Recording
  end

  module ResourceGroups
    class AssignResourceFromResourceGroupWorker
      include Sidekiq::Worker
      include Recording
    end
  end
end
`

interface Ran {
  readonly class: string
  readonly args: ReadonlyArray<unknown>
  readonly jid: string
}

const redisCall = <A>(f: (client: Redis["Service"]["client"]) => Promise<A>) =>
  Effect.flatMap(Redis, (redis) => Effect.orDie(redis.use("test", f)))

/** A Sidekiq process on the test's Redis db, stopped (TERM, then KILL) when the scope closes. */
const sidekiq = (redisUrl: string, queues: ReadonlyArray<string>) =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const dir = mkdtempSync(join(tmpdir(), "sweeper-sidekiq-"))
      writeFileSync(join(dir, "workers.rb"), WORKERS_RB)
      let output = ""
      const child: ChildProcess = spawn(
        "sidekiq",
        ["-r", join(dir, "workers.rb"), ...queues.flatMap((q) => ["-q", q]), "-c", "2", "-t", "1"],
        {
          cwd: dir,
          env: { PATH: process.env.PATH ?? "", HOME: process.env.HOME ?? "/tmp", REDIS_URL: redisUrl },
          stdio: ["ignore", "pipe", "pipe"]
        }
      )
      child.stdout!.on("data", (chunk: Buffer) => (output += chunk.toString()))
      child.stderr!.on("data", (chunk: Buffer) => (output += chunk.toString()))
      const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()))
      return { child, dir, exited, output: () => output }
    }),
    ({ child, dir, exited }) =>
      Effect.promise(async () => {
        if (child.exitCode === null && child.signalCode === null) {
          child.kill("SIGTERM")
          const stopped = await Promise.race([
            exited.then(() => true),
            new Promise<boolean>((r) => setTimeout(() => r(false), 8_000))
          ])
          if (!stopped) {
            child.kill("SIGKILL")
            await exited
          }
        }
        rmSync(dir, { recursive: true, force: true })
      })
  )

describe("Sidekiq runs what Sweeper enqueues (real Sidekiq 6, Redis, PostgreSQL)", () => {
  it.live(
    "rebalancing and resumed jobs run with GitLab's class and args; nothing in retry or dead",
    () =>
      Effect.gen(function*() {
        const version = spawnSync("ruby", ["-e", "require 'sidekiq'; print Sidekiq::VERSION"], { encoding: "utf8" })
        assert.strictEqual(version.status, 0, `ruby-sidekiq is missing (.ci/run installs it): ${version.stderr}`)

        const sql = yield* PgClient.PgClient
        yield* sql`INSERT INTO namespaces (id, name, path, type) VALUES (10, 'gitlab-org', 'gitlab-org', 'Group')`
        yield* sql`INSERT INTO projects (id, namespace_id, name, path) VALUES (20, 10, 'gitlab', 'gitlab')`
        yield* redisCall((c) => c.sadd("gitlab:issues-position-rebalances:running_rebalances", "1/10", "2/20"))
        const deferred = [
          {
            args: [101, "gid://gitlab/Release/101"],
            context: { "meta.project": "gitlab-org/gitlab" },
            buffered_at: 1772366400.25
          },
          {
            args: [102, { nested: [1.5, null, "é"] }, []],
            context: { "meta.caller_id": "ReleasesController#create" },
            buffered_at: 1772366401.5
          },
          { args: [103] }
        ]
        yield* redisCall((c) => c.rpush(workerKeys(EVIDENCE).deferred, ...deferred.map((d) => JSON.stringify(d))))

        const redisUrl = yield* TestRedisUrl
        const env = {
          DATABASE_URL: yield* TestDatabaseUrl,
          REDIS_URL: redisUrl,
          SWEEPER_CONCURRENCY_LIMITS: JSON.stringify({ [EVIDENCE]: { limit: 10, queue: "default" } })
        }
        for (const batch of ["reschedule-stuck-issue-rebalances", "concurrency-limit-resume"]) {
          const result = yield* Effect.promise(() => runCli(["run", batch, "--json", "--budget", "3s"], env))
          assert.strictEqual(result.code, 0, `${result.stderr}\n${result.stdout}`)
          assert.include(result.stdout, `"outcome":"succeeded"`, result.stdout)
        }
        const enqueued = [
          ...(yield* redisCall((c) => c.lrange("queue:issues_rebalancing", 0, -1))),
          ...(yield* redisCall((c) => c.lrange("queue:default", 0, -1)))
        ].map((raw) => JSON.parse(raw) as SidekiqJob)
        assert.lengthOf(enqueued, 5)

        const worker = yield* sidekiq(redisUrl, ["issues_rebalancing", "default"])
        const client = (yield* Redis).client
        const ran = yield* Effect.promise(() =>
          waitFor(
            `Sidekiq to run 5 jobs\n${worker.output()}`,
            async () => {
              const all = await client.lrange(RAN, 0, -1)
              return all.length >= 5
                ? all.map((raw) => JSON.parse(raw) as Ran)
                : undefined
            },
            20_000,
            200
          )
        ).pipe(Effect.catchDefect((e) => Effect.die(new Error(`${String(e)}\n${worker.output()}`))))

        // Each enqueued job ran exactly once, with its class, args and jid as Sweeper wrote them.
        const byJid = (jobs: ReadonlyArray<{ jid: string }>) => jobs.map((j) => j.jid).toSorted()
        assert.deepStrictEqual(byJid(ran), byJid(enqueued))
        for (const job of enqueued) {
          const run = ran.find((r) => r.jid === job.jid)!
          assert.strictEqual(run.class, job.class)
          assert.deepStrictEqual(run.args, job.args)
        }
        assert.deepStrictEqual(
          ran.filter((r) => r.class === "Issues::RebalancingWorker").map((r) => r.args).toSorted(),
          [[null, 20, null], [null, null, 10]].toSorted()
        )
        assert.deepStrictEqual(
          ran.filter((r) => r.class === EVIDENCE).map((r) => r.args).toSorted((a, b) =>
            (a[0] as number) - (b[0] as number)
          ),
          deferred.map((d) => d.args)
        )
        assert.strictEqual(yield* redisCall((c) => c.zcard("retry")), 0, worker.output())
        assert.strictEqual(yield* redisCall((c) => c.zcard("dead")), 0, worker.output())
        assert.strictEqual(yield* redisCall((c) => c.llen("queue:default")), 0)
        assert.strictEqual(yield* redisCall((c) => c.llen("queue:issues_rebalancing")), 0)
      }).pipe(Effect.scoped, Effect.provide(Layer.mergeAll(PgTest, RedisTest))),
    90_000
  )

  it.live(
    "a dropped build's jobs, on GitLab's DDL: each stand-in worker runs once per pipeline, build and resource group",
    () =>
      Effect.gen(function*() {
        const { url } = yield* freshDatabase
        // GitLab's own tables (p_ci_builds, p_ci_pipelines, the queue tables), Sweeper's migrated beside.
        yield* Effect.gen(function*() {
          yield* createGitLabSchema({ partitioned: true })
          yield* migrate
          const sql = yield* PgClient.PgClient
          for (const pipeline of [700, 701]) {
            yield* sql`INSERT INTO p_ci_pipelines (id, partition_id, project_id, status, lock_version)
              VALUES (${pipeline}, 100, 10, 'running', 0)`
          }
          yield* sql`INSERT INTO ci_resource_groups (id, project_id, key, created_at, updated_at)
            VALUES (9, 10, 'production', now(), now())`
          // Two builds stuck in canceling in pipeline 700 (one holding the resource), one stale running
          // build in 701 with its running-build row.
          yield* sql`INSERT INTO p_ci_builds (id, partition_id, project_id, commit_id, type, status, created_at,
            updated_at, lock_version, runner_id, resource_group_id) VALUES
            (1, 100, 10, 700, 'Ci::Build', 'canceling', now() - interval '3 hours', now() - interval '3 hours', 0, 4, 9),
            (2, 100, 10, 700, 'Ci::Build', 'canceling', now() - interval '3 hours', now() - interval '3 hours', 0, 4, NULL),
            (3, 100, 10, 701, 'Ci::Build', 'running', now() - interval '3 hours', now() - interval '3 hours', 0, 4, NULL)`
          yield* sql`INSERT INTO ci_resources (resource_group_id, build_id, partition_id, project_id, created_at, updated_at)
            VALUES (9, 1, 100, 10, now(), now())`
          yield* sql`INSERT INTO ci_running_builds (build_id, project_id, runner_id, runner_type, partition_id)
            VALUES (3, 10, 4, 1, 100)`
        }).pipe(Effect.provide(layerServer(Redacted.make(url))))

        const redisUrl = yield* TestRedisUrl
        const env = { DATABASE_URL: url, REDIS_URL: redisUrl, SWEEPER_TRANSITION_QUEUES: "worker" }
        for (const batch of ["drop-canceling-builds", "drop-running-builds"]) {
          const result = yield* Effect.promise(() => runCli(["run", batch, "--json", "--budget", "10s"], env))
          assert.strictEqual(result.code, 0, `${result.stderr}\n${result.stdout}`)
          assert.include(result.stdout, `"outcome":"succeeded"`, result.stdout)
        }
        const queues = Object.values(WORKER_QUEUES)
        const enqueued: Array<SidekiqJob> = []
        for (const queue of queues) {
          enqueued.push(
            ...(yield* redisCall((c) => c.lrange(`queue:${queue}`, 0, -1))).map((raw) => JSON.parse(raw) as SidekiqJob)
          )
        }
        assert.lengthOf(enqueued, 6, JSON.stringify(enqueued))

        const worker = yield* sidekiq(redisUrl, queues)
        const client = (yield* Redis).client
        const ran = yield* Effect.promise(() =>
          waitFor(
            `Sidekiq to run 6 jobs\n${worker.output()}`,
            async () => {
              const all = await client.lrange(RAN, 0, -1)
              return all.length >= 6 ? all.map((raw) => JSON.parse(raw) as Ran) : undefined
            },
            20_000,
            200
          )
        ).pipe(Effect.catchDefect((e) => Effect.die(new Error(`${String(e)}\n${worker.output()}`))))
        assert.deepStrictEqual(
          ran.map((r) => `${r.class} ${JSON.stringify(r.args)}`).toSorted(),
          [
            "Ci::BuildFinishedWorker [1]",
            "Ci::BuildFinishedWorker [2]",
            "Ci::BuildFinishedWorker [3]",
            "Ci::ResourceGroups::AssignResourceFromResourceGroupWorker [9]",
            "PipelineProcessWorker [700]",
            "PipelineProcessWorker [701]"
          ]
        )
        const byJid = (jobs: ReadonlyArray<{ jid: string }>) => jobs.map((j) => j.jid).toSorted()
        assert.deepStrictEqual(byJid(ran), byJid(enqueued))
        for (const job of enqueued) {
          assert.strictEqual(job.queue, WORKER_QUEUES[job.class as keyof typeof WORKER_QUEUES])
          assert.strictEqual(job.retry, 3)
        }
        assert.strictEqual(yield* redisCall((c) => c.zcard("retry")), 0, worker.output())
        assert.strictEqual(yield* redisCall((c) => c.zcard("dead")), 0, worker.output())
      }).pipe(Effect.scoped, Effect.provide(RedisTest)),
    90_000
  )
})
