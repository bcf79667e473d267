/**
 * The composition root. Configuration picks the backends:
 *   DATABASE_URL set → that PostgreSQL server; absent → embedded PGlite under SWEEPER_DATA_DIR.
 *   REDIS_URL set    → that Redis (and REDIS_{SHARED_STATE,QUEUES,QUEUES_METADATA}_URL per GitLab store,
 *                      each a server or a cluster); absent → the in-memory implementations.
 *   Setting one side without the other is a start-up error (Config.ts).
 * Everything above the backends (programs, run guard, scheduler) is the same either way.
 */
import { PgClient } from "@effect/sql-pg"
import * as Cause from "effect/Cause"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Predicate from "effect/Predicate"
import * as Redacted from "effect/Redacted"
import * as SqlClient from "effect/sql/SqlClient"
import type { SqlError } from "effect/sql/SqlError"
import { join } from "node:path"
import { resolveStoreUrls, SweeperConfig, type SweeperSettings, TuningFromConfig } from "../config/Config.ts"
import { describeObjectStorage, type ObjectStorageSettings } from "../config/ObjectStorageConfig.ts"
import { describeError, hostOfUrl, InfrastructureUnavailable } from "../domain/Errors.ts"
import { redact } from "../domain/Redaction.ts"
import { HealthGateLive } from "../layers/health/HealthGateLive.ts"
import { DatabaseSignalsLive, HealthSignalsLive } from "../layers/health/HealthSignalsLive.ts"
import { ConcurrencyLimitsMemory } from "../layers/memory/ConcurrencyLimitsMemory.ts"
import { JobQueueMemory } from "../layers/memory/JobQueueMemory.ts"
import { JobStatusMemory } from "../layers/memory/JobStatusMemory.ts"
import { LeaseMemory } from "../layers/memory/LeaseMemory.ts"
import { LockedRowsMemory } from "../layers/memory/LockedRowsMemory.ts"
import { MemoryRedis } from "../layers/memory/MemoryRedis.ts"
import { PendingDirectUploadsMemory } from "../layers/memory/PendingDirectUploadsMemory.ts"
import { RebalancingStateMemory } from "../layers/memory/RebalancingStateMemory.ts"
import { RunnerAckQueueMemory } from "../layers/memory/RunnerAckQueueMemory.ts"
import { ObjectStorageAzure } from "../layers/objectStorage/ObjectStorageAzure.ts"
import { ObjectStorageLocal } from "../layers/objectStorage/ObjectStorageLocal.ts"
import { ObjectStorageS3 } from "../layers/objectStorage/ObjectStorageS3.ts"
import { BuildsSql } from "../layers/postgres/BuildsSql.ts"
import { checkLayout, refuseUnusableLayout } from "../layers/postgres/DatabaseLayout.ts"
import {
  CiDatabase,
  MainDatabase,
  MainDatabaseLive,
  onClient,
  sameDatabase,
  SingleDatabase
} from "../layers/postgres/Databases.ts"
import { detectCiSchemaMode, detectSchemaMode, SchemaNotMigrated } from "../layers/postgres/DatabaseSchema.ts"
import { EventLogSql, EventLogSqlInto } from "../layers/postgres/EventLogSql.ts"
import { EventRetentionSql } from "../layers/postgres/EventRetentionSql.ts"
import { ExportJobsSql } from "../layers/postgres/ExportJobsSql.ts"
import { JobOutboxRelay } from "../layers/postgres/JobOutbox.ts"
import { migrateWith, pendingMigrations } from "../layers/postgres/Migrations.ts"
import { OutboxRepairEvents } from "../layers/postgres/Outbox.ts"
import { PlatformRecordsSql } from "../layers/postgres/PlatformRecordsSql.ts"
import { layerEmbedded, layerServer } from "../layers/postgres/Postgres.ts"
import { ShadowLedgerSql } from "../layers/postgres/ShadowLedgerSql.ts"
import { ShadowObserverSql } from "../layers/postgres/ShadowObserverSql.ts"
import { StuckBuildsSql } from "../layers/postgres/StuckBuildsSql.ts"
import { MetricsPrometheus } from "../layers/prometheus/MetricsPrometheus.ts"
import { RebalanceRescheduleLive } from "../layers/protocols/RebalanceRescheduleLive.ts"
import { StaleUploadRepairLive } from "../layers/protocols/StaleUploadRepairLive.ts"
import { ConcurrencyLimitsRedis } from "../layers/redis/ConcurrencyLimitsRedis.ts"
import { JobQueueRedis } from "../layers/redis/JobQueueRedis.ts"
import { JobStatusRedis } from "../layers/redis/JobStatusRedis.ts"
import { LeaseRedis } from "../layers/redis/LeaseRedis.ts"
import { LockedRowsRedis } from "../layers/redis/LockedRowsRedis.ts"
import { PendingDirectUploadsRedis } from "../layers/redis/PendingDirectUploadsRedis.ts"
import { RebalancingStateRedis } from "../layers/redis/RebalancingStateRedis.ts"
import { Redis, type StoreUrls } from "../layers/redis/Redis.ts"
import { RunnerAckQueueRedis } from "../layers/redis/RunnerAckQueueRedis.ts"
import { batches } from "../programs/index.ts"
import { HealthStandbys } from "../services/HealthSignals.ts"
import type { JobQueue } from "../services/JobQueue.ts"
import type { Metrics } from "../services/Metrics.ts"
import type { ObjectStorage } from "../services/ObjectStorage.ts"
import { RunLedger } from "../services/RunLedger.ts"

