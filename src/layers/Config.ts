/**
 * Sweeper's configuration, read once from the environment with effect `Config`. A bad value fails
 * start-up with one message naming the variable (`InvalidConfig`).
 */
import { Config, Context, Duration, Effect, Layer, Option, Redacted, Schema } from "effect"
import { hostname } from "node:os"
import { DROP_BATCH_SIZE, DROP_BATCH_SIZE_MAX, DropBatchSize } from "../domain/Build.ts"
import { InvalidConfig } from "../domain/Errors.ts"
import { parseRedisUrl } from "./Redis.ts"
import { NoObjectStorage, ObjectStorageJson, type ObjectStorageSettings } from "./ObjectStorageConfig.ts"

export interface ConcurrencyLimitSetting {
  readonly limit: number
  readonly queue: string
}

export interface SweeperSettings {
  readonly databaseUrl: Option.Option<Redacted.Redacted<string>>
  readonly redisUrl: Option.Option<Redacted.Redacted<string>>
  /** GitLab's three Redis stores (SPEC §8.2), each defaulting to REDIS_URL; a comma list is a cluster. */
  readonly redisStoreUrls: RedisStoreUrlSettings
  /** Embedded PGlite data lives here (`<dataDir>/pgdata`). */
  readonly dataDir: string
  /** Names this process in RunStarted events and tick leases. */
  readonly node: string
  /** Where each location's objects live (`SWEEPER_OBJECT_STORAGE`, see ObjectStorageConfig.ts). */
  readonly objectStorage: ObjectStorageSettings
  /** worker class name → limit and queue (`SWEEPER_CONCURRENCY_LIMITS`). */
  readonly concurrencyLimits: Readonly<Record<string, ConcurrencyLimitSetting>>
  readonly httpHost: string
  readonly httpPort: number
  readonly timezone: string
  readonly disabledBatches: ReadonlyArray<string>
  readonly shutdownGrace: Duration.Duration
  /** Bearer token for the HTTP API's mutating actions (run now, pause, resume); none disables them. */
  readonly apiToken: Option.Option<Redacted.Redacted<string>>
  /** `SWEEPER_SCHEMA`: who owns the platform tables (SPEC §8.1); none detects it from the database. */
  readonly schema: Option.Option<"gitlab" | "standalone">
  /** `SWEEPER_DROP_BATCH_SIZE`: drop-canceling-builds' page, read and repaired per transaction. */
  readonly dropBatchSize: number
}

export interface RedisStoreUrlSettings {
  readonly sharedState: Option.Option<Redacted.Redacted<string>>
  readonly queues: Option.Option<Redacted.Redacted<string>>
  readonly queuesMetadata: Option.Option<Redacted.Redacted<string>>
}

const noStoreUrls: RedisStoreUrlSettings = { sharedState: Option.none(), queues: Option.none(), queuesMetadata: Option.none() }

const STORE_VARIABLES = {
  sharedState: "REDIS_SHARED_STATE_URL",
  queues: "REDIS_QUEUES_URL",
  queuesMetadata: "REDIS_QUEUES_METADATA_URL"
} as const

/** Each store's URL: its own variable, else REDIS_URL; None when neither is set. */
export const resolveStoreUrls = (settings: Pick<SweeperSettings, "redisUrl" | "redisStoreUrls">) => ({
  sharedState: Option.orElse(settings.redisStoreUrls.sharedState, () => settings.redisUrl),
  queues: Option.orElse(settings.redisStoreUrls.queues, () => settings.redisUrl),
  queuesMetadata: Option.orElse(settings.redisStoreUrls.queuesMetadata, () => settings.redisUrl)
})

/** Any Redis configured at all (REDIS_URL or a store URL). */
export const redisConfigured = (settings: Pick<SweeperSettings, "redisUrl" | "redisStoreUrls">) =>
  Option.isSome(settings.redisUrl) || Object.values(settings.redisStoreUrls).some(Option.isSome)

/**
 * SPEC §8.2: the in-memory Redis exists only for the all-embedded default. A real PostgreSQL with
 * the in-memory Redis would run the Redis batches on an empty store and report ready, and the
 * reverse would keep Sweeper's history in a local PGlite nobody else sees: both are start-up errors.
 * Every store URL must also parse (a comma list is a cluster, which has only database 0).
 */
const checkHalfEmbedded = (settings: SweeperSettings): Option.Option<InvalidConfig> => {
  const hasDatabase = Option.isSome(settings.databaseUrl)
  if (!redisConfigured(settings)) {
    return hasDatabase
      ? Option.some(new InvalidConfig({ variable: "REDIS_URL", message: "DATABASE_URL is set but REDIS_URL is not: set both (a real GitLab) or neither (the embedded default)" }))
      : Option.none()
  }
  if (!hasDatabase) {
    const variable = Option.isSome(settings.redisUrl) ? "REDIS_URL" : "REDIS_*_URL"
    return Option.some(new InvalidConfig({ variable: "DATABASE_URL", message: `${variable} is set but DATABASE_URL is not: set both (a real GitLab) or neither (the embedded default)` }))
  }
  const urls = resolveStoreUrls(settings)
  for (const store of ["sharedState", "queues", "queuesMetadata"] as const) {
    const variable = STORE_VARIABLES[store]
    const url = urls[store]
    if (Option.isNone(url)) {
      return Option.some(new InvalidConfig({ variable, message: `neither ${variable} nor REDIS_URL is set` }))
    }
    const parsed = parseRedisUrl(Redacted.value(url.value))
    if (parsed.kind === "invalid") {
      return Option.some(new InvalidConfig({ variable: Option.isSome(settings.redisStoreUrls[store]) ? variable : "REDIS_URL", message: parsed.message }))
    }
  }
  return Option.none()
}

