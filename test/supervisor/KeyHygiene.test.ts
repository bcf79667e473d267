/**
 * Beside GitLab's own keys, every Redis key Sweeper creates has a TTL, and nothing grows with time. 100 scheduled
 * ticks of every batch go through the run guard as the scheduler drives them (`tickClaimTtl`, a
 * distinct `scheduledAt` each), on real Redis stores in each deployment; then every key in every
 * store is SCANned and must expire.
 *
 * Keys left out of the TTL check are GitLab's own, which GitLab (or Sidekiq, consuming them)
 * manages, and Sweeper only appends to or deletes from:
 *   - `queue:<name>`, `queues` — Sidekiq's queue lists and queue set (Queues store);
 *   - `pending_direct_uploads` — GitLab's hash (seeded here), Sweeper only HDELs from it.
 * (SQL-side services run in memory here: this test is about Redis keys.)
 */
import { assert, describe, it } from "@effect/vitest"
import { DateTime, Duration, Effect, Layer } from "effect"
import { SweeperConfig } from "../../src/config/Config.ts"
import { PENDING_DIRECT_UPLOADS_KEY } from "../../src/domain/DirectUpload.ts"
import { RUNNING_REBALANCES_KEY } from "../../src/domain/Rebalancing.ts"
import { tickClaimTtl } from "../../src/domain/Schedule.ts"
import { BuildsMemory } from "../../src/layers/memory/BuildsMemory.ts"
import { EventLogMemory } from "../../src/layers/memory/EventLogMemory.ts"
import { EventRetentionMemory } from "../../src/layers/memory/EventRetentionMemory.ts"
import { ExportJobsMemory } from "../../src/layers/memory/ExportJobsMemory.ts"
import { ObjectStorageMemory } from "../../src/layers/memory/ObjectStorageMemory.ts"
import { MemoryPlatformRecords, PlatformRecordsMemory } from "../../src/layers/memory/PlatformRecordsMemory.ts"
import { StuckBuildsMemory } from "../../src/layers/memory/StuckBuildsMemory.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { RedisStores, SharedStateRedis } from "../../src/layers/redis/Redis.ts"
import { batches } from "../../src/programs/index.ts"
import { RedisServices, RepairSteps } from "../../src/supervisor/App.ts"
import { runBatch } from "../../src/supervisor/RunGuard.ts"
import { type RedisTopology, RedisTopologyTest, scanKeys, topologies } from "../support/redisTopology.ts"

const TICKS = 100
const GITLAB_MANAGED = (key: string) =>
  key.startsWith("queue:") || key === "queues" || key === PENDING_DIRECT_UPLOADS_KEY

const Platform = (topology: RedisTopology) =>
  RepairSteps.pipe(
    Layer.provideMerge(
      Layer.mergeAll(
        BuildsMemory,
        StuckBuildsMemory,
        ExportJobsMemory,
        ObjectStorageMemory(),
        PlatformRecordsMemory,
        EventRetentionMemory,
        RedisServices,
        MetricsPrometheus
      )
    ),
    Layer.provideMerge(
      SweeperConfig.layerWith({ concurrencyLimits: { "Chaos::SleepWorker": { limit: 2, queue: "default" } } })
    ),
    Layer.provideMerge(EventLogMemory),
    Layer.provideMerge(RedisTopologyTest(topology))
  )

describe("key hygiene", () => {
  for (const topology of topologies) {
    it.live(
      `after ${TICKS} ticks of every batch, every key Sweeper created has a TTL (redis ${topology})`,
      () =>
        Effect.gen(function*() {
          // Something for the Redis batches to do on the first ticks: rebalances to re-enqueue (with
          // until_executed claims) and a pending direct upload to look at.
          const records = yield* MemoryPlatformRecords
          records.namespaces.add(10)
          records.projects.add(20)
          const shared = yield* SharedStateRedis
          yield* shared.use("seed", async (c) => {
            await c.sadd(RUNNING_REBALANCES_KEY, "1/10", "2/20")
            await c.expire(RUNNING_REBALANCES_KEY, 864000)
            await c.hset(PENDING_DIRECT_UPLOADS_KEY, "artifacts:tmp/uploads/x", "1700000000")
          })

          const start = DateTime.makeUnsafe("2026-03-01T00:00:00Z")
          // A tick a minute, claimed as the scheduler claims it.
          const tickClaim = tickClaimTtl(Duration.minutes(1))
          let runs = 0
          for (let tick = 0; tick < TICKS; tick++) {
            const scheduledAt = DateTime.add(start, { minutes: tick })
            for (const batch of batches) {
              const result = yield* runBatch(batch, { trigger: "schedule", scheduledAt, tickClaimTtl: tickClaim })
              assert.notStrictEqual(result.outcome, "failed", `${batch.name} tick ${tick}: ${result.error}`)
              runs++
            }
          }
          assert.strictEqual(runs, TICKS * batches.length)

          // Every store (distinct connections only: one server may carry several stores).
          const stores = [...new Set((yield* RedisStores).map((entry) => entry.redis))]
          const checked: Array<string> = []
          for (const store of stores) {
            const keys = yield* store.use("scan", (c) => scanKeys(c))
            for (const key of keys) {
              if (GITLAB_MANAGED(key)) continue
              const ttl = yield* store.use("pttl", (c) => c.pttl(key))
              assert.isAbove(ttl, 0, `${key} has no TTL`)
              checked.push(key)
            }
          }
          // The tick claims are there (one per batch and tick), with no fencing epoch of their own.
          const tickClaims = checked.filter((key) => key.startsWith("gitlab:exclusive_lease:sweeper/tick/"))
          assert.strictEqual(tickClaims.length, TICKS * batches.length)
          // …each kept two periods (at least ten minutes), not a day: one a batch a tick is alive at once.
          for (const store of stores) {
            for (const key of tickClaims) {
              const ttl = yield* store.use("pttl", (c) => c.pttl(key))
              if (ttl !== -2) assert.isAtMost(ttl, Duration.toMillis(tickClaim), key)
            }
          }
          assert.deepStrictEqual(
            checked.filter((key) => key.includes("exclusive_lease_epoch:{gitlab:exclusive_lease:sweeper/tick/")),
            []
          )
          // Batch leases did take epochs, kept under a TTL.
          assert.isAbove(checked.filter((key) => key.startsWith("sweeper:exclusive_lease_epoch:")).length, 0)
          // The re-enqueued rebalances left their until_executed claims, also expiring.
          assert.isAbove(checked.filter((key) => key.startsWith("resque:gitlab:duplicate:")).length, 0)
        }).pipe(Effect.provide(Platform(topology))),
      300_000
    )
  }
})
