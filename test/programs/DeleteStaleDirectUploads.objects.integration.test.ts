/**
 * delete-stale-direct-uploads against real object stores: GitLab's consolidated
 * `SWEEPER_OBJECT_STORAGE` pointing at s3rver (S3) or azurite (Azure Blob) on loopback, objects
 * seeded through the vendors' SDKs, `pending_direct_uploads` in a real Redis, events in a real
 * PostgreSQL, and the CLI run as an operator would.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, type Scope } from "effect"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { PENDING_DIRECT_UPLOADS_KEY } from "../../src/domain/DirectUpload.ts"
import { Redis } from "../../src/layers/redis/Redis.ts"
import { runCli } from "../support/cli.ts"
import { AZURITE_ACCOUNT, S3RVER_KEY, startAzurite, startS3rver } from "../support/objectServers.ts"
import { PgTest, TestDatabaseUrl } from "../support/postgres.ts"
import { RedisTest, TestRedisUrl } from "../support/redis.ts"

const NOW = "2026-01-01T05:00:00Z"
const NOW_SECONDS = Date.parse(NOW) / 1000
const STALE = String(NOW_SECONDS - 4 * 3600)
const FRESH = String(NOW_SECONDS - 600)

const Platform = () => Layer.mergeAll(PgTest, RedisTest)

/** What the scenario needs from a store: buckets, seeding and listing, and its connection JSON. */
interface Store {
  readonly createBucket: (bucket: string) => Effect.Effect<void>
  readonly put: (bucket: string, key: string) => Effect.Effect<void>
  readonly list: (bucket: string) => Effect.Effect<ReadonlyArray<string>>
  /** GitLab's `connection` object; `badKey` gives credentials the server refuses. */
  readonly connection: (badKey: boolean) => Record<string, unknown>
}

const s3Store = Effect.map(startS3rver, (s3): Store => ({
  createBucket: s3.createBucket,
  put: s3.put,
  list: s3.list,
  connection: (badKey) => ({
    provider: "AWS",
    region: "us-east-1",
    // s3rver checks the key id, not SigV4 signatures.
    aws_access_key_id: badKey ? "NOT-A-KEY" : S3RVER_KEY.accessKeyId,
    aws_secret_access_key: S3RVER_KEY.secretAccessKey,
    endpoint: s3.endpoint,
    path_style: true
  })
}))

const azureStore = Effect.map(startAzurite, (azure): Store => ({
  createBucket: azure.createContainer,
  put: azure.put,
  list: azure.list,
  connection: (badKey) => ({
    provider: "AzureRM",
    azure_storage_account_name: AZURITE_ACCOUNT.name,
    azure_storage_access_key: badKey ? Buffer.from("not the key").toString("base64") : AZURITE_ACCOUNT.key,
    endpoint: azure.serviceUrl
  })
}))

const hset = (entries: Record<string, string>) =>
  Effect.flatMap(Redis, (redis) => redis.use("test.hset", (c) => c.hset(PENDING_DIRECT_UPLOADS_KEY, entries)))

const hgetall = Effect.flatMap(
  Redis,
  (redis) => redis.use("test.hgetall", (c) => c.hgetall(PENDING_DIRECT_UPLOADS_KEY))
)

const streamsOf = (type: string) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const rows = yield* sql<{ stream: string }>`SELECT stream FROM sweeper_events WHERE type = ${type} ORDER BY id`
    return rows.map((row) => row.stream).sort()
  })

const deletedStreams = streamsOf("StaleDirectUploadDeleted")

const runWith = (objectStorage: unknown) =>
  Effect.gen(function*() {
    const env = {
      DATABASE_URL: yield* TestDatabaseUrl,
      REDIS_URL: yield* TestRedisUrl,
      SWEEPER_DATA_DIR: join(tmpdir(), "sweeper-it-data"),
      SWEEPER_OBJECT_STORAGE: JSON.stringify(objectStorage)
    }
    const result = yield* Effect.promise(() =>
      runCli(["run", "delete-stale-direct-uploads", "--json", "--now", NOW], env)
    )
    assert.strictEqual(result.code, 0, `${result.stderr}\n${result.stdout}`)
    return {
      ...(JSON.parse(result.stdout.trim()) as { outcome: string; summary: Record<string, unknown> }),
      stderr: result.stderr
    }
  })

