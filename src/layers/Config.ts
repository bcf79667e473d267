/**
 * Sweeper's configuration, read once from the environment with effect `Config`. A bad value fails
 * start-up with one message naming the variable (`InvalidConfig`).
 */
import { Config, Context, Duration, Effect, Layer, Option, type Redacted, Schema } from "effect"
import { hostname } from "node:os"
import { InvalidConfig } from "../domain/Errors.ts"
import { NoObjectStorage, ObjectStorageJson, type ObjectStorageSettings } from "./ObjectStorageConfig.ts"

export interface ConcurrencyLimitSetting {
  readonly limit: number
  readonly queue: string
}

export interface SweeperSettings {
  readonly databaseUrl: Option.Option<Redacted.Redacted<string>>
  readonly redisUrl: Option.Option<Redacted.Redacted<string>>
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
}

const ConcurrencyLimitsJson = Schema.fromJsonString(Schema.Record(
  Schema.String,
  Schema.Struct({ limit: Schema.Int, queue: Schema.optionalKey(Schema.String) })
))

const settings = Config.all({
  databaseUrl: Config.option(Config.Redacted("DATABASE_URL")),
  redisUrl: Config.option(Config.Redacted("REDIS_URL")),
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
  schema: Config.option(Config.schema(Schema.Literals(["gitlab", "standalone"]), "SWEEPER_SCHEMA"))
})

/** Pulls the variable name out of a ConfigError so the message leads with it. */
const variableOf = (message: string): string => /\["([A-Z0-9_]+)"\]/.exec(message)?.[1] ?? "environment"

export class SweeperConfig extends Context.Service<SweeperConfig, SweeperSettings>()("sweeper/layers/Config") {
  static readonly layer = Layer.effect(
    SweeperConfig,
    settings.pipe(
      Effect.mapError((error) => new InvalidConfig({ variable: variableOf(error.message), message: error.message }))
    )
  )

  /** For specs and embedded tools: defaults with overrides, no environment read. */
  static readonly layerWith = (overrides: Partial<SweeperSettings>) =>
    Layer.succeed(SweeperConfig, {
      databaseUrl: Option.none(),
      redisUrl: Option.none(),
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
      ...overrides
    })
}
