/**
 * The batch lease's renewal against real Redis: an error while renewing is not a lost lease. A
 * renewal cut off for a moment is retried on a short schedule and the run finishes; one refused
 * for longer than that leaves the lease unknown, and the next fence check reads it again instead of
 * failing with the old error; one that keeps failing fails the run as transient, with its cause; only
 * another token (or no key) is a lost lease.
 */
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Layer, Logger, Option, Redacted } from "effect"
import { Redis as IORedis } from "ioredis"
import { randomUUID } from "node:crypto"
import { type Batch, checkFence } from "../../src/domain/Batch.ts"
import { RedisError } from "../../src/domain/Errors.ts"
import { leaseKey } from "../../src/domain/Lease.ts"
import { MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import { LeaseRedis } from "../../src/layers/redis/LeaseRedis.ts"
import { Redis } from "../../src/layers/redis/Redis.ts"
import { Lease } from "../../src/services/Lease.ts"
import { runBatch } from "../../src/supervisor/RunGuard.ts"
import { cutProxy } from "../support/cutProxy.ts"
import { MemoryPlatform } from "../support/memory.ts"
import { RedisTest, TestRedisUrl } from "../support/redis.ts"
import { privateServer } from "../support/redisTopology.ts"

/** A batch under a 3 s lease (renewed every second) that works for `millis`, then writes behind the fence. */
const leased = (millis: number): Batch<string, unknown, never> => ({
  name: `fake-${randomUUID().slice(0, 8)}`,
  worker: "FakeWorker",
  description: "a fake batch",
  cron: "* * * * *",
  budget: Duration.minutes(1),
  lease: Option.some({ name: `fake/${randomUUID()}`, ttl: Duration.seconds(3) }),
  run: Effect.sleep(Duration.millis(millis)).pipe(Effect.andThen(checkFence), Effect.as("done"))
})

/**
 * A batch under a 12 s lease (renewed every 4 s) that says when it holds the lease and checks its
 * fence once `go` is done: long enough that a renewal refused past its retries leaves the lease
 * unknown for seconds before the next renewal, while the key is still alive.
 */
const checksWhenTold = (
  holding: Deferred.Deferred<void>,
  go: Deferred.Deferred<void>
): Batch<string, unknown, never> => ({
  name: `fake-${randomUUID().slice(0, 8)}`,
  worker: "FakeWorker",
  description: "a fake batch",
  cron: "* * * * *",
  budget: Duration.minutes(1),
  lease: Option.some({ name: `fake/${randomUUID()}`, ttl: Duration.seconds(12) }),
  run: Deferred.succeed(holding, undefined).pipe(
    Effect.andThen(Deferred.await(go)),
    Effect.andThen(checkFence),
    Effect.as("done")
  )
})

/**
 * Runs `checksWhenTold` on a private redis-server that a script keeps busy from the moment the run
 * holds its lease: every command, the first renewal too, is answered BUSY. Once the renewal has
 * given up (its warning logged) the script is killed, `afterOutage` runs, and the run checks its
 * fence.
 */
const renewalRefusedPastItsRetries = (afterOutage: (direct: IORedis, key: string) => Promise<unknown>) =>
  Effect.gen(function*() {
    const port = yield* privateServer
    const direct = new IORedis({ host: "127.0.0.1", port, maxRetriesPerRequest: 1 })
    const blocker = new IORedis({ host: "127.0.0.1", port, maxRetriesPerRequest: 1 })
    yield* Effect.addFinalizer(() => Effect.promise(() => Promise.all([direct.quit(), blocker.quit()])))
    // Past 100 ms a running script has every other command answered BUSY (the default is 5 s).
    yield* Effect.promise(() => direct.config("SET", "busy-reply-threshold", "100"))
    const gaveUp = yield* Deferred.make<void>()
    const watcher = Logger.make((options) => {
      if (String(options.message).includes("Exclusive lease renewal failed")) Deferred.doneUnsafe(gaveUp, Effect.void)
    })
    const holding = yield* Deferred.make<void>()
    const go = yield* Deferred.make<void>()
    const batch = checksWhenTold(holding, go)
    const key = leaseKey(Option.getOrThrow(batch.lease).name)
    const outage = Deferred.await(holding).pipe(
      // Read-only, so SCRIPT KILL can end it; it fails its own caller when killed.
      Effect.andThen(Effect.sync(() => void blocker.eval("while true do end", 0).catch(() => undefined))),
      Effect.andThen(Deferred.await(gaveUp)),
      Effect.andThen(Effect.promise(() => direct.script("KILL"))),
      // SCRIPT KILL answers before the script has stopped: on a loaded machine the next command can
      // still be answered BUSY, so it is repeated until the server takes it.
      Effect.andThen(Effect.promise(() => untilNotBusy(() => afterOutage(direct, key)))),
      Effect.andThen(Deferred.succeed(go, undefined))
    )
    const [result] = yield* Effect.all([
      runBatch(batch, { trigger: "manual" }).pipe(
        Effect.provide(Layer.merge(leaseAt(`redis://127.0.0.1:${port}`), Logger.layer([watcher])))
      ),
      outage
    ], { concurrency: 2 })
    return result
  })

/** `command` again while the server answers BUSY (at most 10 s). */
const untilNotBusy = async <A>(command: () => Promise<A>): Promise<A> => {
  for (let attempt = 1;; attempt++) {
    try {
      return await command()
    } catch (error) {
      if (attempt >= 200 || !String(error).includes("BUSY")) throw error
      await new Promise((resolve) => setTimeout(resolve, 50))
    }
  }
}

/** The run's events by type. */
const types = Effect.map(MemoryEvents, (events) => events.map((e) => e.type))

/** Lease on the real Redis at `url`. */
const leaseAt = (url: string) => LeaseRedis.pipe(Layer.provide(Redis.layerSingle(Redacted.make(url))), Layer.orDie)

describe("batch lease renewal on real Redis", () => {
  it.live(
    "a renewal cut off for a moment is retried: the run keeps its lease and succeeds",
    () =>
      Effect.gen(function*() {
        const direct = new URL(yield* TestRedisUrl)
        const proxy = yield* cutProxy({ host: direct.hostname, port: Number(direct.port === "" ? 6379 : direct.port) })
        // The renewal script is the only one that calls EXPIRE: the first renewal is cut off.
        proxy.cutOn(Buffer.from("redis.call('EXPIRE'"), 1)
        const restore = Effect.promise(() => proxy.cut).pipe(
          Effect.andThen(Effect.sleep("600 millis")),
          Effect.andThen(Effect.promise(() => proxy.restore()))
        )
        const batch = leased(3_500)
        const [result] = yield* Effect.all([
          runBatch(batch, { trigger: "manual" }).pipe(
            Effect.provide(leaseAt(`redis://127.0.0.1:${proxy.port}${direct.pathname}`))
          ),
          restore
        ], { concurrency: 2 })
        assert.strictEqual(result.outcome, "succeeded", result.error)
        assert.notInclude(yield* types, "LeaseLost")
      }).pipe(Effect.scoped, Effect.provide(Layer.merge(MemoryPlatform(), RedisTest))),
    30_000
  )

  it.live(
    "a renewal refused past its retries leaves the lease unknown, not lost: the next check reads it again, the run goes on",
    () =>
      Effect.gen(function*() {
        const result = yield* renewalRefusedPastItsRetries(() => Promise.resolve())
        assert.strictEqual(result.outcome, "succeeded", result.error)
        assert.strictEqual(result.summary, "done")
        assert.notInclude(yield* types, "LeaseLost")
      }).pipe(Effect.scoped, Effect.provide(MemoryPlatform())),
    40_000
  )

  it.live(
    "a renewal refused past its retries, then another process took the lease: the next check finds its token, lost",
    () =>
      Effect.gen(function*() {
        const result = yield* renewalRefusedPastItsRetries((direct, key) => direct.set(key, "another-holder", "EX", 60))
        assert.strictEqual(result.outcome, "failed")
        assert.strictEqual(result.reason, "lease lost", result.error)
        assert.include(yield* types, "LeaseLost")
      }).pipe(Effect.scoped, Effect.provide(MemoryPlatform())),
    40_000
  )

  it.live(
    "a renewal refused past its retries, then the key expired: the next check finds no key, lost",
    () =>
      Effect.gen(function*() {
        const result = yield* renewalRefusedPastItsRetries((direct, key) => direct.del(key))
        assert.strictEqual(result.outcome, "failed")
        assert.strictEqual(result.reason, "lease lost", result.error)
      }).pipe(Effect.scoped, Effect.provide(MemoryPlatform())),
    40_000
  )

  it.live(
    "a renewal that keeps failing fails the run as transient, with its cause; it is not a lost lease",
    () =>
      Effect.gen(function*() {
        const lease = yield* Lease
        const failing = Lease.of({
          ...lease,
          renew: () =>
            Effect.fail(new RedisError({ operation: "lease.renew", cause: new Error("OOM command not allowed") }))
        })
        const result = yield* runBatch(leased(4_000), { trigger: "manual" }).pipe(Effect.provideService(Lease, failing))
        assert.strictEqual(result.outcome, "failed")
        assert.notStrictEqual(result.reason, "lease lost")
        assert.include(result.error ?? "", "OOM command not allowed")
        assert.notInclude(yield* types, "LeaseLost")
      }).pipe(Effect.provide(leaseLayer().pipe(Layer.provideMerge(Layer.merge(MemoryPlatform(), RedisTest))))),
    60_000
  )

  it.live("a renewal that finds another token is a lost lease", () =>
    Effect.gen(function*() {
      const batch = leased(3_000)
      const redis = yield* Redis
      const steal = Effect.sleep("500 millis").pipe(
        Effect.andThen(redis.use("steal", (c) => c.set(leaseKey(Option.getOrThrow(batch.lease).name), "another")))
      )
      const [result] = yield* Effect.all([runBatch(batch, { trigger: "manual" }), steal], { concurrency: 2 })
      assert.strictEqual(result.outcome, "failed")
      assert.strictEqual(result.reason, "lease lost")
      assert.include(yield* types, "LeaseLost")
    }).pipe(Effect.provide(leaseLayer().pipe(Layer.provideMerge(Layer.merge(MemoryPlatform(), RedisTest))))), 30_000)
})

/** LeaseRedis on the test's own Redis database. */
function leaseLayer() {
  return Layer.unwrap(Effect.map(TestRedisUrl, leaseAt))
}
