/**
 * Connections cut under a running batch: the servers stay up, only the CLI's connections
 * die. PostgreSQL: its backends are terminated (`pg_terminate_backend`, SQLSTATE 57P01, a ROLLBACK
 * on a dead connection) — the run guard retries and the run succeeds. Redis: its connections are
 * killed (`CLIENT KILL`), ioredis reconnects — the run goes on (or is retried) and succeeds.
 * Every repair keeps its event either way. And the Redis that holds the lease cut off for good at a
 * lease check: the failed read stops the holder before its next write.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { existsSync } from "node:fs"
import { writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { PENDING_DIRECT_UPLOADS_KEY } from "../../src/domain/DirectUpload.ts"
import { leaseKey } from "../../src/domain/Lease.ts"
import { Redis } from "../../src/layers/redis/Redis.ts"
import { seedStuckCancelingBuilds } from "../../src/simulator/Fixtures.ts"
import { cutProxy, resp } from "../support/cutProxy.ts"
import { PgTest, TestDatabaseUrl } from "../support/postgres.ts"
import { RedisTest, TestRedisUrl } from "../support/redis.ts"
import { countEvents, deleteLease, eventsPerStream, seedStaleUploads, startRun, untilEvents } from "./support.ts"

const Platform = () => Layer.mergeAll(PgTest, RedisTest)
/** The CLI's connections carry this name, so the test cuts only them (not its own). */
const APPLICATION = "sweeper-fault-victim"

const env = Effect.gen(function*() {
  const database = new URL(yield* TestDatabaseUrl)
  database.searchParams.set("application_name", APPLICATION)
  return {
    DATABASE_URL: database.toString(),
    REDIS_URL: yield* TestRedisUrl,
    SWEEPER_DATA_DIR: join(tmpdir(), "sweeper-fault-data")
  }
})

