/**
 * reschedule-stuck-issue-rebalances under the real health gate (memory signals, TestClock): a push
 * held by the gate re-reads what it is about to reschedule, so a rebalance that finished during the
 * hold (its member gone from the running set) is not pushed — each push is a full issue-position
 * rebalance of a namespace.
 */
import { assert, describe, it } from "@effect/vitest"
import { DateTime, Duration, Effect, Fiber, Layer, Schema } from "effect"
import { TestClock } from "effect/testing"
import { HealthJson } from "../../src/domain/HealthConfig.ts"
import { RUNNING_REBALANCES_KEY } from "../../src/domain/Rebalancing.ts"
import { queueKey } from "../../src/domain/Sidekiq.ts"
import { HealthGateLive } from "../../src/layers/health/HealthGateLive.ts"
import { HealthSignalsMemory, MemorySignalValues } from "../../src/layers/memory/HealthSignalsMemory.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { MemoryPlatformRecords } from "../../src/layers/memory/PlatformRecordsMemory.ts"
import { RescheduleStuckIssueRebalances } from "../../src/programs/RescheduleStuckIssueRebalances.ts"
import { settled } from "../support/gate.ts"
import { MemoryPlatform } from "../support/memory.ts"

const NOW = DateTime.makeUnsafe("2026-03-01T12:15:00Z")

const Platform = HealthGateLive({
  config: Schema.decodeUnknownSync(HealthJson)(JSON.stringify({ replicationLag: { stop: "8MB", resume: "2MB" } })),
  batches: [RescheduleStuckIssueRebalances],
  concurrencyLimits: {}
}).pipe(
  Layer.provideMerge(HealthSignalsMemory),
  Layer.provideMerge(MemorySignalValues.layer),
  Layer.provideMerge(MemoryPlatform())
)

const atNow = <A, E, R>(body: Effect.Effect<A, E, R>) =>
  Effect.andThen(TestClock.setTime(DateTime.toEpochMillis(NOW)), Effect.provide(body, Platform))

describe("reschedule-stuck-issue-rebalances under the health gate", () => {
  it.effect("a rebalance that finished during a hold is not pushed after it", () =>
    Effect.gen(function*() {
      const redis = yield* MemoryRedis
      redis.sadd(RUNNING_REBALANCES_KEY, "1/1", "1/2")
      const records = yield* MemoryPlatformRecords
      records.namespaces.add(1)
      records.namespaces.add(2)
      const values = yield* MemorySignalValues
      values.replicationLagBytes = 38_000_000
      yield* TestClock.adjust(Duration.seconds(1))
      const fiber = yield* RescheduleStuckIssueRebalances.run.pipe(Effect.forkChild)
      yield* settled
      // Namespace 1's rebalance finishes while the push waits on the gate.
      redis.srem(RUNNING_REBALANCES_KEY, "1/1")
      yield* TestClock.adjust(Duration.seconds(3))
      values.replicationLagBytes = 0
      yield* TestClock.adjust(Duration.seconds(5))
      const summary = yield* Fiber.join(fiber)
      assert.deepStrictEqual(summary.heldBy, ["replicationLag"])
      assert.strictEqual(summary.enqueuedNamespaces, 1)
      const pushed = redis.lrange(queueKey("issues_rebalancing"), 0, -1).map((job) =>
        (JSON.parse(job) as { args: ReadonlyArray<number | null> }).args
      )
      assert.deepStrictEqual(pushed, [[null, null, 2]])
    }).pipe(atNow))
})
