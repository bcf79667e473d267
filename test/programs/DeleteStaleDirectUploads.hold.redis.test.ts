/**
 * delete-stale-direct-uploads against real Redis when uploads complete while the gate holds the
 * run: the page was read before the hold, so each entry is compared again before its object is
 * deleted. An upload that completed meanwhile keeps its finished object; every object actually
 * deleted gets its event.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Option } from "effect"
import { CurrentRun } from "../../src/domain/Batch.ts"
import { PENDING_DIRECT_UPLOADS_KEY } from "../../src/domain/DirectUpload.ts"
import { MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import { MemoryObjectStorage, putObjects } from "../../src/layers/memory/ObjectStorageMemory.ts"
import { StaleUploadRepairLive } from "../../src/layers/protocols/StaleUploadRepairLive.ts"
import { PendingDirectUploadsRedis } from "../../src/layers/redis/PendingDirectUploadsRedis.ts"
import { SharedStateRedis } from "../../src/layers/redis/Redis.ts"
import { DeleteStaleDirectUploads } from "../../src/programs/DeleteStaleDirectUploads.ts"
import { HealthGate, openGate } from "../../src/services/HealthGate.ts"
import { MemoryPlatform } from "../support/memory.ts"
import { RedisTest } from "../support/redis.ts"

const NOW = new Date("2026-03-01T12:00:00Z")
const STALE = String(NOW.getTime() / 1000 - 4 * 3600)

describe("delete-stale-direct-uploads under a gate hold (real Redis)", () => {
  it.live(
    "uploads that complete during a hold keep their finished objects; every deleted object has its event",
    () =>
      Effect.gen(function*() {
        const redis = yield* SharedStateRedis
        const paths = Array.from({ length: 20 }, (_, i) => `u/${i}`)
        yield* redis.use(
          "test.hset",
          (c) => c.hset(PENDING_DIRECT_UPLOADS_KEY, Object.fromEntries(paths.map((p) => [`artifacts:${p}`, STALE])))
        )
        const storage = yield* MemoryObjectStorage
        putObjects(storage, "artifacts", ...paths)
        let completed: ReadonlyArray<string> = []
        let asked = 0
        // Steps of 1 and 8 run; before the third the gate holds, and meanwhile every upload still
        // pending completes: GitLab removes its entry and its object is now a finished file.
        const gate = Effect.provideService(HealthGate, {
          ...openGate,
          beforeUnit: () =>
            ++asked === 3
              ? Effect.gen(function*() {
                const left = yield* redis.use("test.hkeys", (c) => c.hkeys(PENDING_DIRECT_UPLOADS_KEY))
                completed = left.map((field) => field.slice("artifacts:".length))
                yield* redis.use("test.hdel", (c) => c.hdel(PENDING_DIRECT_UPLOADS_KEY, ...left))
                return { proceed: true, heldMs: 1_000, heldBy: ["replicationLag"] }
              }).pipe(Effect.orDie)
              : Effect.succeed({ proceed: true, heldMs: 0, heldBy: [] })
        })
        const summary = yield* DeleteStaleDirectUploads.run.pipe(
          gate,
          Effect.provideService(CurrentRun, {
            runId: null,
            batch: null,
            dryRun: false,
            budget: Option.none(),
            fence: Option.none(),
            asOf: NOW
          })
        )
        assert.lengthOf(completed, 11)
        for (const path of completed) {
          assert.isTrue(storage.stores.get("artifacts")!.has(path), `the finished object ${path} was deleted`)
        }
        const deleted = storage.deletes.filter((d) => d.outcome !== "failed").map((d) => d.path).toSorted()
        const recorded = (yield* MemoryEvents).map((e) => String(e.data.path)).toSorted()
        assert.deepStrictEqual(recorded, deleted, "every object deleted has its event")
        assert.lengthOf(deleted, 9)
        assert.include(summary, { totalDeletedStaleEntries: 9, vanished: 11 })
      }).pipe(
        Effect.provide(
          Layer.merge(
            Layer.fresh(StaleUploadRepairLive).pipe(Layer.provide(PendingDirectUploadsRedis)),
            PendingDirectUploadsRedis
          )
            .pipe(Layer.provideMerge(Layer.merge(MemoryPlatform(), RedisTest)))
        )
      ),
    30_000
  )
})
