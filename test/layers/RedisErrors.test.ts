/**
 * Redis errors say why and are classified: the server's reply, the operation and host:port are in the
 * message (never the URL's password); connection loss, timeouts and "try again" replies are
 * transient (the run guard retries them), every other error reply is permanent — a wrong-type key
 * fails its run once, with one clear line, instead of three retries of `RedisError: `.
 */
import { assert, describe, it } from "@effect/vitest"
import { Context, Duration, Effect, Fiber, Layer, Option, Redacted, Stream } from "effect"
import { TestClock } from "effect/testing"
import { Redis as IORedis } from "ioredis"
import { randomUUID } from "node:crypto"
import { type AddressInfo, createServer } from "node:net"
import type { Batch } from "../../src/domain/Batch.ts"
import { PENDING_DIRECT_UPLOADS_KEY } from "../../src/domain/DirectUpload.ts"
import { isTransient, isTransientRedisCause, RedisError } from "../../src/domain/Errors.ts"
import { RUNNING_REBALANCES_KEY } from "../../src/domain/Rebalancing.ts"
import { MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import { PendingDirectUploadsRedis } from "../../src/layers/redis/PendingDirectUploadsRedis.ts"
import { RebalancingStateRedis } from "../../src/layers/redis/RebalancingStateRedis.ts"
import { Redis, type RedisClient } from "../../src/layers/redis/Redis.ts"
import { serverName } from "../../src/layers/redis/RedisErrors.ts"
import { DeleteStaleDirectUploads } from "../../src/programs/DeleteStaleDirectUploads.ts"
import { RescheduleStuckIssueRebalances } from "../../src/programs/RescheduleStuckIssueRebalances.ts"
import { PendingDirectUploads } from "../../src/services/PendingDirectUploads.ts"
import { RebalancingState } from "../../src/services/RebalancingState.ts"
import { runBatch } from "../../src/supervisor/RunGuard.ts"
import { MemoryPlatform } from "../support/memory.ts"
import { RedisTest } from "../support/redis.ts"

const WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"

describe("RedisError classification", () => {
  const cases: ReadonlyArray<readonly [string, boolean]> = [
    // Client side: the connection, not the request.
    ["Connection is closed.", true],
    ["connect ECONNREFUSED 127.0.0.1:6379", true],
    ["read ECONNRESET", true],
    ["ECONNRESET", true],
    ["ETIMEDOUT", true],
    ["Command timed out", true],
    [
      "Reached the max retries per request limit (which is 2). Refer to \"maxRetriesPerRequest\" option for details.",
      true
    ],
    ["", true],
    // Replies that say "try again".
    ["LOADING Redis is loading the dataset in memory", true],
    ["TRYAGAIN Multiple keys request during rehashing of slot", true],
    ["CLUSTERDOWN The cluster is down", true],
    ["BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.", true],
    ["MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.", true],
    ["READONLY You can't write against a read only replica.", true],
    ["ERR max number of clients reached", true],
    ["MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.", true],
    ["OOM command not allowed when used memory > 'maxmemory'.", true],
    // Replies that say the request is wrong: the same request gets the same answer.
    [WRONGTYPE, false],
    ["ERR Error running script (call to f_0123): @user_script:1: user_script:1: attempt to call a nil value", false],
    ["ERR syntax error", false],
    ["ERR unknown command 'FOO', with args beginning with: ", false],
    ["NOSCRIPT No matching script. Please use EVAL.", false],
    ["CROSSSLOT Keys in request don't hash to the same slot", false],
    ["NOAUTH Authentication required.", false],
    ["WRONGPASS invalid username-password pair or user is disabled.", false],
    ["EXECABORT Transaction discarded because of previous errors.", false],
    ["NOPERM User default has no permissions to run the 'hscan' command", false]
  ]
  for (const [message, transient] of cases) {
    it(`${transient ? "transient" : "permanent"}: ${message || "(empty)"}`, () => {
      assert.strictEqual(isTransientRedisCause(new Error(message)), transient)
      const error = new RedisError({ operation: "op", cause: new Error(message), server: "127.0.0.1:6379" })
      assert.strictEqual(isTransient(error), transient)
    })
  }

  it("the message carries the server's words, the operation and the server; the code when there are no words", () => {
    const error = new RedisError({
      operation: "HLEN pending_direct_uploads",
      cause: new Error(WRONGTYPE),
      server: "127.0.0.1:6379"
    })
    assert.strictEqual(
      `${error.name}: ${error.message}`,
      `RedisError: ${WRONGTYPE} (HLEN pending_direct_uploads on 127.0.0.1:6379)`
    )
    const refused = Object.assign(new AggregateError([]), { code: "ECONNREFUSED" })
    assert.strictEqual(
      new RedisError({ operation: "connect", cause: refused, server: "::1:6379" }).message,
      "ECONNREFUSED (connect on ::1:6379)"
    )
    assert.strictEqual(new RedisError({ operation: "x", cause: undefined }).message, "failed (x)")
  })

  it("the server is host:port from the parsed options: a password in the URL never reaches it", () => {
    const client = new IORedis("redis://someone:s3cret-pw@127.0.0.1:6390/2", { lazyConnect: true })
    assert.strictEqual(serverName(client.options), "127.0.0.1:6390")
    assert.strictEqual(serverName({ path: "/run/redis.sock" }), "/run/redis.sock")
    client.disconnect()
  })
})

/** Counts the calls that reach Redis, to tell a retried run from one that gave up at once. */
class Calls extends Context.Service<Calls, { count: number }>()("test/layers/RedisErrors/Calls") {
  static readonly layer = Layer.sync(Calls, () => ({ count: 0 }))
}

const CountedPending = Layer.effect(
  PendingDirectUploads,
  Effect.gen(function*() {
    const real = yield* PendingDirectUploads
    const calls = yield* Calls
    return PendingDirectUploads.of({
      ...real,
      count: Effect.suspend(() => {
        calls.count++
        return real.count
      })
    })
  })
).pipe(Layer.provide(PendingDirectUploadsRedis))

const CountedRebalancing = Layer.effect(
  RebalancingState,
  Effect.gen(function*() {
    const real = yield* RebalancingState
    const calls = yield* Calls
    return RebalancingState.of({
      ...real,
      runningMembers: Effect.suspend(() => {
        calls.count++
        return real.runningMembers
      })
    })
  })
).pipe(Layer.provide(RebalancingStateRedis))

/** Real Redis behind the two services; everything else of the platform in memory. */
const Platform = Layer.mergeAll(CountedPending, CountedRebalancing).pipe(
  Layer.provideMerge(Calls.layer),
  Layer.provideMerge(RedisTest)
)

const redisCall = <A>(f: (client: RedisClient) => Promise<A>) =>
  Effect.flatMap(Redis, (redis) => Effect.orDie(redis.use("test", f)))

const runOnce = <S>(batch: Batch<S, unknown, unknown>) =>
  Effect.gen(function*() {
    const result = yield* runBatch(batch as Batch<S, never, never>, { trigger: "manual" })
    const finished = (yield* MemoryEvents).filter((e) => e.type === "RunFinished")
    return { result, finished, calls: (yield* Calls).count }
  })

describe("wrong-type keys on real Redis: the run fails once, with the reason, not retried", () => {
  it.live("pending_direct_uploads holding a string: one attempt, the reply, the operation and the server in the error", () =>
    Effect.gen(function*() {
      yield* redisCall((c) => c.set(PENDING_DIRECT_UPLOADS_KEY, "not a hash"))
      const { calls, finished, result } = yield* runOnce(DeleteStaleDirectUploads)
      assert.strictEqual(result.outcome, "failed")
      assert.strictEqual(calls, 1, "a WRONGTYPE never heals: no retry")
      assert.match(
        result.error ?? "",
        /^RedisError: WRONGTYPE Operation against a key holding the wrong kind of value \(HLEN pending_direct_uploads on 127\.0\.0\.1:\d+\)$/
      )
      assert.lengthOf(finished, 1)
      assert.strictEqual((finished[0]!.data as { error?: string }).error, result.error)
      // The key is untouched, and the next run says the same.
      assert.strictEqual(yield* redisCall((c) => c.get(PENDING_DIRECT_UPLOADS_KEY)), "not a hash")
    }).pipe(Effect.provide(Layer.provideMerge(Platform, MemoryPlatform()))))

  it.live("the scan itself meeting a wrong type names HSCAN", () =>
    Effect.gen(function*() {
      yield* redisCall((c) => c.rpush(PENDING_DIRECT_UPLOADS_KEY, "a list"))
      const pending = yield* PendingDirectUploads
      const error = yield* Effect.flip(Stream.runDrain(pending.scan()))
      assert.instanceOf(error, RedisError)
      assert.match(error.message, /^WRONGTYPE .* \(HSCAN pending_direct_uploads on 127\.0\.0\.1:\d+\)$/)
      assert.isFalse(isTransient(error))
    }).pipe(Effect.provide(Platform)))

  it.live("the running-rebalances key holding a hash: one attempt, the reason in the error", () =>
    Effect.gen(function*() {
      yield* redisCall((c) => c.hset(RUNNING_REBALANCES_KEY, { "1/10": "x" }))
      const { calls, result } = yield* runOnce(RescheduleStuckIssueRebalances)
      assert.strictEqual(result.outcome, "failed")
      assert.strictEqual(calls, 1)
      assert.match(result.error ?? "", /^RedisError: WRONGTYPE .* \(rebalancing\.smembers on 127\.0\.0\.1:\d+\)$/)
    }).pipe(Effect.provide(Layer.provideMerge(Platform, MemoryPlatform()))))

  it.live("a closed connection is transient, and says where", () =>
    Effect.gen(function*() {
      const redis = yield* Redis
      const lost = yield* Effect.flip(Effect.acquireUseRelease(
        Effect.promise(async () => {
          // RedisTest is one server, never a cluster.
          const client = (redis.client as IORedis).duplicate({
            lazyConnect: true,
            maxRetriesPerRequest: 0,
            enableOfflineQueue: false
          })
          client.on("error", () => {})
          await client.connect()
          client.disconnect()
          return client
        }),
        (client) =>
          Effect.tryPromise({
            try: () => client.get("x"),
            catch: (cause) => new RedisError({ operation: "GET x", cause, server: serverName(client.options) })
          }),
        (client) => Effect.sync(() => client.disconnect())
      ))
      assert.isTrue(isTransient(lost), lost.message)
      assert.match(lost.message, /\(GET x on 127\.0\.0\.1:\d+\)$/)
    }).pipe(Effect.provide(Platform)))
})

describe("connecting", () => {
  it.live("a refused connection fails start-up with a transient error naming host:port, never the password", () =>
    Effect.gen(function*() {
      // A port nobody listens on: bind one, note it, close it.
      const port = yield* Effect.promise(() =>
        new Promise<number>((resolve) => {
          const server = createServer()
          server.listen(0, "127.0.0.1", () => {
            const bound = (server.address() as AddressInfo).port
            server.close(() => resolve(bound))
          })
        })
      )
      const error = yield* Effect.flip(
        Layer.build(Redis.layer(Redacted.make(`redis://someone:s3cret-pw@127.0.0.1:${port}/0`))).pipe(Effect.scoped)
      )
      assert.instanceOf(error, RedisError)
      assert.include(error.message, `(connect on 127.0.0.1:${port})`)
      assert.include(error.message, "ECONNREFUSED")
      assert.notInclude(error.message, "s3cret-pw")
      assert.notInclude(JSON.stringify(error), "s3cret-pw")
      assert.isTrue(isTransient(error))
    }))
})

describe("the run guard retries transient Redis errors only", () => {
  const failing = (message: string) => {
    let attempts = 0
    const batch: Batch<number, RedisError, never> = {
      name: `fake-${randomUUID().slice(0, 8)}`,
      worker: "FakeWorker",
      description: "fails with one Redis error",
      cron: "* * * * *",
      budget: Duration.minutes(5),
      lease: Option.none(),
      run: Effect.suspend(() => {
        attempts++
        return Effect.fail(new RedisError({ operation: "GET k", cause: new Error(message), server: "127.0.0.1:6379" }))
      })
    }
    return { batch, attempts: () => attempts }
  }

  const guarded = (batch: Batch<number, RedisError, never>) =>
    Effect.gen(function*() {
      const fiber = yield* Effect.forkChild(runBatch(batch, { trigger: "manual" }))
      yield* TestClock.adjust("1 minute")
      return yield* Fiber.join(fiber)
    }).pipe(Effect.provide(MemoryPlatform()))

  it.effect("LOADING: retried 3 times", () =>
    Effect.gen(function*() {
      const { attempts, batch } = failing("LOADING Redis is loading the dataset in memory")
      const result = yield* guarded(batch)
      assert.strictEqual(result.outcome, "failed")
      assert.strictEqual(attempts(), 4)
    }))

  it.effect("WRONGTYPE: not retried", () =>
    Effect.gen(function*() {
      const { attempts, batch } = failing(WRONGTYPE)
      const result = yield* guarded(batch)
      assert.strictEqual(result.outcome, "failed")
      assert.strictEqual(attempts(), 1)
      assert.strictEqual(result.error, `RedisError: ${WRONGTYPE} (GET k on 127.0.0.1:6379)`)
    }))
})
