/**
 * concurrency-limit-resume against bad keys in a real Redis, through the CLI
 * as an operator runs it: a deferred element holding a 0xFF byte no longer blocks its worker (it goes
 * to the dead list byte for byte, the jobs around it are resumed), and a key of the wrong type
 * fails only its own worker — reported once in the summary and the log, never retried — while every
 * other worker is resumed as usual.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { workerKeys } from "../../src/domain/ConcurrencyLimit.ts"
import type { SidekiqJob } from "../../src/domain/Sidekiq.ts"
import { Redis } from "../../src/layers/redis/Redis.ts"
import { runCli } from "../support/cli.ts"
import { PgTest, TestDatabaseUrl } from "../support/postgres.ts"
import { RedisTest, TestRedisUrl } from "../support/redis.ts"

const GOOD = "Releases::CreateEvidenceWorker"
const BYTES = "Namespaces::ProcessSyncEventsWorker"
const WRONG_LIST = "Geo::VerificationBatchWorker"
const WRONG_LIMIT = "Projects::ImportExportWorker"
const LIMITS = {
  [GOOD]: { limit: 0 },
  [BYTES]: { limit: 0, queue: "low" },
  [WRONG_LIMIT]: { limit: 0 }
}

const element = (i: number) =>
  JSON.stringify({ args: [i, `gid://gitlab/Release/${i}`], context: {}, buffered_at: 1772366400 + i })

const redis = <A>(f: (client: Redis["Service"]["client"]) => Promise<A>) =>
  Effect.flatMap(Redis, (r) => Effect.promise(() => f(r.client)))

describe("concurrency-limit-resume with bad keys beside good ones (real Redis, CLI)", () => {
  it.live(
    "0xFF elements go to the dead list byte-exact; wrong-type keys skip only their worker, once, not retried",
    () =>
      Effect.gen(function*() {
        const ff = Buffer.concat([
          Buffer.from("{\"args\":[\"caf"),
          Buffer.from([0xff]),
          Buffer.from("\"],\"context\":{}}")
        ])
        yield* redis(async (c) => {
          await c.rpush(workerKeys(GOOD).deferred, element(0), element(1))
          await c.rpush(workerKeys(BYTES).deferred, Buffer.from(element(10)), ff, Buffer.from(element(11)))
          // A string where GitLab keeps a list (discovered by SCAN, not configured)…
          await c.set(workerKeys(WRONG_LIST).deferred, "not a list")
          // …and a hash where GitLab keeps the limit override of a configured worker with jobs.
          await c.rpush(workerKeys(WRONG_LIMIT).deferred, element(20))
          await c.hset(workerKeys(WRONG_LIMIT).currentLimit, { limit: "3" })
        })
        const env = {
          DATABASE_URL: yield* TestDatabaseUrl,
          REDIS_URL: yield* TestRedisUrl,
          SWEEPER_CONCURRENCY_LIMITS: JSON.stringify(LIMITS)
        }
        const result = yield* Effect.promise(() =>
          runCli(["run", "concurrency-limit-resume", "--json", "--budget", "3s"], env)
        )
        assert.strictEqual(result.code, 0, `${result.stderr}\n${result.stdout}`)
        const output = JSON.parse(result.stdout.trim().split("\n").at(-1)!) as {
          outcome: string
          summary: {
            workers: Array<{ worker: string; resumed: number }>
            failedWorkers: Array<{ worker: string; key: string; error: string }>
          }
        }
        assert.strictEqual(output.outcome, "succeeded")
        assert.deepStrictEqual(
          output.summary.workers.map((w) => [w.worker, w.resumed]).sort(),
          [[BYTES, 2], [GOOD, 2]]
        )
        assert.deepStrictEqual(output.summary.failedWorkers.map((f) => [f.worker, f.key]).sort(), [
          [WRONG_LIST, workerKeys(WRONG_LIST).deferred],
          [WRONG_LIMIT, workerKeys(WRONG_LIMIT).currentLimit]
        ])
        for (const failure of output.summary.failedWorkers) assert.match(failure.error, /^WRONGTYPE/)
        // One error line per bad worker, naming its key: the pass was not retried.
        const all = `${result.stdout}\n${result.stderr}`
        for (
          const [worker, key] of [[WRONG_LIST, workerKeys(WRONG_LIST).deferred], [
            WRONG_LIMIT,
            workerKeys(WRONG_LIMIT).currentLimit
          ]]
        ) {
          const lines = all.split("\n").filter((line) => line.includes(`skipped worker ${worker}`))
          assert.lengthOf(lines, 1, all)
          assert.include(lines[0], key)
        }

        const dead = yield* redis((c) => c.lrangeBuffer(workerKeys(BYTES).dead, 0, -1))
        assert.deepStrictEqual(dead.map((b) => b.toString("hex")), [ff.toString("hex")])
        const low = yield* redis((c) => c.lrange("queue:low", 0, -1))
        assert.deepStrictEqual(low.map((raw) => (JSON.parse(raw) as SidekiqJob).args[0]).toReversed(), [10, 11])
        assert.strictEqual(yield* redis((c) => c.llen(workerKeys(BYTES).deferred)), 0)
        // The bad keys are left exactly as they were, the wrong worker's jobs untouched.
        assert.strictEqual(yield* redis((c) => c.get(workerKeys(WRONG_LIST).deferred)), "not a list")
        assert.deepStrictEqual(yield* redis((c) => c.lrange(workerKeys(WRONG_LIMIT).deferred, 0, -1)), [element(20)])
      }).pipe(Effect.provide(Layer.mergeAll(PgTest, RedisTest))),
    60_000
  )
})
