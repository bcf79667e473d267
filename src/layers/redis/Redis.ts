/**
 * Redis connections as scoped services: connected when the layer is built (so a wrong URL fails
 * start-up), quit when the scope closes. Every call goes through `use`, which turns a rejected
 * promise into a typed `RedisError` naming the operation, the server's reply and its host:port, and
 * classified transient or permanent (see RedisError.isRetryable).
 *
 * A URL is either one server (`redis://host:port/db`) or a Redis Cluster given as a comma-separated
 * list of seed nodes (`redis://10.0.0.1:7000,redis://10.0.0.2:7000`). Both clients speak
 * the same commands; on a cluster every Lua script and pipeline must stay within one hash slot,
 * which each service layer guarantees for its own keys.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Redacted from "effect/Redacted"
import { Cluster, Redis as IORedis } from "ioredis"
import { parseRedisUrl } from "../../config/RedisUrl.ts"
import { RedisError } from "../../domain/Errors.ts"
import { redact } from "../../domain/Redaction.ts"
import { serverName, toRedisError } from "./RedisErrors.ts"

/** A single server or a cluster: ioredis gives both the same command surface. */
export type RedisClient = IORedis | Cluster

export type RedisKind = "single" | "cluster"

export class Redis extends Context.Service<Redis, {
  readonly client: RedisClient
  /** "single" or "cluster": for `doctor`, `/readyz` and the start-up banner. */
  readonly kind: RedisKind
  /** Where it points, password redacted (seed nodes for a cluster). */
  readonly description: string
  use<A>(operation: string, f: (client: RedisClient) => Promise<A>): Effect.Effect<A, RedisError>
}>()("sweeper/layers/redis/Redis") {
  /** One connection (server or cluster) as the `Redis` service. */
  static readonly layer = (url: Redacted.Redacted<string>) => Layer.effect(Redis, connect(url))

  /**
   * One server for every GitLab store (all three store URLs equal): the client above, also
   * provided as SharedStateRedis, QueuesRedis and QueuesMetadataRedis.
   */
  static readonly layerSingle = (url: Redacted.Redacted<string>) =>
    Redis.layerStores({ sharedState: url, queues: url, queuesMetadata: url })

  /**
   * The three GitLab stores, each its own URL: one connection per distinct URL, each
   * store tag given its connection. `Redis` itself is the SharedState connection, for the layers
   * that have not moved to a store tag yet.
   */
  static readonly layerStores = (urls: StoreUrls) =>
    Layer.effectContext(Effect.gen(function*() {
      const connections = new Map<string, Redis["Service"]>()
      const connection = Effect.fnUntraced(function*(url: Redacted.Redacted<string>) {
        const key = Redacted.value(url).trim()
        const existing = connections.get(key)
        if (existing !== undefined) return existing
        const made = yield* connect(url)
        connections.set(key, made)
        return made
      })
      const sharedState = yield* connection(urls.sharedState)
      const queues = yield* connection(urls.queues)
      const queuesMetadata = yield* connection(urls.queuesMetadata)
      return Context.make(Redis, sharedState).pipe(
        Context.add(SharedStateRedis, sharedState),
        Context.add(QueuesRedis, queues),
        Context.add(QueuesMetadataRedis, queuesMetadata),
        Context.add(RedisStores, [
          { store: "sharedState", redis: sharedState },
          { store: "queues", redis: queues },
          { store: "queuesMetadata", redis: queuesMetadata }
        ])
      )
    }))
}

export interface StoreUrls {
  readonly sharedState: Redacted.Redacted<string>
  readonly queues: Redacted.Redacted<string>
  readonly queuesMetadata: Redacted.Redacted<string>
}

export type StoreName = "sharedState" | "queues" | "queuesMetadata"

/**
 * GitLab spreads its keys over three Redis deployments. Each service layer asks for the
 * store its keys live in, never for "the" Redis, so a split or clustered deployment is a matter of
 * which connection each tag gets.
 */
export class SharedStateRedis
  extends Context.Service<SharedStateRedis, Redis["Service"]>()("sweeper/layers/redis/Redis/SharedState")
{}
/** Sidekiq's own Redis: `queue:<name>`, `queues`, `<pid>:work`. */
export class QueuesRedis
  extends Context.Service<QueuesRedis, Redis["Service"]>()("sweeper/layers/redis/Redis/Queues")
{}
/** Job status keys, concurrency-limit trackers, duplicate-job keys. */
export class QueuesMetadataRedis
  extends Context.Service<QueuesMetadataRedis, Redis["Service"]>()("sweeper/layers/redis/Redis/QueuesMetadata")
{}

/** Every store by name (for `/readyz`, the start-up ping and `doctor`); two names may share a connection. */
export class RedisStores extends Context.Service<
  RedisStores,
  ReadonlyArray<{ readonly store: StoreName; readonly redis: Redis["Service"] }>
>()(
  "sweeper/layers/redis/Redis/Stores"
) {}

const connect = (url: Redacted.Redacted<string>) =>
  Effect.gen(function*() {
    const raw = Redacted.value(url)
    const parsed = parseRedisUrl(raw)
    if (parsed.kind === "invalid") {
      return yield* new RedisError({ operation: "connect", cause: new Error(parsed.message) })
    }
    const description = redact(raw)
    // Errors name the server by host:port (never the URL: it may hold a password); a cluster by its seed nodes.
    const server = parsed.kind === "cluster" ? parsed.nodes.map(serverName).join(",") : undefined
    const serverOf = (client: RedisClient) => server ?? serverName((client as IORedis).options)
    const client = yield* Effect.acquireRelease(
      Effect.gen(function*() {
        const opened = yield* Effect.try({
          try: (): RedisClient =>
            parsed.kind === "single"
              ? new IORedis(parsed.url, { lazyConnect: true, maxRetriesPerRequest: 2, connectTimeout: 5_000 })
              : new Cluster(parsed.nodes.map((node) => ({ ...node })), {
                lazyConnect: true,
                // The seed list is what the operator wrote: nodes are reached by the addresses the cluster announces.
                redisOptions: {
                  maxRetriesPerRequest: 2,
                  connectTimeout: 5_000,
                  ...(parsed.username === undefined ? {} : { username: parsed.username }),
                  ...(parsed.password === undefined ? {} : { password: parsed.password }),
                  ...(parsed.tls ? { tls: {} } : {})
                }
              }),
          catch: (cause) => new RedisError({ operation: "connect", cause })
        })
        // Without a listener ioredis prints every reconnect error to stderr. The last one says why
        // a connect failed (e.g. ECONNREFUSED), where connect() itself only says "Connection is closed."
        let lastError: unknown = undefined
        opened.on("error", (error: unknown) => {
          lastError = error
        })
        // connect() on a cluster resolves once the slot map is loaded; a PING proves a node answers.
        yield* Effect.tryPromise({
          try: () => opened.connect().then(() => opened.ping()),
          catch: (cause) => toRedisError("connect", serverOf(opened))(lastError ?? cause)
        }).pipe(
          Effect.tapError(() => Effect.sync(() => opened.disconnect()))
        )
        return opened
      }),
      (opened) => Effect.promise(() => opened.quit().then(() => {}, () => opened.disconnect()))
    )
    const use = <A>(operation: string, f: (client: RedisClient) => Promise<A>) =>
      Effect.tryPromise({ try: () => f(client), catch: toRedisError(operation, serverOf(client)) })
    return Redis.of({ client, kind: parsed.kind, description, use })
  })
