/**
 * Connections cut under a running batch (issue 7): the servers stay up, only the CLI's connections
 * die. PostgreSQL: its backends are terminated (`pg_terminate_backend`, SQLSTATE 57P01, a ROLLBACK
 * on a dead connection) — the run guard retries and the run succeeds. Redis: its connections are
 * killed (`CLIENT KILL`), ioredis reconnects — the run goes on (or is retried) and succeeds.
 * Every repair keeps its event either way.
 */
import { assert, describe, it } from "@effect/vitest"
import { PgClient } from "@effect/sql-pg"
import { Effect, Layer } from "effect"
import { existsSync } from "node:fs"
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { PENDING_DIRECT_UPLOADS_KEY } from "../../src/domain/DirectUpload.ts"
import { Redis } from "../../src/layers/Redis.ts"
import { seedStuckCancelingBuilds } from "../../src/simulator/Fixtures.ts"
import { PgTest, TestDatabaseUrl } from "../support/postgres.ts"
import { RedisTest, TestRedisUrl } from "../support/redis.ts"
import { countEvents, eventsPerStream, startRun, untilEvents } from "./support.ts"

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
  it.live("PostgreSQL backends terminated mid-run (57P01): the run is retried and succeeds, one event per build", () =>
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

      const failed = yield* sql<{ n: string }>`SELECT count(*) AS n FROM ci_builds WHERE status = 'failed' AND lock_version = 1`
      assert.strictEqual(Number(failed[0]!.n), STUCK)
      const events = yield* eventsPerStream("BuildDropped")
      assert.strictEqual(events.size, STUCK)
      assert.isTrue([...events.values()].every((n) => n === 1), "exactly one BuildDropped per build")
      const runs = yield* sql<{ outcome: string }>`SELECT data->>'outcome' AS outcome FROM sweeper_events WHERE type = 'RunFinished'`
      assert.deepStrictEqual(runs.map((r) => r.outcome), ["succeeded"])
      console.log("[fault] pg_terminate_backend", JSON.stringify({ terminatedBackends: terminated, builds: STUCK, events: STUCK }))
    }).pipe(Effect.provide(Platform())), 120_000)

  it.live("Redis connections killed mid-run (CLIENT KILL): the run goes on and succeeds, every deletion recorded", () =>
    Effect.gen(function*() {
      const STALE = 3000
      const root = yield* Effect.acquireRelease(
        Effect.promise(() => mkdtemp(join(tmpdir(), "sweeper-fault-objects-"))),
        (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true }))
      )
      yield* Effect.promise(() => mkdir(join(root, "u"), { recursive: true }))
      const nowSeconds = Math.floor(Date.now() / 1000)
      const entries: Record<string, string> = {}
      for (let i = 0; i < STALE; i++) {
        entries[`artifacts:u/${i}`] = String(nowSeconds - 4 * 3600)
        yield* Effect.promise(() => writeFile(join(root, `u/${i}`), "half an upload"))
      }
      entries["artifacts:u/fresh"] = String(nowSeconds - 60)
      yield* Effect.promise(() => writeFile(join(root, "u/fresh"), "an upload in progress"))
      const redis = yield* Redis
      yield* redis.use("test.hset", (client) => client.hset(PENDING_DIRECT_UPLOADS_KEY, entries))
      const db = Number(new URL(yield* TestRedisUrl).pathname.slice(1))
      const ownId = yield* redis.use("test.client-id", (client) => client.client("ID"))

      /** Kills every connection on our Redis db except the test's own: the CLI's. */
      const killVictims = redis.use("test.client-kill", async (client) => {
        const list = String(await client.client("LIST"))
        const victims = list.split("\n")
          .map((line) => Object.fromEntries(line.trim().split(" ").map((pair) => pair.split("=") as [string, string])))
          .filter((c) => c.db === String(db) && c.id !== undefined && Number(c.id) !== Number(ownId))
        for (const victim of victims) await client.client("KILL", "ID", victim.id!)
        return victims.length
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

      assert.deepStrictEqual(yield* redis.use("test.hgetall", (client) => client.hgetall(PENDING_DIRECT_UPLOADS_KEY)), {
        "artifacts:u/fresh": entries["artifacts:u/fresh"]!
      })
      const events = yield* eventsPerStream("StaleDirectUploadDeleted")
      for (let i = 0; i < STALE; i++) {
        assert.isAtLeast(events.get(`direct_upload:artifacts:u/${i}`) ?? 0, 1, `upload ${i}`)
        assert.isFalse(existsSync(join(root, `u/${i}`)))
      }
      assert.isTrue(existsSync(join(root, "u/fresh")))
      console.log("[fault] CLIENT KILL", JSON.stringify({
        killedConnections: killed,
        uploads: STALE,
        events: yield* countEvents("StaleDirectUploadDeleted")
      }))
    }).pipe(Effect.provide(Platform())), 120_000)
})