/**
 * Write steps that span several backends (objects, then events, then entries…), one implementation
 * over whichever backends are chosen: programs call them as contracts, and every
 * composition provides them on top of its backends.
 */
export const RepairSteps = Layer.mergeAll(StaleUploadRepairLive, RebalanceRescheduleLive)

/** Shadow mode's ledger (main) and its reads of GitLab's state (ci's builds, main's jobs, the uploads hash). */
export const ShadowLayers = Layer.mergeAll(ShadowLedgerSql, ShadowObserverSql)

/** The services backed by Redis, given the store connections (Redis.layerStores). */
export const RedisServices = Layer.mergeAll(
  LeaseRedis,
  LockedRowsRedis,
  JobStatusRedis,
  PendingDirectUploadsRedis,
  JobQueueRedis,
  RebalancingStateRedis,
  RunnerAckQueueRedis,
  ConcurrencyLimitsRedis
)

/** The services backed by Redis, each on its GitLab store. */
export const RedisBackends = (urls: StoreUrls) =>
  RedisServices.pipe(
    Layer.provideMerge(Redis.layerStores(urls)),
    // Which store failed is in the RedisError's server; the one-line error names every store host.
    unavailable(
      "Redis",
      Redacted.make([...new Set([urls.sharedState, urls.queues, urls.queuesMetadata].map(Redacted.value))].join(","))
    )
  )

/** The same services in memory (embedded default, specs). */
export const MemoryBackends = Layer.mergeAll(
  LeaseMemory,
  LockedRowsMemory,
  JobStatusMemory,
  PendingDirectUploadsMemory,
  JobQueueMemory,
  RebalancingStateMemory,
  RunnerAckQueueMemory,
  ConcurrencyLimitsMemory
).pipe(Layer.provideMerge(MemoryRedis.layer))

/**
 * The drops' relay of the job outbox to Sidekiq (JobOutbox.ts) on the builds' database (the
 * PgClient it is given) and the JobQueue: the after-transition jobs GitLab would push. Commands that
 * write (`migrate` access) relay what an earlier process left when it is built.
 */
const jobRelay = (access: SchemaAccess) => JobOutboxRelay({ recover: access === "migrate" })

/** The services backed by PostgreSQL, all on one database, given its PgClient (and the JobQueue). */
const sqlBackends = (access: SchemaAccess) =>
  Layer.mergeAll(
    Layer.mergeAll(BuildsSql, StuckBuildsSql).pipe(Layer.provide(jobRelay(access))),
    ExportJobsSql,
    PlatformRecordsSql,
    EventRetentionSql
  ).pipe(
    Layer.provideMerge(EventLogSql)
  )

export const SqlBackends = sqlBackends("migrate")

/** The repairs of GitLab's ci tables: builds (drop-canceling) and the stuck-builds family. */
const CiRepairs = Layer.mergeAll(BuildsSql, StuckBuildsSql)

