/**
 * Sweeper's configuration, read once from the environment with effect `Config`, every variable
 * decoded by its own Schema at the edge. A bad value fails start-up with one message naming the
 * variable (`InvalidConfig`); nothing falls back to a default because it was malformed or empty.
 */
import * as Config from "effect/Config"
import * as ConfigProvider from "effect/ConfigProvider"
import * as Context from "effect/Context"
import type * as Cron from "effect/Cron"
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Redacted from "effect/Redacted"
import * as Result from "effect/Result"
import * as Schema from "effect/Schema"
import * as SchemaTransformation from "effect/SchemaTransformation"
import { hostname } from "node:os"
import type { Batch } from "../domain/Batch.ts"
import { DROP_BATCH_SIZE, DROP_BATCH_SIZE_MAX, DropBatchSize } from "../domain/Build.ts"
import { type ConcurrencyLimitSetting, isWorkerClassName } from "../domain/ConcurrencyLimit.ts"
import { InvalidConfig } from "../domain/Errors.ts"
import type { HealthConfig } from "../domain/Health.ts"
import { HealthJson } from "../domain/HealthConfig.ts"
import { EVENT_RETENTION, EventRetentionPeriod, MIN_EVENT_RETENTION } from "../domain/Retention.ts"
import { CRON_HORIZON, cronVariable, firesWithin, leaseTtlVariable, parseCron } from "../domain/Schedule.ts"
import { type Mode, MODES, modeVariable, SHADOW_BATCHES, shadowCapable } from "../domain/Shadow.ts"
import { NO_SELECTION, type StandbySelection, StandbySelectionJson } from "../domain/Standbys.ts"
import {
  CurrentFailureReasonSet,
  FAILURE_REASON_SETS,
  type FailureReasonSet,
  RunnerProvisioningTimeoutReason
} from "../domain/StuckBuilds.ts"
import {
  CurrentTransitionQueues,
  DEFAULT_ROUTING,
  resolveTransitionQueues,
  TRANSITION_WORKERS,
  type TransitionQueues
} from "../domain/TransitionJobs.ts"
import { NoObjectStorage, ObjectStorageJson, type ObjectStorageSettings } from "./ObjectStorageConfig.ts"
import { parseRedisUrl } from "./RedisUrl.ts"

export interface SweeperSettings {
  readonly databaseUrl: Option.Option<Redacted.Redacted<string>>
  /**
   * `CI_DATABASE_URL`: GitLab's ci database when it is separate (a decomposed GitLab); absent, the
   * ci tables are in DATABASE_URL's database. Needs DATABASE_URL.
   */
  readonly ciDatabaseUrl: Option.Option<Redacted.Redacted<string>>
  /**
   * `SWEEPER_EMBEDDED_CI_DATABASE`: with the embedded default, keep the ci tables in a second
   * embedded database (`<dataDir>/ci`), as a decomposed GitLab does (demos, simulator).
   */
  readonly embeddedCiDatabase: boolean
  readonly redisUrl: Option.Option<Redacted.Redacted<string>>
  /** GitLab's three Redis stores, each defaulting to REDIS_URL; a comma list is a cluster. */
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
  /**
   * `SWEEPER_HTTP_ALLOWED_HOSTS`: names besides its own address and `localhost` that the server
   * answers to in a request's Host (a reverse proxy's name, a DNS name of this machine); lower case.
   */
  readonly httpAllowedHosts: ReadonlyArray<string>
  readonly timezone: string
  readonly disabledBatches: ReadonlyArray<string>
  readonly shutdownGrace: Duration.Duration
  /** Bearer token for the HTTP API's mutating actions (run now, pause, resume); none disables them. */
  readonly apiToken: Option.Option<Redacted.Redacted<string>>
  /** `SWEEPER_SCHEMA`: who owns the platform tables; none detects it from the database. */
  readonly schema: Option.Option<"gitlab" | "standalone">
  /** `SWEEPER_DROP_BATCH_SIZE`: drop-canceling-builds' page, read and repaired per transaction. */
  readonly dropBatchSize: number
  /** `SWEEPER_FAILURE_REASONS`: which GitLab's failure reasons the stuck-builds drops write. */
  readonly failureReasons: FailureReasonSet
  /**
   * `SWEEPER_RUNNER_PROVISIONING_TIMEOUT_REASON`: the integer of GitLab's runner_provisioning_timeout
   * in the operator's GitLab; none keeps drop-pending-builds' waiting-for-ack rule off.
   */
  readonly runnerProvisioningTimeoutReason: Option.Option<number>
  /** `SWEEPER_TRANSITION_QUEUES`: the Sidekiq queue of each job a drop owes GitLab (domain/TransitionJobs.ts). */
  readonly transitionQueues: TransitionQueues
  /** `SWEEPER_EVENT_RETENTION`: events older than this are pruned (prune-events, `sweeper events prune`). */
  readonly eventRetention: Duration.Duration
  /** `SWEEPER_HEALTH`: the health gate's signals and thresholds; none = no gate. */
  readonly health: Option.Option<HealthConfig>
  /** `SWEEPER_HEALTH_STANDBYS`: standbys replicationLag watches or ignores besides its default (domain/Standbys.ts). */
  readonly healthStandbys: StandbySelection
  /** `SWEEPER_PG_*_TIMEOUT`: what every connection to a GitLab database sets for its session. */
  readonly databaseTimeouts: DatabaseTimeouts
}

