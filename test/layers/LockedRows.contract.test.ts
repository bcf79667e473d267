/**
 * One contract for both LockedRows implementations, LockedRowsMemory over MemoryRedis and
 * LockedRowsRedis on a real Redis, both reading the time from the Clock (TestClock here): a row is
 * counted once per run however often that run skips it, runs in a row add up, a row passed is
 * forgotten, a count not refreshed for LOCKED_COUNT_TTL starts again, and the batch's hash expires.
 */
import { assert, describe, it } from "@effect/vitest"
import { Context, Duration, Effect, Layer } from "effect"
import { TestClock } from "effect/testing"
import { LOCKED_COUNT_TTL, lockedRowsKey } from "../../src/domain/LockedRows.ts"
import { LockedRowsMemory } from "../../src/layers/memory/LockedRowsMemory.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { LockedRowsRedis } from "../../src/layers/redis/LockedRowsRedis.ts"
import { SharedStateRedis } from "../../src/layers/redis/Redis.ts"
import { LockedRows } from "../../src/services/LockedRows.ts"
import { RedisTest } from "../support/redis.ts"

/** The batch hash's remaining TTL in ms (-2 missing, -1 none), read beside the service. */
class HashTtl extends Context.Service<HashTtl, (key: string) => Effect.Effect<number>>()(
  "test/layers/LockedRows/HashTtl"
) {}

const memory = {
  name: "LockedRowsMemory",
  layer: Layer.mergeAll(
    LockedRowsMemory,
    Layer.effect(HashTtl, Effect.map(MemoryRedis, (store) => (key: string) => Effect.sync(() => store.pttl(key))))
  ).pipe(Layer.provide(MemoryRedis.layer))
}

const redis = {
  name: "LockedRowsRedis",
  layer: Layer.mergeAll(
    LockedRowsRedis,
    Layer.effect(
      HashTtl,
      Effect.map(
        SharedStateRedis,
        (r) => (key: string) => r.use("pttl", (client) => client.pttl(key)).pipe(Effect.orDie)
      )
    )
  ).pipe(Layer.provide(RedisTest))
}

const skips = (counts: ReadonlyArray<{ readonly runs: number; readonly first: boolean }>) =>
  counts.map(({ first, runs }) => [runs, first])

describe.each([memory, redis])("$name", (implementation) => {
  it.effect("counts a row once per run, adds runs in a row up, and keeps each batch apart", () =>
    Effect.gen(function*() {
      const rows = yield* LockedRows
      assert.deepStrictEqual(skips(yield* rows.skipped("drop-canceling-builds", "run-1", [1, 2])), [
        [1, true],
        [1, true]
      ])
      // The same run again (a revisited page, a retried attempt): nothing more.
      assert.deepStrictEqual(skips(yield* rows.skipped("drop-canceling-builds", "run-1", [2])), [[1, false]])
      assert.deepStrictEqual(skips(yield* rows.skipped("drop-canceling-builds", "run-2", [2, 3])), [
        [2, true],
        [1, true]
      ])
      assert.deepStrictEqual(skips(yield* rows.skipped("stuck-export-jobs", "run-2", [2])), [[1, true]])
      assert.deepStrictEqual(yield* rows.skipped("drop-canceling-builds", "run-3", []), [])
      assert.deepStrictEqual([...(yield* rows.counted("drop-canceling-builds"))].sort(), ["1", "2", "3"])
      const ttl = yield* (yield* HashTtl)(lockedRowsKey("drop-canceling-builds"))
      assert.isAbove(ttl, 0)
      assert.isAtMost(ttl, Duration.toMillis(LOCKED_COUNT_TTL))
    }).pipe(Effect.provide(implementation.layer)))

  it.effect("a row passed is forgotten: skipped again, it starts from 1", () =>
    Effect.gen(function*() {
      const rows = yield* LockedRows
      yield* rows.skipped("prune-events", "run-1", [7, 8])
      yield* rows.skipped("prune-events", "run-2", [7, 8])
      yield* rows.passed("prune-events", [7, 99])
      assert.deepStrictEqual(yield* rows.counted("prune-events"), ["8"])
      assert.deepStrictEqual(skips(yield* rows.skipped("prune-events", "run-3", [7, 8])), [
        [1, true],
        [3, true]
      ])
      yield* rows.passed("prune-events", [])
    }).pipe(Effect.provide(implementation.layer)))

  it.effect("a count not refreshed for its TTL is no count: not listed, and a new skip starts from 1", () =>
    Effect.gen(function*() {
      const rows = yield* LockedRows
      yield* rows.skipped("drop-running-builds", "run-1", [5, 6])
      yield* TestClock.adjust(Duration.subtract(LOCKED_COUNT_TTL, Duration.minutes(1)))
      yield* rows.skipped("drop-running-builds", "run-2", [6])
      yield* TestClock.adjust(Duration.minutes(1))
      // 5 was last skipped a TTL ago; 6 a minute ago.
      assert.deepStrictEqual(yield* rows.counted("drop-running-builds"), ["6"])
      assert.deepStrictEqual(skips(yield* rows.skipped("drop-running-builds", "run-3", [5, 6])), [
        [1, true],
        [3, true]
      ])
    }).pipe(Effect.provide(implementation.layer)))
})
