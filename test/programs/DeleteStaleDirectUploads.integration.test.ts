/**
 * delete-stale-direct-uploads end to end: GitLab-format `pending_direct_uploads` entries in a real
 * Redis, objects in local object-storage directories, events in a real PostgreSQL, and the CLI run
 * as an operator would (`sweeper run delete-stale-direct-uploads --json --now …`).
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { existsSync } from "node:fs"
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { PENDING_DIRECT_UPLOADS_KEY } from "../../src/domain/DirectUpload.ts"
import { SharedStateRedis } from "../../src/layers/redis/Redis.ts"
import { runCli } from "../support/cli.ts"
import { PgTest, TestDatabaseUrl } from "../support/postgres.ts"
import { type RedisTopology, RedisTopologyTest, TestRedisStores, topologies } from "../support/redisTopology.ts"

const NOW = "2026-01-01T05:00:00Z"
const NOW_SECONDS = Date.parse(NOW) / 1000
/** `--now` starts the child's clock at NOW, which then runs on: keep clear of the exact boundary. */
const STALE = String(NOW_SECONDS - 4 * 3600)
const ALMOST_STALE = String(NOW_SECONDS - 3 * 3600 + 60)
const FRESH = String(NOW_SECONDS - 600)

const Platform = (topology: RedisTopology = "single") => Layer.mergeAll(PgTest, RedisTopologyTest(topology))

/** Object storage: `artifacts/` and `lfs/` are configured roots, `outside/` is not a root at all. */
const objectStore = Effect.acquireRelease(
  Effect.promise(async () => {
    const base = await mkdtemp(join(tmpdir(), "sweeper-it-objects-"))
    const roots = { artifacts: join(base, "artifacts"), lfs: join(base, "lfs") }
    for (const root of [...Object.values(roots), join(base, "outside")]) await mkdir(root)
    return { base, roots }
  }),
  ({ base }) => Effect.promise(() => rm(base, { recursive: true, force: true }))
)

const put = (path: string) =>
  Effect.promise(async () => {
    await mkdir(dirname(path), { recursive: true })
    await writeFile(path, "half an upload")
  })

const hset = (entries: Record<string, string>) =>
  Effect.flatMap(
    SharedStateRedis,
    (redis) => redis.use("test.hset", (c) => c.hset(PENDING_DIRECT_UPLOADS_KEY, entries))
  )

const hgetall = Effect.flatMap(
  SharedStateRedis,
  (redis) => redis.use("test.hgetall", (c) => c.hgetall(PENDING_DIRECT_UPLOADS_KEY))
)

const events = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  return yield* sql<{ stream: string; type: string; data: Record<string, unknown>; run_id: string | null }>`
    SELECT stream, type, data, run_id FROM sweeper_events ORDER BY id`
})

const runJson = (roots: Record<string, string>, ...extra: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const env = {
      DATABASE_URL: yield* TestDatabaseUrl,
      ...(yield* TestRedisStores).env,
      SWEEPER_DATA_DIR: join(tmpdir(), "sweeper-it-data"),
      SWEEPER_OBJECT_STORAGE: JSON.stringify(roots)
    }
    const result = yield* Effect.promise(() =>
      runCli(["run", "delete-stale-direct-uploads", "--json", "--now", NOW, ...extra], env)
    )
    assert.strictEqual(result.code, 0, `${result.stderr}\n${result.stdout}`)
    const lines = result.stdout.split("\n").filter((line) => line.length > 0)
    assert.lengthOf(lines, 1, result.stdout)
    const parsed = JSON.parse(lines[0]!) as Record<string, unknown>
    assert.includeMembers(Object.keys(parsed), ["batch", "runId", "outcome", "dryRun", "summary"])
    return { ...(parsed as { batch: string; runId: string; outcome: string; summary: unknown }), stderr: result.stderr }
  })