/**
 * PostgreSQL's statement_timeout, lock_timeout and idle_in_transaction_session_timeout for each
 * session Sweeper opens to a server (`SWEEPER_PG_STATEMENT_TIMEOUT`, `…_LOCK_TIMEOUT`,
 * `…_IDLE_IN_TRANSACTION_TIMEOUT`): no statement of Sweeper's runs, waits for a lock or sits in an
 * open transaction longer than these on GitLab's databases. Zero sends nothing: the server's or
 * the role's own setting applies (behind a pooler that refuses these startup parameters, set them
 * on the role; `sweeper doctor` shows what is in force).
 */
export interface DatabaseTimeouts {
  readonly statement: Duration.Duration
  readonly lock: Duration.Duration
  readonly idleInTransaction: Duration.Duration
}

export const DATABASE_TIMEOUTS: DatabaseTimeouts = {
  statement: Duration.seconds(60),
  lock: Duration.seconds(10),
  idleInTransaction: Duration.seconds(60)
}

export interface RedisStoreUrlSettings {
  readonly sharedState: Option.Option<Redacted.Redacted<string>>
  readonly queues: Option.Option<Redacted.Redacted<string>>
  readonly queuesMetadata: Option.Option<Redacted.Redacted<string>>
}

const noStoreUrls: RedisStoreUrlSettings = {
  sharedState: Option.none(),
  queues: Option.none(),
  queuesMetadata: Option.none()
}

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
 * The in-memory Redis exists only for the all-embedded default. A real PostgreSQL with
 * the in-memory Redis would run the Redis batches on an empty store and report ready, and the
 * reverse would keep Sweeper's history in a local PGlite nobody else sees: both are start-up errors.
 * Every store URL must also parse (a comma list is a cluster, which has only database 0).
 */
const checkHalfEmbedded = (settings: SweeperSettings): Option.Option<InvalidConfig> => {
  const hasDatabase = Option.isSome(settings.databaseUrl)
  if (Option.isSome(settings.ciDatabaseUrl) && !hasDatabase) {
    return Option.some(
      new InvalidConfig({
        variable: "DATABASE_URL",
        message: "CI_DATABASE_URL is set but DATABASE_URL is not: the ci database needs its main database"
      })
    )
  }
  if (settings.embeddedCiDatabase && hasDatabase) {
    return Option.some(
      new InvalidConfig({
        variable: "SWEEPER_EMBEDDED_CI_DATABASE",
        message: "SWEEPER_EMBEDDED_CI_DATABASE is for the embedded default: with DATABASE_URL, set CI_DATABASE_URL"
      })
    )
  }
  if (!redisConfigured(settings)) {
    return hasDatabase
      ? Option.some(
        new InvalidConfig({
          variable: "REDIS_URL",
          message:
            "DATABASE_URL is set but REDIS_URL is not: set both (a real GitLab) or neither (the embedded default)"
        })
      )
      : Option.none()
  }
  if (!hasDatabase) {
    const variable = Option.isSome(settings.redisUrl) ? "REDIS_URL" : "REDIS_*_URL"
    return Option.some(
      new InvalidConfig({
        variable: "DATABASE_URL",
        message:
          `${variable} is set but DATABASE_URL is not: set both (a real GitLab) or neither (the embedded default)`
      })
    )
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
      return Option.some(
        new InvalidConfig({
          variable: Option.isSome(settings.redisStoreUrls[store]) ? variable : "REDIS_URL",
          message: parsed.message
        })
      )
    }
  }
  return Option.none()
}

