/**
 * The store composition on the three test topologies: each store tag reaches its own
 * server (split), the cluster client is a cluster, one connection per distinct URL.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { Effect } from "effect"
import { parseRedisUrl } from "../../src/config/RedisUrl.ts"
import { QueuesMetadataRedis, QueuesRedis, Redis, RedisStores, SharedStateRedis } from "../../src/layers/redis/Redis.ts"
import { RedisTopologyTest, TestRedisStores, topologies } from "../support/redisTopology.ts"

const stores = Effect.all({
  redis: Redis,
  sharedState: SharedStateRedis,
  queues: QueuesRedis,
  queuesMetadata: QueuesMetadataRedis,
  all: RedisStores,
  test: TestRedisStores
})

describe("parseRedisUrl", () => {
  {
    it.effect("a single URL is one server, a comma list is a cluster of seed nodes with shared credentials", () =>
      Effect.sync(() => {
        assert.deepStrictEqual(parseRedisUrl("redis://127.0.0.1:6379/3"), {
          kind: "single",
          url: "redis://127.0.0.1:6379/3"
        })
        assert.deepStrictEqual(parseRedisUrl("redis://:s3cret@10.0.0.1:7000, redis://10.0.0.2:7001"), {
          kind: "cluster",
          nodes: [{ host: "10.0.0.1", port: 7000 }, { host: "10.0.0.2", port: 7001 }],
          username: undefined,
          password: "s3cret",
          tls: false
        })
        assert.strictEqual(parseRedisUrl("redis://10.0.0.1:7000/2,redis://10.0.0.2:7000").kind, "invalid")
        assert.strictEqual(parseRedisUrl("http://10.0.0.1").kind, "invalid")
      }))
  }
})

for (const topology of topologies) {
  describe(`Redis stores on ${topology}`, () => {
    layer(RedisTopologyTest(topology), { excludeTestServices: true, timeout: "180 seconds" })((it) => {
      it.effect("each store tag reaches its store; Redis is SharedState; one connection per distinct URL", () =>
        Effect.gen(function*() {
          const s = yield* stores
          assert.strictEqual(s.redis, s.sharedState)
          assert.deepStrictEqual(s.all.map((entry) => entry.store), ["sharedState", "queues", "queuesMetadata"])
          const expectedKind = topology === "cluster" ? "cluster" : "single"
          for (const { redis } of s.all) assert.strictEqual(redis.kind, expectedKind)
          yield* s.sharedState.use("t", (c) => c.set("probe:shared", "1", "EX", 60))
          yield* s.queues.use("t", (c) => c.set("probe:queues", "1", "EX", 60))
          yield* s.queuesMetadata.use("t", (c) => c.set("probe:meta", "1", "EX", 60))
          const seen = yield* Effect.all(
            [s.sharedState, s.queues, s.queuesMetadata].map((store) =>
              store.use("t", (c) => Promise.all(["probe:shared", "probe:queues", "probe:meta"].map((k) => c.exists(k))))
            )
          )
          if (topology === "split") {
            assert.notStrictEqual(s.sharedState, s.queues)
            assert.notStrictEqual(s.queues, s.queuesMetadata)
            assert.deepStrictEqual(seen, [[1, 0, 0], [0, 1, 0], [0, 0, 1]])
          } else {
            // Same URL → same connection, every key visible from every tag.
            assert.strictEqual(s.sharedState, s.queues)
            assert.strictEqual(s.queues, s.queuesMetadata)
            assert.deepStrictEqual(seen, [[1, 1, 1], [1, 1, 1], [1, 1, 1]])
          }
          assert.isString(s.test.env["REDIS_QUEUES_URL"])
        }))
    })
  })
}
