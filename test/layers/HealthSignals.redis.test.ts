/**
 * The Redis, Sidekiq and Prometheus health signals read the real thing: `INFO memory`
 * of each store against its `maxmemory` (three separate servers of the split topology, each its own
 * limit), the oldest job of a Sidekiq queue (old jobs pushed the way Sidekiq pushes them, in both
 * Sidekiq's enqueued_at formats), and a real Prometheus scraping an exporter whose value the test
 * sets. What cannot be read (no maxmemory, a malformed job, a query with several series, nobody
 * listening) is unreadable with its reason, never a number.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it, layer } from "@effect/vitest"
import { Context, Effect, Layer, Option, Redacted } from "effect"
import { Redis as IORedis } from "ioredis"
import {
  enqueuedAtMillis,
  HealthSignalsLive,
  memoryRatio,
  promNumber
} from "../../src/layers/health/HealthSignalsLive.ts"
import { QueuesRedis, SharedStateRedis } from "../../src/layers/redis/Redis.ts"
import { HealthSignals, SignalUnreadable } from "../../src/services/HealthSignals.ts"
import { adminUrl } from "../support/postgres.ts"
import { type TestPrometheus, testPrometheus } from "../support/prometheus.ts"
import { RedisTopologyTest, startCluster } from "../support/redisTopology.ts"

// The PostgreSQL readers are not exercised here; the layer still wants a client (the shared test server).
const Pg = PgClient.layer({ url: Redacted.make(adminUrl), maxConnections: 1 })

const Signals = HealthSignalsLive.pipe(Layer.provideMerge(RedisTopologyTest("split")), Layer.provideMerge(Pg))

const infoField = (info: string, field: string) => Number(new RegExp(`^${field}:(\\d+)`, "m").exec(info)![1])

layer(Signals, { excludeTestServices: true, timeout: "180 seconds" })(
  "Redis and Sidekiq signals (real Redis, a server per store)",
  (it) => {
    it.effect("redisMemory: used/max per store, each against its own maxmemory", () =>
      Effect.gen(function*() {
        const signals = yield* HealthSignals
        const shared = yield* SharedStateRedis
        const queues = yield* QueuesRedis
        // Each store its own limit: SharedState at about a quarter of it, Queues nearly full.
        const used = infoField(yield* shared.use("INFO", (c) => c.info("memory")), "used_memory")
        yield* shared.use("CONFIG SET", (c) => c.config("SET", "maxmemory", String(used * 4)))
        yield* queues.use("SET", (c) => c.set("ballast", "x".repeat(2_000_000)))
        const queuesUsed = infoField(yield* queues.use("INFO", (c) => c.info("memory")), "used_memory")
        yield* queues.use("CONFIG SET", (c) => c.config("SET", "maxmemory", String(Math.round(queuesUsed / 0.95))))
        try {
          assert.approximately(yield* signals.redisMemory("sharedState"), 0.25, 0.03)
          assert.approximately(yield* signals.redisMemory("queues"), 0.95, 0.03)
          // As much again on SharedState: the reading follows.
          yield* shared.use("SET", (c) => c.set("ballast", "y".repeat(used)))
          const info = yield* shared.use("INFO", (c) => c.info("memory"))
          assert.approximately(
            yield* signals.redisMemory("sharedState"),
            infoField(info, "used_memory") / infoField(info, "maxmemory"),
            0.02
          )
          assert.isAbove(yield* signals.redisMemory("sharedState"), 0.4)
          // QueuesMetadata has no maxmemory: there is no ratio to read.
          const error = yield* Effect.flip(signals.redisMemory("queuesMetadata"))
          assert.instanceOf(error, SignalUnreadable)
          assert.include(error.message, "maxmemory is 0")
        } finally {
          yield* shared.use("CONFIG SET", (c) => c.config("SET", "maxmemory", "0")).pipe(Effect.ignore)
          yield* queues.use("CONFIG SET", (c) => c.config("SET", "maxmemory", "0")).pipe(Effect.ignore)
        }
      }))

    it.effect("queueLatency: now − enqueued_at of the oldest job (the tail), seconds or Sidekiq 8's milliseconds; empty → 0", () =>
      Effect.gen(function*() {
        const signals = yield* HealthSignals
        const queues = yield* QueuesRedis
        assert.strictEqual(yield* signals.queueLatency("default"), 0)
        const now = Date.now()
        // Sidekiq LPUSHes new jobs at the head: the oldest is at the tail.
        const job = (jid: string, enqueuedAt: number) =>
          JSON.stringify({ class: "HardWorker", args: [], jid, queue: "default", enqueued_at: enqueuedAt })
        yield* queues.use("LPUSH", (c) => c.lpush("queue:default", job("old", (now - 3_600_000) / 1000)))
        yield* queues.use("LPUSH", (c) => c.lpush("queue:default", job("new", now / 1000)))
        assert.approximately(yield* signals.queueLatency("default"), 3600, 5)
        // Sidekiq 8: integer milliseconds.
        yield* queues.use("LPUSH", (c) => c.lpush("queue:mailers", job("ms", now - 600_000)))
        assert.approximately(yield* signals.queueLatency("mailers"), 600, 5)
        // Another queue is another latency.
        assert.strictEqual(yield* signals.queueLatency("issues_rebalancing"), 0)
        // Not a job: unreadable, never 0.
        yield* queues.use("RPUSH", (c) => c.rpush("queue:broken", "not json"))
        const error = yield* Effect.flip(signals.queueLatency("broken"))
        assert.include(error.message, "queue:broken")
      }))
  }
)

const ClusterSignals = HealthSignalsLive.pipe(Layer.provideMerge(RedisTopologyTest("cluster")), Layer.provideMerge(Pg))

layer(ClusterSignals, { excludeTestServices: true, timeout: "180 seconds" })("redisMemory on a Redis Cluster", (it) => {
  it.effect("every master is read: the fullest one is the store's reading", () =>
    Effect.gen(function*() {
      const signals = yield* HealthSignals
      const { ports } = yield* Effect.promise(() => startCluster())
      const onNode = <A>(port: number, f: (client: IORedis) => Promise<A>) =>
        Effect.promise(async () => {
          const client = new IORedis(port, "127.0.0.1", { lazyConnect: true })
          await client.connect()
          try {
            return await f(client)
          } finally {
            await client.quit()
          }
        })
      const used = yield* Effect.forEach(ports, (port) =>
        onNode(port, async (c) => infoField(await c.info("memory"), "used_memory")))
      // The first master is nearly full, the others at about a tenth.
      yield* Effect.forEach(ports, (port, i) =>
        onNode(port, (c) =>
          c.config("SET", "maxmemory", String(Math.round(used[i]! / (i === 0 ? 0.9 : 0.1))))))
      try {
        assert.approximately(yield* signals.redisMemory("sharedState"), 0.9, 0.05)
      } finally {
        yield* Effect.forEach(ports, (port) =>
          onNode(port, (c) =>
            c.config("SET", "maxmemory", "0")))
      }
    }))
})

class Prom extends Context.Service<Prom, TestPrometheus>()("test/HealthSignals/Prom") {}

layer(Layer.mergeAll(Layer.effect(Prom, testPrometheus), Signals), {
  excludeTestServices: true,
  timeout: "240 seconds"
})(
  "Prometheus signal (a real Prometheus scraping a test exporter)",
  (it) => {
    it.effect("an instant query's number follows the scraped value; several series, or nobody listening, is unreadable", () =>
      Effect.gen(function*() {
        const prom = yield* Prom
        const signals = yield* HealthSignals
        prom.set({ "patroni_apdex{db=\"main\"}": 0.95, "patroni_apdex{db=\"ci\"}": 0.999 })
        yield* Effect.promise(() => prom.waitFor("patroni_apdex{db=\"main\"}", 0.95))
        assert.strictEqual(yield* signals.prometheus(prom.url, "patroni_apdex{db=\"main\"}"), 0.95)
        assert.strictEqual(yield* signals.prometheus(prom.url, "min(patroni_apdex)"), 0.95)
        assert.strictEqual(yield* signals.prometheus(prom.url, "scalar(max(patroni_apdex))"), 0.999)
        prom.set({ "patroni_apdex{db=\"main\"}": 0.998, "patroni_apdex{db=\"ci\"}": 0.999 })
        yield* Effect.promise(() => prom.waitFor("patroni_apdex{db=\"main\"}", 0.998))
        assert.strictEqual(yield* signals.prometheus(prom.url, "patroni_apdex{db=\"main\"}"), 0.998)

        const several = yield* Effect.flip(signals.prometheus(prom.url, "patroni_apdex"))
        assert.include(several.message, "returned 2 series")
        const none = yield* Effect.flip(signals.prometheus(prom.url, "no_such_metric"))
        assert.include(none.message, "returned 0 series")
        const bad = yield* Effect.flip(signals.prometheus(prom.url, "sum(("))
        assert.instanceOf(bad, SignalUnreadable)
        const down = yield* Effect.flip(signals.prometheus("http://127.0.0.1:1", "up"))
        assert.instanceOf(down, SignalUnreadable)
      }))
  }
)

describe("parsing what the servers answer", () => {
  it("INFO memory, enqueued_at formats, Prometheus answers", () => {
    assert.deepStrictEqual(memoryRatio("# Memory\r\nused_memory:500\r\nmaxmemory:1000\r\n"), Option.some(0.5))
    assert.strictEqual(memoryRatio("used_memory:500\r\nmaxmemory:0\r\n"), "no-limit")
    assert.strictEqual(enqueuedAtMillis(1_700_000_000.5), 1_700_000_000_500)
    assert.strictEqual(enqueuedAtMillis(1_700_000_000_500), 1_700_000_000_500)
    assert.deepStrictEqual(
      promNumber({ status: "success", data: { resultType: "vector", result: [{ metric: {}, value: [1, "0.5"] }] } }),
      { ok: 0.5 }
    )
    assert.deepStrictEqual(promNumber({ status: "success", data: { resultType: "scalar", result: [1, "2"] } }), {
      ok: 2
    })
    assert.deepStrictEqual(promNumber({ status: "error", error: "parse error" }), { error: "parse error" })
    assert.deepStrictEqual(
      promNumber({ status: "success", data: { resultType: "vector", result: [{ metric: {}, value: [1, "NaN"] }] } }),
      {
        error: "returned \"NaN\", not a number"
      }
    )
  })
})