const scenario = (name: string, store: Effect.Effect<Store, never, Scope.Scope>) =>
  describe(`sweeper run delete-stale-direct-uploads on ${name} (real Redis + PostgreSQL, CLI)`, () => {
    it.live(
      "stale objects and their fields go; fresh ones, other keys and the same path outside the prefix stay; no store → skippedNoStore",
      () =>
        Effect.gen(function*() {
          const s = yield* store
          yield* s.createBucket("artifacts")
          yield* s.createBucket("gitlab")
          for (const key of ["tmp/stale-1", "tmp/fresh"]) yield* s.put("artifacts", key)
          // uploads live under the prefix "uploads/" of the shared bucket "gitlab".
          for (const key of ["uploads/tmp/stale-2", "uploads/tmp/fresh-2", "tmp/stale-2", "other/x"]) {
            yield* s.put("gitlab", key)
          }
          const kept = {
            "artifacts:tmp/fresh": FRESH,
            "uploads:tmp/fresh-2": FRESH,
            // Refused (it would climb out of the prefix): counted as a failed delete, field kept.
            "uploads:../tmp/stale-2": STALE
          }
          yield* hset({
            ...kept,
            "artifacts:tmp/stale-1": STALE,
            "artifacts:tmp/already-gone": STALE,
            "uploads:tmp/stale-2": STALE,
            "lfs:tmp/no-store": STALE
          })

          const result = yield* runWith({
            connection: s.connection(false),
            objects: { artifacts: { bucket: "artifacts" }, uploads: { bucket: "gitlab/uploads" } }
          })
          assert.strictEqual(result.outcome, "succeeded")
          assert.deepStrictEqual(result.summary, {
            totalPendingEntries: 7,
            totalDeletedStaleEntries: 3,
            executionTimeout: false,
            invalidEntries: 0,
            failedDeletes: 1,
            skippedNoStore: 1,
            vanished: 0,
            heldMs: 0,
            heldBy: []
          })
          assert.deepStrictEqual(yield* hgetall, kept)
          assert.deepStrictEqual(yield* s.list("artifacts"), ["tmp/fresh"])
          assert.deepStrictEqual(yield* s.list("gitlab"), ["other/x", "tmp/stale-2", "uploads/tmp/fresh-2"])
          assert.deepStrictEqual(yield* deletedStreams, [
            "direct_upload:artifacts:tmp/already-gone",
            "direct_upload:artifacts:tmp/stale-1",
            "direct_upload:uploads:tmp/stale-2"
          ])
          // The entry of a location without a store was removed too (as GitLab does): its event says no
          // object was deleted.
          assert.deepStrictEqual(yield* streamsOf("StaleDirectUploadEntryRemoved"), ["direct_upload:lfs:tmp/no-store"])
        }).pipe(Effect.provide(Platform())),
      120_000
    )

    it.live(
      "credentials the store refuses: every stale field kept, counted as failedDeletes, the run still succeeds",
      () =>
        Effect.gen(function*() {
          const s = yield* store
          yield* s.createBucket("artifacts")
          yield* s.put("artifacts", "tmp/stale")
          const entries = { "artifacts:tmp/stale": STALE, "artifacts:tmp/stale-gone": STALE }
          yield* hset(entries)
          const result = yield* runWith({
            connection: s.connection(true),
            objects: { artifacts: { bucket: "artifacts" } }
          })
          assert.strictEqual(result.outcome, "succeeded")
          assert.deepStrictEqual(result.summary, {
            totalPendingEntries: 2,
            totalDeletedStaleEntries: 0,
            executionTimeout: false,
            invalidEntries: 0,
            failedDeletes: 2,
            skippedNoStore: 0,
            vanished: 0,
            heldMs: 0,
            heldBy: []
          })
          assert.deepStrictEqual(yield* hgetall, entries)
          assert.deepStrictEqual(yield* s.list("artifacts"), ["tmp/stale"])
          assert.deepStrictEqual(yield* deletedStreams, [])
          assert.strictEqual(result.stderr.split("\n").filter((line) => line.includes("Could not delete")).length, 1)
        }).pipe(Effect.provide(Platform())),
      120_000
    )
  })

scenario("S3 (s3rver)", s3Store)
scenario("Azure Blob (azurite)", azureStore)