describe("sweeper run delete-stale-direct-uploads (real Redis + PostgreSQL + local object storage, CLI)", () => {
  // The whole batch on each Redis deployment GitLab runs (one server, a server per store, a cluster).
  for (const topology of topologies) {
    it.live(
      `deletes stale objects then their entries, keeps what it must, records every deletion under the run id (redis ${topology})`,
      () =>
        Effect.gen(function*() {
          const { base, roots } = yield* objectStore
          const kept = {
            "artifacts:tmp/uploads/fresh": FRESH,
            "artifacts:tmp/uploads/almost": ALMOST_STALE,
            // Storage errors: the object is a directory; a path escaping the root.
            "artifacts:tmp/uploads/is-a-dir": STALE,
            "artifacts:../outside/victim": STALE,
            // Malformed.
            "artifacts:tmp/uploads/nan": "not-a-time",
            "no_colon_here": STALE,
            "avatars:tmp/uploads/x": STALE
          }
          yield* hset({
            ...kept,
            "artifacts:tmp/uploads/stale-1": STALE,
            "lfs:tmp/uploads/with:colons:in:path": STALE,
            "artifacts:tmp/uploads/already-gone": STALE,
            "uploads:tmp/uploads/unconfigured": STALE
          })
          for (
            const path of [
              "tmp/uploads/fresh",
              "tmp/uploads/almost",
              "tmp/uploads/stale-1",
              "tmp/uploads/nan",
              "tmp/uploads/is-a-dir/inner"
            ]
          ) {
            yield* put(join(roots.artifacts, path))
          }
          yield* put(join(roots.lfs, "tmp/uploads/with:colons:in:path"))
          yield* put(join(base, "outside/victim"))

          const result = yield* runJson(roots)
          assert.strictEqual(result.batch, "delete-stale-direct-uploads")
          assert.strictEqual(result.outcome, "succeeded")
          assert.match(result.runId, /^[0-9a-f-]{36}$/)
          const summary = {
            totalPendingEntries: 11,
            totalDeletedStaleEntries: 3,
            executionTimeout: false,
            invalidEntries: 3,
            failedDeletes: 2,
            skippedNoStore: 1,
            vanished: 0,
            heldMs: 0,
            heldBy: []
          }
          assert.deepStrictEqual(result.summary, summary)

          assert.deepStrictEqual(yield* hgetall, kept)
          assert.isFalse(existsSync(join(roots.artifacts, "tmp/uploads/stale-1")))
          assert.isFalse(existsSync(join(roots.lfs, "tmp/uploads/with:colons:in:path")))
          for (
            const path of ["tmp/uploads/fresh", "tmp/uploads/almost", "tmp/uploads/nan", "tmp/uploads/is-a-dir/inner"]
          ) {
            assert.isTrue(existsSync(join(roots.artifacts, path)), path)
          }
          assert.isTrue(existsSync(join(base, "outside/victim")))
          // One warning for all malformed entries, one for all failed deletes.
          assert.strictEqual(result.stderr.split("\n").filter((line) => line.includes("Skipped malformed")).length, 1)
          assert.strictEqual(result.stderr.split("\n").filter((line) => line.includes("Could not delete")).length, 1)

          const recorded = yield* events
          // Which repair comes first between the run's two events is not what this case is about.
          assert.strictEqual(recorded.at(0)!.type, "RunStarted")
          assert.strictEqual(recorded.at(-1)!.type, "RunFinished")
          assert.deepStrictEqual(recorded.slice(1, -1).map((e) => e.type).sort(), [
            ...Array.from({ length: 3 }, () => "StaleDirectUploadDeleted"),
            "StaleDirectUploadEntryRemoved"
          ])
          assert.isTrue(recorded.every((e) => e.run_id === result.runId))
          assert.deepStrictEqual(recorded.at(-1)!.data.summary, summary)
          const deleted = recorded.filter((e) => e.type === "StaleDirectUploadDeleted")
          assert.deepStrictEqual(
            new Set(deleted.map((e) => e.stream)),
            new Set([
              "direct_upload:artifacts:tmp/uploads/stale-1",
              "direct_upload:lfs:tmp/uploads/with:colons:in:path",
              "direct_upload:artifacts:tmp/uploads/already-gone"
            ])
          )
          const removed = recorded.filter((e) => e.type === "StaleDirectUploadEntryRemoved")
          assert.deepStrictEqual(removed.map((e) => e.stream), ["direct_upload:uploads:tmp/uploads/unconfigured"])
          const colons = deleted.find((e) => e.stream.startsWith("direct_upload:lfs:"))!
          assert.deepStrictEqual(colons.data, {
            location: "lfs",
            path: "tmp/uploads/with:colons:in:path",
            preparedAt: Number(STALE)
          })

          // The next run finds only what it keeps.
          const again = yield* runJson(roots)
          assert.deepStrictEqual(again.summary, {
            ...summary,
            totalPendingEntries: 7,
            totalDeletedStaleEntries: 0,
            skippedNoStore: 0
          })
        }).pipe(Effect.provide(Platform(topology))),
      120_000
    )
  }

  it.live("--budget 0s handles exactly one entry and reports executionTimeout", () =>
    Effect.gen(function*() {
      const { roots } = yield* objectStore
      const entries = {
        "artifacts:tmp/uploads/a": STALE,
        "artifacts:tmp/uploads/b": STALE,
        "artifacts:tmp/uploads/c": STALE
      }
      yield* hset(entries)
      for (const path of ["a", "b", "c"]) yield* put(join(roots.artifacts, "tmp/uploads", path))

      const result = yield* runJson(roots, "--budget", "0s")
      assert.strictEqual(result.outcome, "succeeded")
      assert.deepStrictEqual(result.summary, {
        totalPendingEntries: 3,
        totalDeletedStaleEntries: 1,
        executionTimeout: true,
        invalidEntries: 0,
        failedDeletes: 0,
        skippedNoStore: 0,
        vanished: 0,
        heldMs: 0,
        heldBy: []
      })
      const left = Object.keys(yield* hgetall)
      assert.lengthOf(left, 2)
      const remainingFiles = ["a", "b", "c"].filter((path) => existsSync(join(roots.artifacts, "tmp/uploads", path)))
      assert.deepStrictEqual(remainingFiles.map((path) => `artifacts:tmp/uploads/${path}`), left.sort())
      assert.lengthOf((yield* events).filter((e) => e.type === "StaleDirectUploadDeleted"), 1)
    }).pipe(Effect.provide(Platform())), 60_000)

  it.live("--dry-run counts what it would delete and touches nothing", () =>
    Effect.gen(function*() {
      const { roots } = yield* objectStore
      const entries = { "artifacts:tmp/uploads/a": STALE, "artifacts:tmp/uploads/fresh": FRESH, "bad": STALE }
      yield* hset(entries)
      yield* put(join(roots.artifacts, "tmp/uploads/a"))

      const result = yield* runJson(roots, "--dry-run")
      assert.deepStrictEqual(result.summary, {
        totalPendingEntries: 3,
        totalDeletedStaleEntries: 1,
        executionTimeout: false,
        invalidEntries: 1,
        failedDeletes: 0,
        skippedNoStore: 0,
        vanished: 0,
        heldMs: 0,
        heldBy: []
      })
      assert.deepStrictEqual(yield* hgetall, entries)
      assert.isTrue(existsSync(join(roots.artifacts, "tmp/uploads/a")))
      assert.deepStrictEqual((yield* events).map((e) => e.type), ["RunStarted", "RunFinished"])
    }).pipe(Effect.provide(Platform())), 60_000)
})