/**
 * The ci repairs on a decomposed GitLab's ci database: ci's client as their PgClient, their events
 * into ci's outbox in their own transaction, relayed to main's ledger after each commit (Outbox.ts),
 * their jobs into ci's job outbox, relayed to Sidekiq (JobOutbox.ts). The relay's RunLedger goes out
 * to the run guard; its RepairEvents and the outbox's EventLog stay with the ci repairs.
 */
const CiRepairsOnCi = (ci: PgClient.PgClient, access: SchemaAccess) => {
  const ciClient = Layer.merge(Layer.succeed(PgClient.PgClient, ci), Layer.succeed(SqlClient.SqlClient, ci))
  const outbox = OutboxRepairEvents({ recover: access === "migrate" }).pipe(Layer.provide(ciClient))
  return Layer.merge(
    CiRepairs.pipe(
      Layer.provide(Layer.mergeAll(EventLogSqlInto("sweeper_outbox"), outbox, jobRelay(access))),
      Layer.provide(ciClient)
    ),
    Layer.effect(
      RunLedger,
      Effect.gen(function*() {
        return yield* RunLedger
      })
    ).pipe(Layer.provide(outbox))
  )
}

/**
 * The services backed by PostgreSQL, each on the database GitLab keeps its tables in: with ci in
 * main (one database) exactly SqlBackends; decomposed, the ci repairs on ci's client.
 */
export const DatabaseBackends = (access: SchemaAccess = "migrate") =>
  Layer.unwrap(Effect.gen(function*() {
    const ci = yield* CiDatabase
    type Backends = Layer.Layer<
      Layer.Success<typeof SqlBackends>,
      Layer.Error<typeof SqlBackends>,
      Layer.Services<typeof SqlBackends> | MainDatabase | Metrics | JobQueue
    >
    if (!ci.decomposed) return sqlBackends(access) as Backends
    const backends: Backends = Layer.merge(
      CiRepairsOnCi(ci.sql, access),
      Layer.mergeAll(ExportJobsSql, PlatformRecordsSql, EventRetentionSql)
    ).pipe(Layer.provideMerge(EventLogSql))
    return backends
  }))

/**
 * How a command treats the schema: `migrate` applies pending migrations first
 * (`start`, `run`, `migrate`); `read-only` (`status`, `events`, `run --dry-run`, `doctor`) never
 * runs DDL and stops with one line when something is pending. The embedded database is Sweeper's
 * own, so every command migrates it.
 */
export type SchemaAccess = "migrate" | "read-only"

/** The object-storage backend `SWEEPER_OBJECT_STORAGE` names: one layer per provider. */
export const objectStorageLayer = (settings: ObjectStorageSettings): Layer.Layer<ObjectStorage> => {
  switch (settings._tag) {
    case "Local":
      return ObjectStorageLocal(settings.roots)
    case "S3":
      return ObjectStorageS3(settings)
    case "Azure":
      return ObjectStorageAzure(settings)
  }
}

/**
 * Beside a decomposed GitLab, its layout before anything else: a CI_DATABASE_URL naming the wrong
 * database is refused naming the table, with no DDL there (detected standalone, an empty one would
 * get platform tables) and no "run sweeper migrate" first. Columns are checked after migrating.
 */
const gitlabLayoutFirst = (settings: SweeperSettings) =>
  Effect.gen(function*() {
    if (!(yield* CiDatabase).decomposed) return
    if ((yield* detectSchemaMode(settings.schema)).mode === "gitlab") yield* refuseUnusableLayout
  })

/**
 * Applies what is pending on main and, when ci is a database of its own, on ci (its outbox and
 * fences; in standalone mode its platform tables, which main then does not get). Returns what was
 * applied, `ci:`-prefixed for ci's.
 */
export const migrateDatabases = (settings: SweeperSettings, heavy: "run" | "refuse") =>
  Effect.gen(function*() {
    yield* gitlabLayoutFirst(settings)
    const ci = yield* CiDatabase
    const decomposed = ci.decomposed
    const main = yield* migrateWith(settings.schema, { heavy, decomposed })
    const ciApplied = decomposed
      ? yield* onClient(ci.sql)(migrateWith(settings.schema, { database: "ci", decomposed }))
      : []
    return [...main, ...ciApplied.map(([id, name]) => [id, `ci:${name}`] as const)]
  })

