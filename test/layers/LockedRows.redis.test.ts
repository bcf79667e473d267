/** LockedRows on real Redis: counts per row across calls, each count with its TTL (Sweeper's own keys expire). */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { lockedRowKey } from "../../src/domain/LockedRows.ts"
import { LockedRowsRedis } from "../../src/layers/redis/LockedRowsRedis.ts"
import { SharedStateRedis } from "../../src/layers/redis/Redis.ts"
import { LockedRows } from "../../src/services/LockedRows.ts"
import { RedisTest } from "../support/redis.ts"

describe("LockedRowsRedis", () => {
  it.live("counts each row's skips across runs, every key with a TTL", () =>
    Effect.gen(function*() {
      const rows = yield* LockedRows
      assert.deepStrictEqual(yield* rows.skipped("drop-canceling-builds", [1, 2]), [1, 1])
      assert.deepStrictEqual(yield* rows.skipped("drop-canceling-builds", [2, 3]), [2, 1])
      assert.deepStrictEqual(yield* rows.skipped("stuck-export-jobs", [2]), [1])
      assert.deepStrictEqual(yield* rows.skipped("drop-canceling-builds", []), [])
      const redis = yield* SharedStateRedis
      const ttl = yield* redis.use("ttl", (c) => c.ttl(lockedRowKey("drop-canceling-builds", 2)))
      assert.isAbove(ttl, 0)
    }).pipe(Effect.provide(LockedRowsRedis.pipe(Layer.provideMerge(RedisTest)))))
})