/**
 * The process environment as Sweeper reads it. Effect's default provider treats `VAR=""` as unset,
 * which silently turned an empty cron or port into the default: here an empty value is a value,
 * and each variable's schema says whether it is allowed (main.ts and the REPL install it).
 */
export const environment = ConfigProvider.fromEnv({ preserveEmptyStrings: true })

const NonEmpty = Schema.String.check(Schema.isNonEmpty({ message: "must not be empty" }))

/** Decimal digits only: `Number()` also takes `0x50` (port 80), `1e3`, ` 80` and `""` (0). */
const HttpPort = Schema.String.check(
  Schema.isPattern(/^[0-9]{1,5}$/, { message: "expected a decimal port number 0-65535" })
).pipe(
  Schema.decodeTo(
    Schema.Int.check(Schema.isBetween({ minimum: 0, maximum: 65535 })),
    SchemaTransformation.numberFromString
  )
)

/** An IANA zone (or fixed offset) that DateTime, and so Cron, understands. */
const TimeZone = NonEmpty.check(
  Schema.makeFilter((zone: string) => Option.isSome(DateTime.zoneFromString(zone)) || `unknown time zone "${zone}"`)
)

/** At least one second: the lease is renewed every TTL/3, so "0 seconds" renews in a busy loop. */
export const LeaseTtl = Schema.DurationFromString.check(
  Schema.makeFilter((ttl: Duration.Duration) =>
    Duration.toMillis(ttl) >= 1000 || `must be at least 1 second, got ${Duration.format(ttl)}`
  )
)

/** At least MIN_EVENT_RETENTION (1 day): domain/Retention.ts says why. */
export const EventRetentionDuration = Schema.DurationFromString.check(
  Schema.makeFilter((retention: Duration.Duration) =>
    Duration.toMillis(retention) >= Duration.toMillis(MIN_EVENT_RETENTION) ||
    `must be at least ${Duration.format(MIN_EVENT_RETENTION)} (the prune runs daily), got ${Duration.format(retention)}`
  )
)

/**
 * `SWEEPER_TRANSITION_QUEUES`: `default`, `worker`, or a JSON object of worker class → queue naming
 * only the three workers a drop pushes (a typo'd class fails start-up rather than being ignored).
 */
const TransitionQueuesSetting = Schema.Union([
  Schema.Literals(["default", "worker"]),
  Schema.fromJsonString(
    Schema.Record(Schema.String, NonEmpty).check(Schema.makeFilter((queues) => {
      const bad = Object.keys(queues).find((worker) => !(TRANSITION_WORKERS as ReadonlyArray<string>).includes(worker))
      return bad === undefined ||
        `worker ${JSON.stringify(bad)} is not one a drop pushes (${TRANSITION_WORKERS.join(", ")})`
    }))
  )
])

/** A failure_reason integer as GitLab's enum stores it (a non-negative integer). */
const ReasonInteger = Schema.String.check(
  Schema.isPattern(/^[0-9]{1,5}$/, { message: "expected the failure_reason integer, e.g. 24" })
).pipe(Schema.decodeTo(Schema.Int, SchemaTransformation.numberFromString))

// The key check is a filter on the whole record: a refined key schema in Schema.Record silently
// drops the keys it refuses, and a typo'd worker would vanish instead of failing start-up.
const ConcurrencyLimitsJson = Schema.fromJsonString(
  Schema.Record(
    Schema.String,
    Schema.Struct({ limit: Schema.Int, queue: Schema.optionalKey(NonEmpty) })
  ).check(Schema.makeFilter((limits) => {
    const bad = Object.keys(limits).find((worker) => !isWorkerClassName(worker))
    return bad === undefined ||
      `worker ${JSON.stringify(bad)} is not a class name like "Releases::CreateEvidenceWorker"`
  }))
)