/** Pending migrations of main and (when separate) ci, `ci:`-prefixed for ci's. */
export const pendingDatabases = (settings: SweeperSettings) =>
  Effect.gen(function*() {
    yield* gitlabLayoutFirst(settings)
    const ci = yield* CiDatabase
    const { mode } = yield* detectSchemaMode(settings.schema)
    const pending = yield* pendingMigrations(mode)
    if (!ci.decomposed) return pending
    const ciPending = yield* onClient(ci.sql)(
      Effect.flatMap(detectCiSchemaMode(settings.schema), (detected) => pendingMigrations(detected.mode, "ci"))
    )
    return [...pending, ...ciPending.map((name) => `ci:${name}`)]
  })

const Migrated = (settings: SweeperSettings, access: SchemaAccess) =>
  Layer.effectDiscard(Effect.gen(function*() {
    if (access === "migrate" || Option.isNone(settings.databaseUrl)) {
      // A server's ledger may be large: heavy online steps are refused there (see migrateWith).
      const applied = yield* migrateDatabases(settings, Option.isSome(settings.databaseUrl) ? "refuse" : "run")
      if (applied.length > 0) yield* Effect.logInfo("Applied migrations", applied.map(([id, name]) => `${id}_${name}`))
    } else {
      const pending = yield* pendingDatabases(settings)
      if (pending.length > 0) return yield* new SchemaNotMigrated({ pending })
    }
    // Every table a batch uses held by the one database that should write it (a layout that cannot
    // work stops start-up naming the table), and every column a batch uses, checked on that database
    // (a missing one stops start-up naming it): before anything runs.
    yield* checkLayout
  }))

/** A server that cannot be reached (or a URL that cannot be used) is one typed error naming its host. */
const unavailable =
  (service: InfrastructureUnavailable["service"], url: Redacted.Redacted<string>) =>
  <A, E, R>(layer: Layer.Layer<A, E, R>): Layer.Layer<A, InfrastructureUnavailable, R> =>
    Layer.catchCause(
      layer,
      (cause: Cause.Cause<E>) =>
        Layer.effectContext<A, InfrastructureUnavailable, never>(Effect.fail(
          new InfrastructureUnavailable({
            service,
            // A cluster URL is a comma list of seed nodes: every host of it.
            host: [...new Set(Redacted.value(url).split(",").map((part) => hostOfUrl(part.trim())))].join(","),
            detail: describeError(Cause.squash(cause))
          })
        ))
    )

type Embedded = ReturnType<typeof layerEmbedded>

/** The PostgreSQL client configuration picks, nothing checked or migrated (`sweeper migrate`). */
export const databaseClientLayer = (
  settings: SweeperSettings
): Layer.Layer<Layer.Success<Embedded>, Layer.Error<Embedded> | InfrastructureUnavailable> =>
  Option.match(settings.databaseUrl, {
    onNone: () => layerEmbedded(settings.dataDir),
    onSome: (url) => layerServer(url, settings.databaseTimeouts).pipe(unavailable("PostgreSQL", url))
  })

type CiClientError = Layer.Error<Embedded> | InfrastructureUnavailable | SqlError

/** The PostgreSQL server at `url` could not be reached, or refused the connection: one line naming its host. */
const postgresUnavailable = (url: Redacted.Redacted<string>, error: unknown) =>
  new InfrastructureUnavailable({
    service: "PostgreSQL",
    host: hostOfUrl(Redacted.value(url)),
    detail: describeError(error)
  })

/**
 * GitLab's ci database as configuration names it (needs main's PgClient): CI_DATABASE_URL's server,
 * or a second embedded database under `<dataDir>/ci` (SWEEPER_EMBEDDED_CI_DATABASE); else main's
 * client. A CI_DATABASE_URL that reaches main's very database is treated as one database.
 */
