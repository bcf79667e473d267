/**
 * The simulator's raw hands on GitLab's three Redis stores. Sweeper's services only
 * expose what Sweeper does; the simulator plays GitLab and Sidekiq, so it writes keys Sweeper only
 * reads (the throttling middleware's deferred list, the executing tracker, the pending-uploads hash)
 * and pops the queues Sweeper pushes to. Each command names the store its key lives in, so the
 * simulator behaves the same on the in-memory Redis, one server, three servers or a cluster.
 *
 * Which backend: whatever the composition root built. The embedded default provides MemoryRedis,
 * configured Redis provides the three store connections; `SimulatorStores.layer` takes the one
 * present rather than re-deciding from configuration, so it can never disagree with Sweeper.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import { MemoryRedis, type MemoryRedisStore } from "../layers/memory/MemoryRedis.ts"
import { QueuesMetadataRedis, QueuesRedis, type RedisClient, SharedStateRedis } from "../layers/redis/Redis.ts"

export type Store = "sharedState" | "queues" | "queuesMetadata"

export class SimulatorStores extends Context.Service<SimulatorStores, {
  hset(store: Store, key: string, fields: Record<string, string>): Effect.Effect<void>
  hdel(store: Store, key: string, field: string): Effect.Effect<void>
  hlen(store: Store, key: string): Effect.Effect<number>
  hexists(store: Store, key: string, field: string): Effect.Effect<boolean>
  rpush(store: Store, key: string, value: string): Effect.Effect<void>
  /** LPUSH plus SADD to `queues`: a Sidekiq client push. */
  lpush(store: Store, key: string, value: string): Effect.Effect<void>
  rpop(store: Store, key: string): Effect.Effect<string | null>
  /** The head, as GitLab's concurrency-limit resume takes its deferred jobs. */
  lpop(store: Store, key: string): Effect.Effect<string | null>
  llen(store: Store, key: string): Effect.Effect<number>
  sadd(store: Store, key: string, member: string): Effect.Effect<void>
  srem(store: Store, key: string, member: string): Effect.Effect<void>
  smembers(store: Store, key: string): Effect.Effect<ReadonlyArray<string>>
  get(store: Store, key: string): Effect.Effect<string | null>
  set(store: Store, key: string, value: string): Effect.Effect<void>
  del(store: Store, key: string): Effect.Effect<void>
  /**
   * Decrements a counter only while it is positive (atomically): a resumed job that starts after
   * its reservation expired must not leave `pending_resumed` at -1 with no TTL.
   */
  decrIfPositive(store: Store, key: string): Effect.Effect<void>
}>()("sweeper/simulator/Stores") {}

const memory = (redis: MemoryRedisStore) =>
  SimulatorStores.of({
    hset: (_s, key, fields) => Effect.sync(() => void redis.hset(key, fields)),
    hdel: (_s, key, field) => Effect.sync(() => void redis.hdel(key, field)),
    hlen: (_s, key) => Effect.sync(() => redis.hlen(key)),
    hexists: (_s, key, field) => Effect.sync(() => redis.hget(key, field) !== null),
    rpush: (_s, key, value) => Effect.sync(() => void redis.rpush(key, value)),
    lpush: (_s, key, value) =>
      Effect.sync(() => {
        redis.sadd("queues", key.replace(/^queue:/, ""))
        redis.lpush(key, value)
      }),
    rpop: (_s, key) => Effect.sync(() => redis.rpop(key)),
    lpop: (_s, key) => Effect.sync(() => redis.lpop(key, 1)[0] ?? null),
    llen: (_s, key) => Effect.sync(() => redis.llen(key)),
    sadd: (_s, key, member) => Effect.sync(() => void redis.sadd(key, member)),
    srem: (_s, key, member) => Effect.sync(() => void redis.srem(key, member)),
    smembers: (_s, key) => Effect.sync(() => redis.smembers(key)),
    get: (_s, key) => Effect.sync(() => redis.get(key)),
    set: (_s, key, value) => Effect.sync(() => void redis.set(key, value)),
    del: (_s, key) => Effect.sync(() => void redis.del(key)),
    decrIfPositive: (_s, key) =>
      Effect.sync(() => {
        if (Number(redis.get(key) ?? "0") > 0) redis.incrBy(key, -1)
      })
  })

const DECR_IF_POSITIVE =
  `if tonumber(redis.call('get', KEYS[1]) or '0') > 0 then return redis.call('decr', KEYS[1]) end return 0`

const servers = (clients: Record<Store, RedisClient>) => {
  // The simulator is a test fixture: a Redis it cannot reach is a defect, not a typed error.
  const p = <A>(f: () => Promise<A>) => Effect.promise(f)
  return SimulatorStores.of({
    hset: (s, key, fields) => p(() => clients[s].hset(key, fields)).pipe(Effect.asVoid),
    hdel: (s, key, field) => p(() => clients[s].hdel(key, field)).pipe(Effect.asVoid),
    hlen: (s, key) => p(() => clients[s].hlen(key)),
    hexists: (s, key, field) => p(async () => (await clients[s].hexists(key, field)) === 1),
    rpush: (s, key, value) => p(() => clients[s].rpush(key, value)).pipe(Effect.asVoid),
    // `queues` and `queue:<q>` are both Queues-store keys; on a cluster they are separate commands.
    lpush: (s, key, value) =>
      p(async () => {
        await clients[s].sadd("queues", key.replace(/^queue:/, ""))
        await clients[s].lpush(key, value)
      }),
    rpop: (s, key) => p(() => clients[s].rpop(key)),
    lpop: (s, key) => p(() => clients[s].lpop(key)),
    llen: (s, key) => p(() => clients[s].llen(key)),
    sadd: (s, key, member) => p(() => clients[s].sadd(key, member)).pipe(Effect.asVoid),
    srem: (s, key, member) => p(() => clients[s].srem(key, member)).pipe(Effect.asVoid),
    smembers: (s, key) => p(() => clients[s].smembers(key)),
    get: (s, key) => p(() => clients[s].get(key)),
    set: (s, key, value) => p(() => clients[s].set(key, value)).pipe(Effect.asVoid),
    del: (s, key) => p(() => clients[s].del(key)).pipe(Effect.asVoid),
    decrIfPositive: (s, key) => p(() => clients[s].eval(DECR_IF_POSITIVE, 1, key)).pipe(Effect.asVoid)
  })
}

/** The stores of whichever Redis the composition root built (in-memory, or the three connections). */
export const SimulatorStoresLive = Layer.effect(
  SimulatorStores,
  Effect.gen(function*() {
    const inMemory = yield* Effect.serviceOption(MemoryRedis)
    if (Option.isSome(inMemory)) return memory(inMemory.value)
    const [sharedState, queues, queuesMetadata] = [
      yield* Effect.serviceOption(SharedStateRedis),
      yield* Effect.serviceOption(QueuesRedis),
      yield* Effect.serviceOption(QueuesMetadataRedis)
    ]
    if (Option.isNone(sharedState) || Option.isNone(queues) || Option.isNone(queuesMetadata)) {
      return yield* Effect.die(
        new Error(
          "the simulator needs the platform's Redis: neither the in-memory Redis nor the three store connections are provided"
        )
      )
    }
    return servers({
      sharedState: sharedState.value.client,
      queues: queues.value.client,
      queuesMetadata: queuesMetadata.value.client
    })
  })
)