const settings = Config.all({
  databaseUrl: Config.option(Config.schema(Schema.Redacted(NonEmpty), "DATABASE_URL")),
  ciDatabaseUrl: Config.option(Config.schema(Schema.Redacted(NonEmpty), "CI_DATABASE_URL")),
  embeddedCiDatabase: Config.Boolean("SWEEPER_EMBEDDED_CI_DATABASE").pipe(Config.withDefault(false)),
  redisUrl: Config.option(Config.schema(Schema.Redacted(NonEmpty), "REDIS_URL")),
  dataDir: Config.schema(NonEmpty, "SWEEPER_DATA_DIR").pipe(Config.withDefault(".sweeper")),
  node: Config.schema(NonEmpty, "SWEEPER_NODE_NAME").pipe(Config.withDefault(`${hostname()}:${process.pid}`)),
  redisStoreUrls: Config.all({
    sharedState: Config.option(Config.Redacted(STORE_VARIABLES.sharedState)),
    queues: Config.option(Config.Redacted(STORE_VARIABLES.queues)),
    queuesMetadata: Config.option(Config.Redacted(STORE_VARIABLES.queuesMetadata))
  }),
  objectStorage: Config.schema(ObjectStorageJson, "SWEEPER_OBJECT_STORAGE").pipe(Config.withDefault(NoObjectStorage)),
  concurrencyLimits: Config.schema(ConcurrencyLimitsJson, "SWEEPER_CONCURRENCY_LIMITS").pipe(
    Config.withDefault({}),
    Config.map((limits) =>
      Object.fromEntries(
        Object.entries(limits).map(([worker, s]) => [worker, { limit: s.limit, queue: s.queue ?? "default" }])
      )
    )
  ),
  httpHost: Config.schema(NonEmpty, "SWEEPER_HTTP_HOST").pipe(Config.withDefault("127.0.0.1")),
  // 0 asks the OS for a free port (tests, several replicas on one machine).
  httpPort: Config.schema(HttpPort, "SWEEPER_HTTP_PORT").pipe(Config.withDefault(9394)),
  httpAllowedHosts: Config.String("SWEEPER_HTTP_ALLOWED_HOSTS").pipe(
    Config.withDefault(""),
    Config.map((list) => list.split(",").map((name) => name.trim().toLowerCase()).filter((name) => name.length > 0))
  ),
  timezone: Config.schema(TimeZone, "SWEEPER_TIMEZONE").pipe(Config.withDefault("UTC")),
  disabledBatches: Config.String("SWEEPER_DISABLED_BATCHES").pipe(
    Config.withDefault(""),
    Config.map((list) => list.split(",").map((name) => name.trim()).filter((name) => name.length > 0))
  ),
  shutdownGrace: Config.Duration("SWEEPER_SHUTDOWN_GRACE").pipe(Config.withDefault(Duration.seconds(25))),
  // Empty is refused, not "disabled": a bearer token "" would be too easy to match.
  apiToken: Config.option(Config.schema(Schema.Redacted(NonEmpty), "SWEEPER_API_TOKEN")),
  schema: Config.option(Config.schema(Schema.Literals(["gitlab", "standalone"]), "SWEEPER_SCHEMA")),
  dropBatchSize: Config.schema(
    Schema.NumberFromString.pipe(
      Schema.check(Schema.isInt(), Schema.isBetween({ minimum: 1, maximum: DROP_BATCH_SIZE_MAX }))
    ),
    "SWEEPER_DROP_BATCH_SIZE"
  ).pipe(Config.withDefault(DROP_BATCH_SIZE)),
  failureReasons: Config.schema(Schema.Literals(FAILURE_REASON_SETS), "SWEEPER_FAILURE_REASONS").pipe(
    Config.withDefault<FailureReasonSet>("legacy")
  ),
  runnerProvisioningTimeoutReason: Config.option(
    Config.schema(ReasonInteger, "SWEEPER_RUNNER_PROVISIONING_TIMEOUT_REASON")
  ),
  transitionQueues: Config.schema(TransitionQueuesSetting, "SWEEPER_TRANSITION_QUEUES").pipe(
    Config.withDefault<typeof TransitionQueuesSetting.Type>("default"),
    Config.map(resolveTransitionQueues)
  ),
  eventRetention: Config.schema(EventRetentionDuration, "SWEEPER_EVENT_RETENTION").pipe(
    Config.withDefault(EVENT_RETENTION)
  ),
  health: Config.option(Config.schema(HealthJson, "SWEEPER_HEALTH")),
  healthStandbys: Config.option(Config.schema(StandbySelectionJson, "SWEEPER_HEALTH_STANDBYS")).pipe(
    Config.map((selection): StandbySelection => Option.getOrElse(selection, () => NO_SELECTION))
  ),
  databaseTimeouts: Config.all({
    statement: Config.Duration("SWEEPER_PG_STATEMENT_TIMEOUT").pipe(Config.withDefault(DATABASE_TIMEOUTS.statement)),
    lock: Config.Duration("SWEEPER_PG_LOCK_TIMEOUT").pipe(Config.withDefault(DATABASE_TIMEOUTS.lock)),
    idleInTransaction: Config.Duration("SWEEPER_PG_IDLE_IN_TRANSACTION_TIMEOUT").pipe(
      Config.withDefault(DATABASE_TIMEOUTS.idleInTransaction)
    )
  })
})