const ConcurrencyLimitsJson = Schema.fromJsonString(Schema.Record(
  Schema.String,
  Schema.Struct({ limit: Schema.Int, queue: Schema.optionalKey(Schema.String) })
))

const settings = Config.all({
  databaseUrl: Config.option(Config.Redacted("DATABASE_URL")),
  redisUrl: Config.option(Config.Redacted("REDIS_URL")),
  redisStoreUrls: Config.all({
    sharedState: Config.option(Config.Redacted(STORE_VARIABLES.sharedState)),
    queues: Config.option(Config.Redacted(STORE_VARIABLES.queues)),
    queuesMetadata: Config.option(Config.Redacted(STORE_VARIABLES.queuesMetadata))
  }),
  dataDir: Config.String("SWEEPER_DATA_DIR").pipe(Config.withDefault(".sweeper")),
  node: Config.String("SWEEPER_NODE_NAME").pipe(Config.withDefault(`${hostname()}:${process.pid}`)),
  objectStorage: Config.schema(ObjectStorageJson, "SWEEPER_OBJECT_STORAGE").pipe(Config.withDefault(NoObjectStorage)),
  concurrencyLimits: Config.schema(ConcurrencyLimitsJson, "SWEEPER_CONCURRENCY_LIMITS").pipe(
    Config.withDefault({}),
    Config.map((limits) =>
      Object.fromEntries(Object.entries(limits).map(([worker, s]) => [worker, { limit: s.limit, queue: s.queue ?? "default" }]))
    )
  ),
  httpHost: Config.String("SWEEPER_HTTP_HOST").pipe(Config.withDefault("127.0.0.1")),
  // 0 asks the OS for a free port (tests, several replicas on one machine).
  httpPort: Config.schema(Schema.NumberFromString.pipe(Schema.check(Schema.isInt(), Schema.isBetween({ minimum: 0, maximum: 65535 }))), "SWEEPER_HTTP_PORT").pipe(
    Config.withDefault(9394)
  ),
  timezone: Config.String("SWEEPER_TIMEZONE").pipe(Config.withDefault("UTC")),
  disabledBatches: Config.String("SWEEPER_DISABLED_BATCHES").pipe(
    Config.withDefault(""),
    Config.map((list) => list.split(",").map((name) => name.trim()).filter((name) => name.length > 0))
  ),
  shutdownGrace: Config.Duration("SWEEPER_SHUTDOWN_GRACE").pipe(Config.withDefault(Duration.seconds(25))),
  apiToken: Config.option(Config.Redacted("SWEEPER_API_TOKEN")),
  schema: Config.option(Config.schema(Schema.Literals(["gitlab", "standalone"]), "SWEEPER_SCHEMA")),
  dropBatchSize: Config.schema(
    Schema.NumberFromString.pipe(Schema.check(Schema.isInt(), Schema.isBetween({ minimum: 1, maximum: DROP_BATCH_SIZE_MAX }))),
    "SWEEPER_DROP_BATCH_SIZE"
  ).pipe(Config.withDefault(DROP_BATCH_SIZE))
})

/** Pulls the variable name out of a ConfigError so the message leads with it. */
const variableOf = (message: string): string => /\["([A-Z0-9_]+)"\]/.exec(message)?.[1] ?? "environment"

export class SweeperConfig extends Context.Service<SweeperConfig, SweeperSettings>()("sweeper/layers/Config") {
  static readonly layer = Layer.effect(
    SweeperConfig,
    settings.pipe(
      Effect.mapError((error) => new InvalidConfig({ variable: variableOf(error.message), message: error.message })),
      Effect.flatMap((loaded) => Option.match(checkHalfEmbedded(loaded), { onNone: () => Effect.succeed(loaded), onSome: Effect.fail }))
    )
  )

  /** For specs and embedded tools: defaults with overrides, no environment read. */
  static readonly layerWith = (overrides: Partial<SweeperSettings>) =>
    Layer.succeed(SweeperConfig, {
      databaseUrl: Option.none(),
      redisUrl: Option.none(),
      redisStoreUrls: noStoreUrls,
      dataDir: ".sweeper",
      node: "test-node",
      objectStorage: NoObjectStorage,
      concurrencyLimits: {},
      httpHost: "127.0.0.1",
      httpPort: 0,
      timezone: "UTC",
      disabledBatches: [],
      shutdownGrace: Duration.seconds(25),
      apiToken: Option.none(),
      schema: Option.none(),
      dropBatchSize: DROP_BATCH_SIZE,
      ...overrides
    })
}

/** Programs' tuning references (e.g. DropBatchSize) set from SweeperConfig. */
export const TuningFromConfig = Layer.effect(
  DropBatchSize,
  Effect.map(SweeperConfig, (settings: SweeperSettings) => settings.dropBatchSize)
)