export const ciClientLayer = (
  settings:
    & Pick<SweeperSettings, "ciDatabaseUrl" | "embeddedCiDatabase" | "dataDir">
    & Partial<Pick<SweeperSettings, "databaseTimeouts">>
): Layer.Layer<CiDatabase, CiClientError, PgClient.PgClient> => {
  type Client = Layer.Layer<PgClient.PgClient, CiClientError>
  const separate = Option.match(settings.ciDatabaseUrl, {
    onNone: (): Option.Option<Client> =>
      settings.embeddedCiDatabase ? Option.some(layerEmbedded(join(settings.dataDir, "ci"))) : Option.none(),
    onSome: (url): Option.Option<Client> =>
      Option.some(layerServer(url, settings.databaseTimeouts).pipe(unavailable("PostgreSQL", url)))
  })
  if (Option.isNone(separate)) return SingleDatabase
  return Layer.effect(
    CiDatabase,
    Effect.gen(function*() {
      const main = yield* PgClient.PgClient
      const ci = Context.get(yield* Layer.build(separate.value), PgClient.PgClient)
      // ci's first query, a trivial one, and main has answered already: failing, ci cannot be reached
      // (down, refused, no such database or role): one line naming its host.
      const decomposed = !(yield* sameDatabase(main, ci).pipe(
        Effect.catch((error): Effect.Effect<never, SqlError | InfrastructureUnavailable> =>
          Option.isSome(settings.ciDatabaseUrl)
            ? Effect.fail(postgresUnavailable(settings.ciDatabaseUrl.value, error))
            : Effect.fail(error)
        )
      ))
      return CiDatabase.of({ sql: decomposed ? ci : main, decomposed })
    })
  )
}

/**
 * effect's SqlError reasons that mean "could not get to the server", as opposed to a bad query: a
 * connection or authentication error, or any error the server answered while a connection was being
 * opened (operation "connect": no such database, 3D000, arrives as an UnknownError).
 */
const isConnectionFailure = (error: unknown) => {
  const reason = Predicate.hasProperty(error, "reason") ? error.reason : undefined
  return Predicate.isTagged(reason, "ConnectionError") || Predicate.isTagged(reason, "AuthenticationError") ||
    (Predicate.hasProperty(reason, "operation") && reason.operation === "connect")
}

/** Main's client, ci's (CiDatabase) and main's by its own name (MainDatabase), nothing migrated. */
export const databaseClientsLayer = (settings: SweeperSettings) =>
  Layer.merge(ciClientLayer(settings), MainDatabaseLive).pipe(Layer.provideMerge(databaseClientLayer(settings)))

/** A cause whose failure is a connection failure of main's server, as one typed error naming its host. */
const mainUnavailable = (settings: SweeperSettings, cause: Cause.Cause<unknown>) =>
  Option.isSome(settings.databaseUrl) && isConnectionFailure(Cause.squash(cause))
    ? Option.some(postgresUnavailable(settings.databaseUrl.value, Cause.squash(cause)))
    : Option.none()

/**
 * Main's client connects lazily: an unreachable server (or a missing database or role) surfaces at
 * the first query. An effect that makes it, as one typed error naming the host.
 */
export const reachingMain = (settings: SweeperSettings) => <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.catchCause(effect, (cause) =>
    Option.match(mainUnavailable(settings, cause), {
      onNone: () => Effect.failCause(cause),
      onSome: (error): Effect.Effect<never, E | InfrastructureUnavailable> => Effect.fail(error)
    }))

export const databaseLayer = (settings: SweeperSettings, access: SchemaAccess = "migrate") => {
  const layer = Migrated(settings, access).pipe(Layer.provideMerge(databaseClientsLayer(settings)))
  // The schema check is the first query.
  return Layer.catchCause(
    layer,
    (cause) =>
      Layer.effectContext<Layer.Success<typeof layer>, Layer.Error<typeof layer> | InfrastructureUnavailable, never>(
        Option.match(mainUnavailable(settings, cause), {
          onNone: () => Effect.failCause(cause),
          onSome: Effect.fail
        })
      )
  )
}

/**
 * The PostgreSQL databases configuration names: one, or `main: …, ci: …` when GitLab's ci tables
 * have a database of their own (CI_DATABASE_URL, or the second embedded one).
 */
export const describePostgres = (
  settings: Pick<SweeperSettings, "databaseUrl" | "ciDatabaseUrl" | "embeddedCiDatabase" | "dataDir">
) => {
  const main = describeMainDatabase(settings)
  return Option.match(describeCiDatabase(settings), {
    onNone: () => main,
    onSome: (separate) => `main: ${main}, ci: ${separate}`
  })
}

