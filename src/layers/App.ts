/**
 * The composition root. Configuration picks the backends:
 *   DATABASE_URL set → that PostgreSQL server; absent → embedded PGlite under SWEEPER_DATA_DIR.
 *   REDIS_URL set    → that Redis server;      absent → the in-memory implementations.
 * Everything above the backends (programs, run guard, scheduler) is the same either way.
 */
import { Effect, Layer, Option, Redacted } from "effect"
import { join } from "node:path"
import type { Builds } from "../services/Builds.ts"
import type { EventLog } from "../services/EventLog.ts"
import type { Lease } from "../services/Lease.ts"
import { BuildsSql } from "./BuildsSql.ts"
import { SweeperConfig, type SweeperSettings } from "./Config.ts"
import { EventLogSql } from "./EventLogSql.ts"
import { LeaseRedis } from "./LeaseRedis.ts"
import { LeaseMemory } from "./memory/LeaseMemory.ts"
import { MemoryRedis } from "./memory/MemoryRedis.ts"
import { migrate } from "./Migrations.ts"
import { layerEmbedded, layerServer } from "./Postgres.ts"
import { Redis } from "./Redis.ts"

/** Every service a registered batch may need. */
export type PlatformServices = Builds | EventLog | Lease

/** The services backed by Redis, on a real server. */
export const RedisBackends = (url: Redacted.Redacted<string>) =>
  Layer.mergeAll(LeaseRedis).pipe(Layer.provideMerge(Redis.layer(url)))

/** The same services in memory (embedded default, specs). */
export const MemoryBackends = Layer.mergeAll(LeaseMemory).pipe(Layer.provideMerge(MemoryRedis.layer))

/** The services backed by PostgreSQL, given a PgClient. */
export const SqlBackends = Layer.mergeAll(BuildsSql).pipe(Layer.provideMerge(EventLogSql))

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
  redis: Option.match(settings.redisUrl, {
    onNone: () => "in-memory (embedded, this process only)",
    onSome: (url) => redactUrl(Redacted.value(url))
  })
})

const redactUrl = (url: string) => {
  try {
    const parsed = new URL(url)
    if (parsed.password !== "") parsed.password = "***"
    return parsed.toString()
  } catch {
    return "(unparsable URL)"
  }
}

/** Platform backends chosen by configuration, migrated, with SweeperConfig. */
export const AppLayer = Layer.unwrap(Effect.gen(function*() {
  const settings = yield* SweeperConfig
  const redisBacked = Option.match(settings.redisUrl, { onNone: () => MemoryBackends, onSome: RedisBackends })
  return Layer.mergeAll(SqlBackends, redisBacked).pipe(Layer.provideMerge(databaseLayer(settings)))
})).pipe(Layer.provideMerge(SweeperConfig.layer))
