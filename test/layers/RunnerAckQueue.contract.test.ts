/** One contract for RunnerAckQueue, run against the in-memory Redis and real Redis in every topology. */
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Layer } from "effect"
import { runnerAckQueueKey } from "../../src/domain/StuckBuilds.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { RunnerAckQueueMemory } from "../../src/layers/memory/RunnerAckQueueMemory.ts"
import { SharedStateRedis } from "../../src/layers/redis/Redis.ts"
import { RunnerAckQueueRedis } from "../../src/layers/redis/RunnerAckQueueRedis.ts"
import { RunnerAckQueue } from "../../src/services/RunnerAckQueue.ts"
import { RedisTopologyTest, topologies } from "../support/redisTopology.ts"

/** The entry as GitLab's runner API writes it, behind the service's back. */
class RawEntry extends Context.Service<RawEntry, {
  set(buildId: number, value: string): Effect.Effect<void>
  get(buildId: number): Effect.Effect<string | null>
  ttlSeconds(buildId: number): Effect.Effect<number>
}>()("test/layers/RunnerAckQueue/RawEntry") {}

const backends: Record<string, Layer.Layer<RunnerAckQueue | RawEntry>> = {
  memory: RunnerAckQueueMemory.pipe(
    Layer.merge(Layer.effect(
      RawEntry,
      Effect.map(MemoryRedis, (store) =>
        RawEntry.of({
          set: (id, value) => Effect.sync(() => void store.set(runnerAckQueueKey(id), value)),
          get: (id) => Effect.sync(() => store.get(runnerAckQueueKey(id))),
          ttlSeconds: (id) => Effect.sync(() => Math.round(store.pttl(runnerAckQueueKey(id)) / 1000))
        }))
    )),
    Layer.provideMerge(MemoryRedis.layer)
  ),
  ...Object.fromEntries(topologies.map((topology) => [
    `redis ${topology}`,
    RunnerAckQueueRedis.pipe(
      Layer.merge(Layer.effect(
        RawEntry,
        Effect.map(SharedStateRedis, (redis) =>
          RawEntry.of({
            set: (id, value) => Effect.orDie(redis.use("SET", (c) => c.set(runnerAckQueueKey(id), value))),
            get: (id) => Effect.orDie(redis.use("GET", (c) => c.get(runnerAckQueueKey(id)))),
            ttlSeconds: (id) => Effect.orDie(redis.use("TTL", (c) => c.ttl(runnerAckQueueKey(id))))
          }))
      )),
      Layer.provideMerge(RedisTopologyTest(topology))
    )
  ]))
}

for (const [name, backend] of Object.entries(backends)) {
  describe(`RunnerAckQueue contract (${name})`, () => {
    it.effect("no entries: nothing waits; no ids: nothing asked", () =>
      Effect.gen(function*() {
        const queue = yield* RunnerAckQueue
        assert.deepStrictEqual([...(yield* queue.waitingForAck([1, 2, 3]))], [])
        assert.deepStrictEqual([...(yield* queue.waitingForAck([]))], [])
      }).pipe(Effect.provide(backend)))

    it.effect("GitLab's own entries are read, across many keys (different cluster slots)", () =>
      Effect.gen(function*() {
        const raw = yield* RawEntry
        const ids = Array.from({ length: 60 }, (_, i) => 1000 + i)
        for (const buildId of ids.filter((id) => id % 3 === 0)) yield* raw.set(buildId, "42")
        const waiting = yield* (yield* RunnerAckQueue).waitingForAck(ids)
        assert.deepStrictEqual([...waiting].sort(), ids.filter((id) => id % 3 === 0))
      }).pipe(Effect.provide(backend)))

    it.effect("setWaiting writes GitLab's entry: the runner manager's id, two minutes, never replacing one", () =>
      Effect.gen(function*() {
        const queue = yield* RunnerAckQueue
        const raw = yield* RawEntry
        yield* queue.setWaiting(7, 900)
        yield* queue.setWaiting(7, 901)
        assert.strictEqual(yield* raw.get(7), "900")
        const ttl = yield* raw.ttlSeconds(7)
        assert.isTrue(ttl > 0 && ttl <= 120, `ttl ${ttl}`)
        assert.deepStrictEqual([...(yield* queue.waitingForAck([6, 7]))], [7])
      }).pipe(Effect.provide(backend)))
  })
}
