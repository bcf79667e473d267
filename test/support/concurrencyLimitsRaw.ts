/**
 * Raw access to the concurrency-limit keys in each GitLab store, whatever the deployment: the
 * in-memory Redis, one server, three servers or a cluster. Tests seed and inspect through this, so
 * they check what GitLab and Sidekiq would see, store by store, not the service's own view.
 */
import { Context, Effect, Layer } from "effect"
import { Cluster } from "ioredis"
import type { SweeperConfig } from "../../src/config/Config.ts"
import { ConcurrencyLimitsMemory, makeMemoryStore } from "../../src/layers/memory/ConcurrencyLimitsMemory.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import type { ConcurrencyLimitStore } from "../../src/layers/protocols/ConcurrencyLimitsShared.ts"
import { ConcurrencyLimitsRedis, makeRedisStore } from "../../src/layers/redis/ConcurrencyLimitsRedis.ts"
import { QueuesMetadataRedis, QueuesRedis, type RedisClient, SharedStateRedis } from "../../src/layers/redis/Redis.ts"
import type { ConcurrencyLimits } from "../../src/services/ConcurrencyLimits.ts"
import { type RedisTopology, RedisTopologyTest } from "./redisTopology.ts"

export type StoreName = "sharedState" | "queues" | "queuesMetadata"

export class RawStores extends Context.Service<RawStores, {
  /** The service's primitives over the same connections (for fault injection). */
  readonly store: ConcurrencyLimitStore
  /** Empties every store. */
  readonly flush: Effect.Effect<void>
  rpush(store: StoreName, key: string, ...values: ReadonlyArray<string | Uint8Array>): Effect.Effect<void>
  set(store: StoreName, key: string, value: string): Effect.Effect<void>
  hset(store: StoreName, key: string, fields: Record<string, string>): Effect.Effect<void>
  list(store: StoreName, key: string): Effect.Effect<ReadonlyArray<Buffer>>
  get(store: StoreName, key: string): Effect.Effect<string | null>
  lpop(store: StoreName, key: string): Effect.Effect<string | null>
  smembers(store: StoreName, key: string): Effect.Effect<ReadonlyArray<string>>
  hgetall(store: StoreName, key: string): Effect.Effect<Record<string, string>>
  /** PTTL: -2 missing, -1 no expiry. */
  pttl(store: StoreName, key: string): Effect.Effect<number>
  exists(store: StoreName, key: string): Effect.Effect<boolean>
  /** Every key matching `pattern` in the store, with its PTTL (-1: no expiry). */
  keysWithTtl(store: StoreName, pattern: string): Effect.Effect<ReadonlyArray<readonly [string, number]>>
}>()("test/support/concurrencyLimitsRaw/RawStores") {}

const RawMemory = Layer.effect(
  RawStores,
  Effect.gen(function*() {
    const redis = yield* MemoryRedis
    return RawStores.of({
      store: makeMemoryStore(redis),
      flush: Effect.sync(() => redis.flushAll()),
      rpush: (_store, key, ...values) => Effect.sync(() => void redis.rpush(key, ...values)),
      set: (_store, key, value) => Effect.sync(() => void redis.set(key, value)),
      hset: (_store, key, fields) => Effect.sync(() => void redis.hset(key, fields)),
      list: (_store, key) => Effect.sync(() => redis.lrangeBuffer(key, 0, -1)),
      get: (_store, key) => Effect.sync(() => redis.get(key)),
      lpop: (_store, key) => Effect.sync(() => redis.lpop(key, 1)[0] ?? null),
      smembers: (_store, key) => Effect.sync(() => redis.smembers(key)),
      hgetall: (_store, key) => Effect.sync(() => redis.hgetall(key)),
      pttl: (_store, key) => Effect.sync(() => redis.pttl(key)),
      exists: (_store, key) => Effect.sync(() => redis.exists(key)),
      keysWithTtl: (_store, pattern) =>
        Effect.sync(() => redis.keys(pattern).map((key) => [key, redis.pttl(key)] as const))
    })
  })
)

/** A command on every node that holds keys: the server itself, or each master of a cluster. */
const onEveryNode = async <A>(client: RedisClient, f: (node: RedisClient) => Promise<A>): Promise<Array<A>> =>
  client instanceof Cluster ? Promise.all(client.nodes("master").map(f)) : [await f(client)]

const RawRedis = Layer.effect(
  RawStores,
  Effect.gen(function*() {
    const stores = {
      sharedState: yield* SharedStateRedis,
      queues: yield* QueuesRedis,
      queuesMetadata: yield* QueuesMetadataRedis
    }
    const client = (store: StoreName) => stores[store].client
    const p = <A>(f: () => Promise<A>) => Effect.promise(f)
    const distinct = [...new Set([stores.sharedState.client, stores.queues.client, stores.queuesMetadata.client])]
    return RawStores.of({
      store: makeRedisStore(stores),
      flush: p(() => Promise.all(distinct.map((c) => onEveryNode(c, (node) => node.flushdb())))).pipe(Effect.asVoid),
      rpush: (store, key, ...values) =>
        p(() => client(store).rpush(key, ...values.map((v) => (typeof v === "string" ? v : Buffer.from(v))))).pipe(
          Effect.asVoid
        ),
      set: (store, key, value) => p(() => client(store).set(key, value)).pipe(Effect.asVoid),
      hset: (store, key, fields) => p(() => client(store).hset(key, fields)).pipe(Effect.asVoid),
      list: (store, key) => p(() => client(store).lrangeBuffer(key, 0, -1)),
      get: (store, key) => p(() => client(store).get(key)),
      lpop: (store, key) => p(() => client(store).lpop(key)),
      smembers: (store, key) => p(() => client(store).smembers(key)),
      hgetall: (store, key) => p(() => client(store).hgetall(key)),
      pttl: (store, key) => p(() => client(store).pttl(key)),
      exists: (store, key) => p(async () => (await client(store).exists(key)) === 1),
      keysWithTtl: (store, pattern) =>
        p(async () => {
          const found = (await onEveryNode(client(store), (node) => node.keys(pattern))).flat()
          return Promise.all(found.map(async (key) => [key, await client(store).pttl(key)] as const))
        })
    })
  })
)

export type Deployment = "memory" | RedisTopology

/** ConcurrencyLimits plus RawStores on the deployment's stores (SweeperConfig still to provide). */
export const ConcurrencyLimitsOn = (
  deployment: Deployment
): Layer.Layer<ConcurrencyLimits | RawStores, never, SweeperConfig> =>
  deployment === "memory"
    ? Layer.mergeAll(ConcurrencyLimitsMemory, RawMemory).pipe(Layer.provide(MemoryRedis.layer))
    : Layer.mergeAll(ConcurrencyLimitsRedis, RawRedis).pipe(Layer.provide(RedisTopologyTest(deployment)))