/**
 * `SWEEPER_MODE` for every batch shadow mode can reconcile (the others, which port no GitLab worker
 * whose effect can be read back, stay `act`), `SWEEPER_MODE_<BATCH>` for one; `act` by default.
 */
const batchMode = (batch: string) =>
  Effect.gen(function*() {
    const own = modeVariable(batch)
    const mode = yield* Config.option(Config.schema(Schema.Literals(MODES), own)).pipe(Effect.mapError(invalidAs(own)))
    const all = yield* Config.schema(Schema.Literals(MODES), "SWEEPER_MODE").pipe(
      Config.withDefault<Mode>("act"),
      Effect.mapError(invalidAs("SWEEPER_MODE"))
    )
    if (Option.isSome(mode)) {
      if (mode.value === "shadow" && !shadowCapable(batch)) {
        return yield* new InvalidConfig({
          variable: own,
          message: `batch ${batch} has no shadow mode; batches that do: ${SHADOW_BATCHES.join(", ")}`
        })
      }
      return mode.value
    }
    return shadowCapable(batch) ? all : "act"
  })

/** A batch as configured: SWEEPER_CRON_<BATCH>, SWEEPER_LEASE_TTL_<BATCH>, SWEEPER_DISABLED_BATCHES applied. */
export interface ConfiguredBatch<B> {
  /** The batch, its exclusive lease's TTL overridden when SWEEPER_LEASE_TTL_<BATCH> is set. */
  readonly batch: B
  readonly cronText: string
  readonly cron: Cron.Cron
  readonly disabled: boolean
}

const invalidAs = (variable: string) => (error: Config.ConfigError) =>
  new InvalidConfig({ variable, message: error.message })

/**
 * The per-batch variables, validated in one place for every command that runs batches (`start`,
 * `run`): each cron must parse in SWEEPER_TIMEZONE and fire within CRON_HORIZON; a lease TTL must be
 * at least 1 s and belong to a batch that takes a lease; disabled names must be registered batches.
 * Every error names the variable it comes from.
 */
