/**
 * The ioredis client as a scoped service: connected when the layer is built (so a wrong REDIS_URL
 * fails start-up), quit when the scope closes. Every call goes through `use`, which turns a
 * rejected promise into a typed `RedisError` naming the operation.
 */
import { Context, Effect, Layer, Redacted } from "effect"
import { Redis as IORedis } from "ioredis"
import { RedisError } from "../domain/Errors.ts"

export class Redis extends Context.Service<Redis, {
  readonly client: IORedis
  use<A>(operation: string, f: (client: IORedis) => Promise<A>): Effect.Effect<A, RedisError>
}>()("sweeper/layers/Redis") {
  static readonly layer = (url: Redacted.Redacted<string>) =>
    Layer.effect(
      Redis,
      Effect.gen(function*() {
        const client = yield* Effect.acquireRelease(
          Effect.tryPromise({
            try: async () => {
              const client = new IORedis(Redacted.value(url), {
                lazyConnect: true,
                maxRetriesPerRequest: 2,
                connectTimeout: 5_000
              })
              // Without a listener ioredis prints every reconnect error to stderr.
              client.on("error", () => {})
              // A failed connect keeps reconnecting in the background: stop it, or the process never exits.
              await client.connect().catch((error: unknown) => {
                client.disconnect()
                throw error
              })
              return client
            },
            catch: (cause) => new RedisError({ operation: "connect", cause })
          }),
          (client) => Effect.promise(() => client.quit().catch(() => client.disconnect()))
        )
        const use = <A>(operation: string, f: (client: IORedis) => Promise<A>) =>
          Effect.tryPromise({ try: () => f(client), catch: (cause) => new RedisError({ operation, cause }) })
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