describe("connection loss mid-run", () => {
  it.live(
    "PostgreSQL backends terminated mid-run (57P01): the run is retried and succeeds, one event per build",
    () =>
      Effect.gen(function*() {
        const STUCK = 1000
        const sql = yield* PgClient.PgClient
        yield* seedStuckCancelingBuilds(STUCK)

        const run = startRun("pg-victim", "drop-canceling-builds", yield* env)
        let terminated = 0
        // Twice, some repairs apart: each cut is one retry (three are allowed).
        for (const after of [0, 100]) {
          yield* untilEvents("BuildDropped", after)
          // MATERIALIZED: the filter must run before pg_terminate_backend, or it may end the test's own backend.
          const rows = yield* sql<{ pid: number }>`
          WITH victims AS MATERIALIZED (
            SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = ${APPLICATION})
          SELECT pid FROM victims WHERE pg_terminate_backend(pid)`
          terminated += rows.length
        }
        const result = yield* run.result
        assert.isAtLeast(terminated, 2, "the CLI's backends were terminated")
        assert.strictEqual(result.output.outcome, "succeeded", result.log)
        assert.strictEqual(result.code, 0)

        const failed = yield* sql<
          { n: string }
        >`SELECT count(*) AS n FROM ci_builds WHERE status = 'failed' AND lock_version = 1`
        assert.strictEqual(Number(failed[0]!.n), STUCK)
        const events = yield* eventsPerStream("BuildDropped")
        assert.strictEqual(events.size, STUCK)
        assert.isTrue([...events.values()].every((n) => n === 1), "exactly one BuildDropped per build")
        const runs = yield* sql<
          { outcome: string }
        >`SELECT data->>'outcome' AS outcome FROM sweeper_events WHERE type = 'RunFinished'`
        assert.deepStrictEqual(runs.map((r) => r.outcome), ["succeeded"])
        console.log(
          "[fault] pg_terminate_backend",
          JSON.stringify({ terminatedBackends: terminated, builds: STUCK, events: STUCK })
        )
      }).pipe(Effect.provide(Platform())),
    120_000
  )

  it.live(
    "Redis connections killed mid-run (CLIENT KILL): the run goes on and succeeds, every deletion recorded",
    () =>
      Effect.gen(function*() {
        const STALE = 3000
        const { root } = yield* seedStaleUploads(STALE)
        const fresh = String(Math.floor(Date.now() / 1000) - 60)
        yield* Effect.promise(() => writeFile(join(root, "u/fresh"), "an upload in progress"))
        const redis = yield* Redis
        yield* redis.use(
          "test.hset",
          (client) => client.hset(PENDING_DIRECT_UPLOADS_KEY, { "artifacts:u/fresh": fresh })
        )
        const db = Number(new URL(yield* TestRedisUrl).pathname.slice(1))
        const ownId = yield* redis.use("test.client-id", (client) => client.client("ID"))

        /**
         * Kills every connection on our Redis db except the test's own: the CLI's. A connection killed
         * a moment ago may still be reconnecting (ioredis backs off first), so it waits, up to 5 s, for
         * one to be there to kill.
         */
        const killVictims = redis.use("test.client-kill", async (client) => {
          const deadline = Date.now() + 5_000
          while (true) {
            const list = String(await client.client("LIST"))
            const victims = list.split("\n")
              .map((line) =>
                Object.fromEntries(line.trim().split(" ").map((pair) => pair.split("=") as [string, string]))
              )
              .filter((c) => c.db === String(db) && c.id !== undefined && Number(c.id) !== Number(ownId))
            for (const victim of victims) await client.client("KILL", "ID", victim.id!)
            if (victims.length > 0 || Date.now() > deadline) return victims.length
            await new Promise((resolve) => setTimeout(resolve, 5))
          }
        })

        const run = startRun("redis-victim", "delete-stale-direct-uploads", {
          ...(yield* env),
          SWEEPER_OBJECT_STORAGE: JSON.stringify({ artifacts: root })
        })
        let killed = 0
        // Step boundaries of the run (steps of 1, 8, 64, 512, then the rest): one kill in each of three steps.
        for (const after of [0, 10, 100]) {
          yield* untilEvents("StaleDirectUploadDeleted", after)
          killed += yield* killVictims
        }
        const result = yield* run.result
        assert.isAtLeast(killed, 3, "the CLI's Redis connections were killed")
        assert.strictEqual(result.output.outcome, "succeeded", result.log)

        assert.deepStrictEqual(
          yield* redis.use("test.hgetall", (client) => client.hgetall(PENDING_DIRECT_UPLOADS_KEY)),
          {
            "artifacts:u/fresh": fresh
          }
        )
        const events = yield* eventsPerStream("StaleDirectUploadDeleted")
        for (let i = 0; i < STALE; i++) {
          assert.isAtLeast(events.get(`direct_upload:artifacts:u/${i}`) ?? 0, 1, `upload ${i}`)
          assert.isFalse(existsSync(join(root, `u/${i}`)))
        }
        assert.isTrue(existsSync(join(root, "u/fresh")))
        console.log(
          "[fault] CLIENT KILL",
          JSON.stringify({
            killedConnections: killed,
            uploads: STALE,
            events: yield* countEvents("StaleDirectUploadDeleted")
          })
        )
      }).pipe(Effect.provide(Platform())),
    120_000
  )

  it.live(
    "the lease's Redis cut off at a lease check: the failed read stops the run before its next delete; a later run finishes",
    () =>
      Effect.gen(function*() {
        const STALE = 1000
        const LEASE = "sweeper/delete_stale_direct_uploads"
        const { root } = yield* seedStaleUploads(STALE)
        const redis = yield* Redis
        const direct = new URL(yield* TestRedisUrl)
        // The CLI reaches Redis (every store, the lease's included) only through the proxy.
        const proxy = yield* cutProxy({ host: direct.hostname, port: Number(direct.port === "" ? 6379 : direct.port) })
        // Steps grow 1, 8, 64, …, the lease checked (GET) before each: the third check is cut off,
        // after two steps (9 uploads) were repaired whole.
        proxy.cutOn(resp("get", leaseKey(LEASE)), 3)
        const runEnv = {
          ...(yield* env),
          REDIS_URL: `redis://127.0.0.1:${proxy.port}${direct.pathname}`,
          SWEEPER_OBJECT_STORAGE: JSON.stringify({ artifacts: root })
        }

        const run = startRun("lease-store-cut", "delete-stale-direct-uploads", runEnv)
        yield* Effect.promise(() => proxy.cut)
        // The store stays down while the guard retries (each attempt waits out ioredis's reconnects)
        // until the run has failed; back up then, so the holder's exit (lease release, QUIT) is quick.
        yield* untilEvents("RunFinished", 0, 90_000)
        yield* Effect.promise(() => proxy.restore())
        const result = yield* run.result
        assert.strictEqual(result.output.outcome, "failed", result.log)
        // Nothing was written on the unknown lease: an object is gone exactly when its entry is.
        const left = yield* redis.use("test.hgetall", (client) => client.hgetall(PENDING_DIRECT_UPLOADS_KEY))
        const deletedObjects: Array<number> = []
        for (let i = 0; i < STALE; i++) {
          const objectGone = !existsSync(join(root, `u/${i}`))
          if (objectGone) deletedObjects.push(i)
          assert.strictEqual(
            objectGone,
            left[`artifacts:u/${i}`] === undefined,
            `upload ${i}: object deleted only with its entry`
          )
        }
        assert.lengthOf(deletedObjects, 1 + 8, "the two steps before the cut, none after")
        assert.strictEqual(yield* countEvents("StaleDirectUploadDeleted"), 1 + 8)

        const sql = yield* PgClient.PgClient
        const finished = yield* sql<{ reason: string | null; error: string | null }>`
        SELECT data->>'reason' AS reason, data->>'error' AS error FROM sweeper_events
        WHERE type = 'RunFinished' AND run_id = ${result.output.runId}`
        assert.lengthOf(finished, 1)
        assert.isNull(finished[0]!.reason, "an unknown lease is not a lost one")
        // Transient, so the guard retried: the last attempt failed at its first Redis call (HLEN).
        assert.include(finished[0]!.error ?? "", "HLEN pending_direct_uploads", result.log)
        assert.include(result.log, "Lease check failed")

        // The next run repairs the rest (the failed holder's lease may have outlived it: gone first).
        yield* deleteLease(LEASE)
        const next = yield* startRun("lease-store-back", "delete-stale-direct-uploads", runEnv).result
        assert.strictEqual(next.output.outcome, "succeeded", next.log)
        assert.deepStrictEqual(
          yield* redis.use("test.hgetall", (client) => client.hgetall(PENDING_DIRECT_UPLOADS_KEY)),
          {}
        )
        for (let i = 0; i < STALE; i++) assert.isFalse(existsSync(join(root, `u/${i}`)))
        assert.strictEqual((yield* eventsPerStream("StaleDirectUploadDeleted")).size, STALE)
        console.log(
          "[fault] lease store cut",
          JSON.stringify({ uploads: STALE, deletedBeforeCut: deletedObjects.length })
        )
      }).pipe(Effect.provide(Platform())),
    150_000
  )
})