export const configureBatches = <B extends Batch<any, any, any>>(batches: ReadonlyArray<B>) =>
  Effect.gen(function*() {
    const config = yield* SweeperConfig
    const known = batches.map((batch) => batch.name)
    const unknownDisabled = config.disabledBatches.filter((name) => !known.includes(name))
    if (unknownDisabled.length > 0) {
      return yield* new InvalidConfig({
        variable: "SWEEPER_DISABLED_BATCHES",
        message: `unknown batch ${unknownDisabled.join(", ")}; known: ${known.join(", ")}`
      })
    }
    const now = DateTime.toDateUtc(yield* DateTime.now)
    const configured: Array<ConfiguredBatch<B>> = []
    for (const batch of batches) {
      const cronVar = cronVariable(batch.name)
      const cronText = yield* Config.schema(NonEmpty, cronVar).pipe(
        Config.withDefault(batch.cron),
        Effect.mapError(invalidAs(cronVar))
      )
      const cron = parseCron(cronText, config.timezone)
      if (Result.isFailure(cron)) {
        return yield* new InvalidConfig({
          variable: cronVar,
          message: `batch ${batch.name}: invalid cron "${cronText}" (${cron.failure})`
        })
      }
      if (!firesWithin(cron.success, now, CRON_HORIZON)) {
        return yield* new InvalidConfig({
          variable: cronVar,
          message: `batch ${batch.name}: cron "${cronText}" never fires (no tick in the next 8 years)`
        })
      }
      const ttlVar = leaseTtlVariable(batch.name)
      const ttl = yield* Config.option(Config.schema(LeaseTtl, ttlVar)).pipe(Effect.mapError(invalidAs(ttlVar)))
      let lease = batch.lease
      if (Option.isSome(ttl)) {
        if (Option.isNone(lease)) {
          return yield* new InvalidConfig({ variable: ttlVar, message: `batch ${batch.name} takes no exclusive lease` })
        }
        lease = Option.some({ ...lease.value, ttl: ttl.value })
      }
      const mode = yield* batchMode(batch.name)
      configured.push({
        batch: { ...batch, lease, ...(mode === "shadow" ? { mode } : {}) },
        cronText,
        cron: cron.success,
        disabled: config.disabledBatches.includes(batch.name)
      })
    }
    return configured
  })

/** Pulls the variable name out of a ConfigError so the message leads with it. */
const variableOf = (message: string): string => /\["([A-Z0-9_]+)"\]/.exec(message)?.[1] ?? "environment"

export class SweeperConfig extends Context.Service<SweeperConfig, SweeperSettings>()("sweeper/config/Config") {
  static readonly layer = Layer.effect(
    SweeperConfig,
    settings.pipe(
      Effect.mapError((error) => new InvalidConfig({ variable: variableOf(error.message), message: error.message })),
      Effect.flatMap((loaded) =>
        Option.match(checkHalfEmbedded(loaded), { onNone: () => Effect.succeed(loaded), onSome: Effect.fail })
      )
    )
  )

  /** For specs and embedded tools: defaults with overrides, no environment read. */
  static readonly layerWith = (overrides: Partial<SweeperSettings>) =>
    Layer.succeed(SweeperConfig, {
      databaseUrl: Option.none(),
      ciDatabaseUrl: Option.none(),
      embeddedCiDatabase: false,
      redisUrl: Option.none(),
      redisStoreUrls: noStoreUrls,
      dataDir: ".sweeper",
      node: "test-node",
      objectStorage: NoObjectStorage,
      concurrencyLimits: {},
      httpHost: "127.0.0.1",
      httpPort: 0,
      httpAllowedHosts: [],
      timezone: "UTC",
      disabledBatches: [],
      shutdownGrace: Duration.seconds(25),
      apiToken: Option.none(),
      schema: Option.none(),
      dropBatchSize: DROP_BATCH_SIZE,
      failureReasons: "legacy",
      runnerProvisioningTimeoutReason: Option.none(),
      transitionQueues: DEFAULT_ROUTING,
      eventRetention: EVENT_RETENTION,
      health: Option.none(),
      healthStandbys: NO_SELECTION,
      databaseTimeouts: DATABASE_TIMEOUTS,
      ...overrides
    })
}

/** Programs' tuning references (DropBatchSize, EventRetentionPeriod, …) set from SweeperConfig. */
export const TuningFromConfig = Layer.mergeAll(
  Layer.effect(
    RunnerProvisioningTimeoutReason,
    Effect.map(SweeperConfig, (config: SweeperSettings) => config.runnerProvisioningTimeoutReason)
  ),
  Layer.effect(
    CurrentTransitionQueues,
    Effect.map(SweeperConfig, (config: SweeperSettings) => config.transitionQueues)
  ),
  Layer.effect(DropBatchSize, Effect.map(SweeperConfig, (config: SweeperSettings) => config.dropBatchSize)),
  Layer.effect(
    CurrentFailureReasonSet,
    Effect.map(SweeperConfig, (config: SweeperSettings) => config.failureReasons)
  ),
  Layer.effect(EventRetentionPeriod, Effect.map(SweeperConfig, (config: SweeperSettings) => config.eventRetention))
)
