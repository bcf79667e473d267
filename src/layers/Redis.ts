/**
 * The ioredis client as a scoped service: connected when the layer is built (so a wrong REDIS_URL
 * fails start-up), quit when the scope closes. Every call goes through `use`, which turns a
 * rejected promise into a typed `RedisError` naming the operation, the server's reply and its
 * host:port, and classified transient or permanent (see RedisError.isRetryable).
 */
import { Context, Effect, Layer, Redacted } from "effect"
import { Redis as IORedis } from "ioredis"
import { RedisError } from "../domain/Errors.ts"
import { serverName, toRedisError } from "./RedisErrors.ts"

export class Redis extends Context.Service<Redis, {
  readonly client: IORedis
  use<A>(operation: string, f: (client: IORedis) => Promise<A>): Effect.Effect<A, RedisError>
}>()("sweeper/layers/Redis") {
  static readonly layer = (url: Redacted.Redacted<string>) =>
    Layer.effect(
      Redis,
      Effect.gen(function*() {
        const client = yield* Effect.acquireRelease(
          Effect.gen(function*() {
            const client = yield* Effect.try({
              try: () =>
                new IORedis(Redacted.value(url), {
                  lazyConnect: true,
                  maxRetriesPerRequest: 2,
                  connectTimeout: 5_000
                }),
              catch: (cause) => new RedisError({ operation: "connect", cause })
            })
            // Without a listener ioredis prints every reconnect error to stderr. The last one says why
            // a connect failed (e.g. ECONNREFUSED), where connect() itself only says "Connection is closed."
            let lastError: unknown = undefined
            client.on("error", (error: unknown) => {
              lastError = error
            })
            yield* Effect.tryPromise({
              try: () => client.connect(),
              catch: (cause) => toRedisError("connect", serverName(client.options))(lastError ?? cause)
            }).pipe(
              Effect.tapError(() => Effect.sync(() => client.disconnect()))
            )
            return client
          }),
          (client) => Effect.promise(() => client.quit().catch(() => client.disconnect()))
        )
        // Errors name the server by host:port (never the URL: it may hold a password).
        const server = serverName(client.options)
        const use = <A>(operation: string, f: (client: IORedis) => Promise<A>) =>
          Effect.tryPromise({ try: () => f(client), catch: toRedisError(operation, server) })
        return Redis.of({ client, use })
      })
    )

  /**
   * One server for every GitLab store (SPEC §8.2 with all three URLs equal): the client above, also
   * provided as SharedStateRedis, QueuesRedis and QueuesMetadataRedis.
   */
  static readonly layerSingle = (url: Redacted.Redacted<string>) =>
    Layer.effectContext(Effect.gen(function*() {
      const redis = yield* Redis
      return Context.make(Redis, redis).pipe(
        Context.add(SharedStateRedis, redis),
        Context.add(QueuesRedis, redis),
        Context.add(QueuesMetadataRedis, redis)
      )
    })).pipe(Layer.provide(Redis.layer(url)))
}

/**
 * GitLab spreads its keys over three Redis deployments (SPEC §8.2). Each service layer asks for the
 * store its keys live in, never for "the" Redis, so a split or clustered deployment is a matter of
 * which connection each tag gets.
 */
export class SharedStateRedis extends Context.Service<SharedStateRedis, Redis["Service"]>()("sweeper/layers/Redis/SharedState") {}
/** Sidekiq's own Redis: `queue:<name>`, `queues`, `<pid>:work`. */
export class QueuesRedis extends Context.Service<QueuesRedis, Redis["Service"]>()("sweeper/layers/Redis/Queues") {}
/** Job status keys, concurrency-limit trackers, duplicate-job keys. */
export class QueuesMetadataRedis extends Context.Service<QueuesMetadataRedis, Redis["Service"]>()("sweeper/layers/Redis/QueuesMetadata") {}
