/**
 * A backlog read from Redis does not need PostgreSQL: with the database refusing connections, the
 * batches that scan GitLab's tables say their read failed, while those whose backlog lives in Redis
 * (stale uploads, deferred jobs) still show what waits.
 */
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Layer, Redacted } from "effect"
import { SweeperConfig, TuningFromConfig } from "../../src/config/Config.ts"
import { PENDING_DIRECT_UPLOADS_KEY } from "../../src/domain/DirectUpload.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { ObjectStorageMemory } from "../../src/layers/memory/ObjectStorageMemory.ts"
import { migrate } from "../../src/layers/postgres/Migrations.ts"
import { layerServer } from "../../src/layers/postgres/Postgres.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { Backlog } from "../../src/services/Backlog.ts"
import { MemoryBackends, RepairSteps, SqlBackends } from "../../src/supervisor/App.ts"
import { BacklogLive } from "../../src/views/Backlog.ts"
import { freshDatabase } from "../support/postgres.ts"
import { startTcpProxy, type TcpProxy } from "../support/tcpProxy.ts"

class Proxy extends Context.Service<Proxy, TcpProxy>()("test/BacklogDatabaseDown/Proxy") {}

/** A fresh database reached through a proxy the test can cut. */
const ProxiedDatabase = Layer.unwrap(Effect.gen(function*() {
  const { url } = yield* freshDatabase
  const target = new URL(url)
  const proxy = yield* Effect.promise(() => startTcpProxy(Number(target.port || 5432), target.hostname))
  target.port = String(proxy.port)
  return Layer.effectDiscard(migrate).pipe(
    Layer.provideMerge(layerServer(Redacted.make(target.toString()))),
    Layer.merge(Layer.succeed(Proxy, proxy)),
    Layer.orDie
  )
}))

const Platform = BacklogLive.pipe(
  Layer.provideMerge(RepairSteps),
  Layer.provideMerge(
    Layer.mergeAll(
      SqlBackends.pipe(Layer.provideMerge(MemoryBackends), Layer.provideMerge(MetricsPrometheus)),
      ObjectStorageMemory(),
      TuningFromConfig,
      MetricsPrometheus
    )
  ),
  Layer.provideMerge(SweeperConfig.layerWith({})),
  Layer.provideMerge(ProxiedDatabase)
)

describe("backlog with the database down", () => {
  it.live("Redis-held backlogs are still read; table scans say they failed", () =>
    Effect.gen(function*() {
      const redis = yield* MemoryRedis
      redis.hset(PENDING_DIRECT_UPLOADS_KEY, { "uploads:tmp/old": String(Math.floor(Date.now() / 1000) - 4 * 3600) })
      const proxy = yield* Proxy
      yield* Effect.promise(() => proxy.refuse())
      const snapshot = yield* (yield* Backlog).refresh
      const of = (batch: string) => snapshot.batches.find((b) => b.batch === batch)!
      assert.isNotNull(of("drop-canceling-builds").error)
      assert.deepInclude(of("delete-stale-direct-uploads"), { count: 1, error: null })
      assert.deepInclude(of("concurrency-limit-resume"), { count: 0, error: null })
    }).pipe(Effect.provide(Platform)), 60_000)
})