/** Main's database as configuration names it: its URL (password redacted) or the embedded one's directory. */
export const describeMainDatabase = (settings: Pick<SweeperSettings, "databaseUrl" | "dataDir">) =>
  Option.match(settings.databaseUrl, {
    onNone: () => `embedded PGlite (${join(settings.dataDir, "pgdata")})`,
    onSome: (url) => redact(Redacted.value(url))
  })

/** ci's database when configuration names one of its own (CI_DATABASE_URL, or the second embedded one). */
export const describeCiDatabase = (
  settings: Pick<SweeperSettings, "databaseUrl" | "ciDatabaseUrl" | "embeddedCiDatabase" | "dataDir">
) =>
  Option.match(settings.ciDatabaseUrl, {
    onNone: () =>
      settings.embeddedCiDatabase && Option.isNone(settings.databaseUrl)
        ? Option.some(`embedded PGlite (${join(settings.dataDir, "ci", "pgdata")})`)
        : Option.none<string>(),
    onSome: (url) => Option.some(redact(Redacted.value(url)))
  })

export const describeBackends = (settings: SweeperSettings) => ({
  postgres: describePostgres(settings),
  redis: Option.match(storeUrls(settings), {
    onNone: () => "in-memory (embedded, this process only)",
    onSome: (urls) => {
      const describe = (url: Redacted.Redacted<string>) => {
        const raw = Redacted.value(url)
        return `${raw.includes(",") ? "cluster " : ""}${redact(raw)}`
      }
      const all = [urls.sharedState, urls.queues, urls.queuesMetadata].map(describe)
      return all[0] === all[1] && all[1] === all[2]
        ? all[0]!
        : `sharedState ${all[0]}, queues ${all[1]}, queuesMetadata ${all[2]}`
    }
  }),
  objectStorage: describeObjectStorage(settings.objectStorage)
})

/** The three store URLs when Redis is configured (Config has checked each resolves). */
export const storeUrls = (settings: SweeperSettings): Option.Option<StoreUrls> => Option.all(resolveStoreUrls(settings))

/**
 * The health gate when SWEEPER_HEALTH is set: HealthGate and HealthReport for every
 * batch in the registry, its signals read on the databases and Redis stores configured here
 * (PostgreSQL's on main and, when ci is a database of its own, on ci too: needs CiDatabase).
 * Absent, both references keep their defaults (a gate that never holds, a report saying so).
 */
export const healthLayer = (settings: Pick<SweeperSettings, "health" | "healthStandbys" | "concurrencyLimits">) =>
  Option.match(settings.health, {
    onNone: () => Layer.empty,
    onSome: (config) =>
      HealthGateLive({ config, batches, concurrencyLimits: settings.concurrencyLimits }).pipe(
        Layer.provide(DatabaseSignalsLive),
        Layer.provide(HealthSignalsLive),
        Layer.provide(Layer.succeed(HealthStandbys, settings.healthStandbys))
      )
  })

/** Platform backends chosen by configuration, with SweeperConfig; the schema as `access` says. */
export const appLayer = (access: SchemaAccess) =>
  Layer.unwrap(Effect.gen(function*() {
    const settings = yield* SweeperConfig
    const platform = Layer.mergeAll(
      DatabaseBackends(access),
      objectStorageLayer(settings.objectStorage),
      TuningFromConfig
    )
    // The drops' job relay pushes through the JobQueue: the Redis-backed services feed the database ones.
    const backends = Layer.mergeAll(Option.match(storeUrls(settings), {
      onNone: () => Layer.provideMerge(platform, MemoryBackends),
      onSome: (urls) => Layer.provideMerge(platform, RedisBackends(urls))
    }))
    return Layer.mergeAll(healthLayer(settings), RepairSteps, ShadowLayers).pipe(
      Layer.provideMerge(Layer.provideMerge(backends, MetricsPrometheus)),
      Layer.provideMerge(databaseLayer(settings, access))
    )
  })).pipe(Layer.provideMerge(SweeperConfig.layer))

/** Platform backends chosen by configuration, migrated, with SweeperConfig. */
export const AppLayer = appLayer("migrate")

/** The same backends for commands that only read: nothing migrated. */
export const ReadOnlyAppLayer = appLayer("read-only")
