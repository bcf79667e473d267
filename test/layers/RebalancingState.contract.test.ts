/** One contract for RebalancingState, run against the in-memory Redis and a real Redis server. */
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Layer } from "effect"
import { isTransient, RedisError } from "../../src/domain/Errors.ts"
import { RUNNING_REBALANCES_KEY } from "../../src/domain/Rebalancing.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { RebalancingStateMemory } from "../../src/layers/memory/RebalancingStateMemory.ts"
import { RebalancingStateRedis } from "../../src/layers/redis/RebalancingStateRedis.ts"
import { SharedStateRedis } from "../../src/layers/redis/Redis.ts"
import { RebalancingState } from "../../src/services/RebalancingState.ts"
import { RedisTopologyTest, topologies } from "../support/redisTopology.ts"

/** The set as GitLab's rebalancer writes it, behind the service's back. */
class RawSet extends Context.Service<RawSet, {
  add(...members: ReadonlyArray<string | Uint8Array>): Effect.Effect<void>
  setString(value: string): Effect.Effect<void>
  ttlSeconds: Effect.Effect<number>
}>()("test/layers/RebalancingState/RawSet") {}

const backends: Record<string, Layer.Layer<RebalancingState | RawSet>> = {
  memory: RebalancingStateMemory.pipe(
    Layer.merge(Layer.effect(
      RawSet,
      Effect.map(MemoryRedis, (store) =>
        RawSet.of({
          add: (...members) => Effect.sync(() => void store.sadd(RUNNING_REBALANCES_KEY, ...members)),
          setString: (value) => Effect.sync(() => void store.set(RUNNING_REBALANCES_KEY, value)),
          ttlSeconds: Effect.sync(() => Math.round(store.pttl(RUNNING_REBALANCES_KEY) / 1000))
        }))
    )),
    Layer.provideMerge(MemoryRedis.layer)
  ),
  ...Object.fromEntries(topologies.map((topology) => [
    `redis ${topology}`,
    RebalancingStateRedis.pipe(
      Layer.merge(Layer.effect(
        RawSet,
        Effect.map(SharedStateRedis, (redis) =>
          RawSet.of({
            add: (...members) =>
              Effect.orDie(
                redis.use(
                  "SADD",
                  (c) =>
                    c.sadd(RUNNING_REBALANCES_KEY, ...members.map((m) => (typeof m === "string" ? m : Buffer.from(m))))
                )
              ),
            setString: (value) => Effect.orDie(redis.use("SET", (c) => c.set(RUNNING_REBALANCES_KEY, value))),
            ttlSeconds: Effect.orDie(redis.use("TTL", (c) => c.ttl(RUNNING_REBALANCES_KEY)))
          }))
      )),
      Layer.provideMerge(RedisTopologyTest(topology))
    )
  ]))
}

const hex = (bytes: Uint8Array) => Buffer.from(bytes).toString("hex")
const text = (members: ReadonlyArray<Uint8Array>) => members.map((m) => new TextDecoder().decode(m)).sort()

for (const [name, backend] of Object.entries(backends)) {
  describe(`RebalancingState contract (${name})`, () => {
    it.effect("no set: no members", () =>
      Effect.gen(function*() {
        assert.deepStrictEqual(yield* (yield* RebalancingState).runningMembers, [])
      }).pipe(Effect.provide(backend)))

    it.effect("finish does the rebalancer's clean-up: the member out, recently_finished set for an hour", () =>
      Effect.gen(function*() {
        const state = yield* RebalancingState
        yield* state.track(1, 10)
        yield* state.track(2, 20)
        assert.isFalse(yield* state.recentlyFinished(1, 10))
        yield* state.finish(1, 10)
        assert.isTrue(yield* state.recentlyFinished(1, 10))
        assert.isFalse(yield* state.recentlyFinished(2, 10), "per container type")
        assert.deepStrictEqual(text(yield* state.runningMembers), ["2/20"])
      }).pipe(Effect.provide(backend)))

    it.effect("runningMembers is SMEMBERS, verbatim (including junk)", () =>
      Effect.gen(function*() {
        yield* (yield* RawSet).add("1/10", "2/20", "junk", "")
        const members = yield* (yield* RebalancingState).runningMembers
        assert.deepStrictEqual(text(members), ["", "1/10", "2/20", "junk"])
      }).pipe(Effect.provide(backend)))

    it.effect("runningMembers are the exact bytes (not decoded, not merged with their lossy look-alikes)", () =>
      Effect.gen(function*() {
        const bad = Uint8Array.from([0x31, 0x2f, 0x39, 0xff])
        yield* (yield* RawSet).add(bad, "1/9\uFFFD", "1/9")
        const members = yield* (yield* RebalancingState).runningMembers
        assert.deepStrictEqual(
          members.map(hex).sort(),
          [bad, new TextEncoder().encode("1/9\uFFFD"), new TextEncoder().encode("1/9")].map(hex).sort()
        )
      }).pipe(Effect.provide(backend)))

    it.effect("track adds \"<type>/<id>\" and refreshes the 10-day expiry", () =>
      Effect.gen(function*() {
        const state = yield* RebalancingState
        yield* state.track(1, 10)
        yield* state.track(2, 20)
        yield* state.track(1, 10)
        assert.deepStrictEqual(text(yield* state.runningMembers), ["1/10", "2/20"])
        assert.strictEqual(yield* (yield* RawSet).ttlSeconds, 864000)
      }).pipe(Effect.provide(backend)))

    it.effect("a key of the wrong type is a RedisError", () =>
      Effect.gen(function*() {
        yield* (yield* RawSet).setString("oops")
        const state = yield* RebalancingState
        for (const error of [yield* Effect.flip(state.runningMembers), yield* Effect.flip(state.track(1, 1))]) {
          assert.instanceOf(error, RedisError)
          // Permanent, and says so: a wrong-type key never heals, so the run guard must not retry it.
          assert.match(error.message, /^WRONGTYPE /)
          assert.isFalse(isTransient(error))
        }
      }).pipe(Effect.provide(backend)))
  })
}
