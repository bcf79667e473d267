/**
 * The composition root. Configuration picks the backends:
 *   DATABASE_URL set → that PostgreSQL server; absent → embedded PGlite under SWEEPER_DATA_DIR.
 *   REDIS_URL set    → that Redis (and REDIS_{SHARED_STATE,QUEUES,QUEUES_METADATA}_URL per GitLab store,
 *                      each a server or a cluster); absent → the in-memory implementations.
 *   Setting one side without the other is a start-up error (Config.ts, SPEC §8.2).
 * Everything above the backends (programs, run guard, scheduler) is the same either way.
 */
import { Effect, Layer, Option, Redacted } from "effect"
import { join } from "node:path"
import type { Builds } from "../services/Builds.ts"
import type { ConcurrencyLimits } from "../services/ConcurrencyLimits.ts"
import type { EventLog } from "../services/EventLog.ts"
import type { ExportJobs } from "../services/ExportJobs.ts"
import type { JobQueue } from "../services/JobQueue.ts"
import type { JobStatus } from "../services/JobStatus.ts"
import type { Lease } from "../services/Lease.ts"
import type { ObjectStorage } from "../services/ObjectStorage.ts"
import type { PendingDirectUploads } from "../services/PendingDirectUploads.ts"
import type { PlatformRecords } from "../services/PlatformRecords.ts"
import type { RebalancingState } from "../services/RebalancingState.ts"
import { BuildsSql } from "./BuildsSql.ts"
import { ConcurrencyLimitsRedis } from "./ConcurrencyLimitsRedis.ts"
import { resolveStoreUrls, SweeperConfig, type SweeperSettings } from "./Config.ts"
import { EventLogSql } from "./EventLogSql.ts"
import { ExportJobsSql } from "./ExportJobsSql.ts"
import { JobQueueRedis } from "./JobQueueRedis.ts"
import { JobStatusRedis } from "./JobStatusRedis.ts"
import { LeaseRedis } from "./LeaseRedis.ts"
import { ConcurrencyLimitsMemory } from "./memory/ConcurrencyLimitsMemory.ts"
import { JobQueueMemory } from "./memory/JobQueueMemory.ts"
import { JobStatusMemory } from "./memory/JobStatusMemory.ts"
import { LeaseMemory } from "./memory/LeaseMemory.ts"
import { MemoryRedis } from "./memory/MemoryRedis.ts"
import { PendingDirectUploadsMemory } from "./memory/PendingDirectUploadsMemory.ts"
import { RebalancingStateMemory } from "./memory/RebalancingStateMemory.ts"
import { migrate } from "./Migrations.ts"
import { ObjectStorageLocal } from "./ObjectStorageLocal.ts"
import { PendingDirectUploadsRedis } from "./PendingDirectUploadsRedis.ts"
import { PlatformRecordsSql } from "./PlatformRecordsSql.ts"
import { layerEmbedded, layerServer } from "./Postgres.ts"
import { RebalancingStateRedis } from "./RebalancingStateRedis.ts"
import { Redis, redactUrl, type StoreUrls } from "./Redis.ts"

/** Every service a registered batch may need. */
export type PlatformServices = Builds | EventLog | Lease | ExportJobs | JobStatus | PendingDirectUploads | ObjectStorage | JobQueue | RebalancingState | PlatformRecords | ConcurrencyLimits

/** The services backed by Redis, given the store connections (Redis.layerStores). */
export const RedisServices = Layer.mergeAll(LeaseRedis, JobStatusRedis, PendingDirectUploadsRedis, JobQueueRedis, RebalancingStateRedis, ConcurrencyLimitsRedis)

/** The services backed by Redis, each on its GitLab store (SPEC §8.2). */
export const RedisBackends = (urls: StoreUrls) => RedisServices.pipe(Layer.provideMerge(Redis.layerStores(urls)))

/** The same services in memory (embedded default, specs). */
export const MemoryBackends = Layer.mergeAll(LeaseMemory, JobStatusMemory, PendingDirectUploadsMemory, JobQueueMemory, RebalancingStateMemory, ConcurrencyLimitsMemory).pipe(Layer.provideMerge(MemoryRedis.layer))

/** The services backed by PostgreSQL, given a PgClient. */
export const SqlBackends = Layer.mergeAll(BuildsSql, ExportJobsSql, PlatformRecordsSql).pipe(Layer.provideMerge(EventLogSql))

const Migrated = Layer.effectDiscard(Effect.gen(function*() {
  const applied = yield* migrate
  if (applied.length > 0) yield* Effect.logInfo("Applied migrations", applied.map(([id, name]) => `${id}_${name}`))
}))

export const databaseLayer = (settings: SweeperSettings) =>
  Migrated.pipe(Layer.provideMerge(Option.match(settings.databaseUrl, {
    onNone: () => layerEmbedded(settings.dataDir),
    onSome: layerServer
  })))

export const describeBackends = (settings: SweeperSettings) => ({
  postgres: Option.match(settings.databaseUrl, {
    onNone: () => `embedded PGlite (${join(settings.dataDir, "pgdata")})`,
    onSome: (url) => redactUrl(Redacted.value(url))
  }),
  redis: Option.match(storeUrls(settings), {
    onNone: () => "in-memory (embedded, this process only)",
    onSome: (urls) => {
      const describe = (url: Redacted.Redacted<string>) => {
        const raw = Redacted.value(url)
        return `${raw.includes(",") ? "cluster " : ""}${redactUrl(raw)}`
      }
      const all = [urls.sharedState, urls.queues, urls.queuesMetadata].map(describe)
      return all[0] === all[1] && all[1] === all[2]
        ? all[0]!
        : `sharedState ${all[0]}, queues ${all[1]}, queuesMetadata ${all[2]}`
    }
  })
})

/** The three store URLs when Redis is configured (Config has checked each resolves). */
export const storeUrls = (settings: SweeperSettings): Option.Option<StoreUrls> => {
  const urls = resolveStoreUrls(settings)
  return Option.all(urls)
}

/** Platform backends chosen by configuration, migrated, with SweeperConfig. */
export const AppLayer = Layer.unwrap(Effect.gen(function*() {
  const settings = yield* SweeperConfig
  const redisBacked = Option.match(storeUrls(settings), { onNone: () => MemoryBackends, onSome: RedisBackends })
  return Layer.mergeAll(SqlBackends, redisBacked, ObjectStorageLocal).pipe(Layer.provideMerge(databaseLayer(settings)))
})).pipe(Layer.provideMerge(SweeperConfig.layer))
