/**
 * Real Redis for storage tests. Sweeper's keys are fixed (GitLab's formats), so isolation is by
 * database number: each scope claims one of dbs 1–15 exclusively (a `SET NX EX` claim in db 0,
 * released when the scope closes, expiring on its own if a test process dies), flushes it, and
 * hands out its URL. When all 15 are taken the claim waits. TEST_REDIS_URL overrides the server.
 */
import { Context, Effect, Layer, Redacted } from "effect"
import { randomUUID } from "node:crypto"
import { Redis as IORedis } from "ioredis"
import { Redis } from "../../src/layers/Redis.ts"

export const redisServer = process.env.TEST_REDIS_URL ?? "redis://127.0.0.1:6379"

const DATABASES = 15
const CLAIM_SECONDS = 900

const withAdmin = <A>(f: (admin: IORedis) => Promise<A>) =>
  Effect.promise(async () => {
    const admin = new IORedis(redisServer, { lazyConnect: true, maxRetriesPerRequest: 1 })
    await admin.connect()
    try {
      return await f(admin)
    } finally {
      await admin.quit()
    }
  })

const claim = (token: string) =>
  withAdmin(async (admin) => {
    const start = await admin.incr("sweeper-test:next-db")
    for (let i = 0; i < DATABASES; i++) {
      const n = (start + i) % DATABASES + 1
      if (await admin.set(`sweeper-test:db:${n}`, token, "EX", CLAIM_SECONDS, "NX")) {
        await admin.select(n)
        await admin.flushdb()
        return n
      }
    }
    return undefined
  })

/** A flushed Redis database of our own for the current scope; yields its URL. */
export const freshRedisUrl = Effect.acquireRelease(
  Effect.gen(function*() {
    const token = randomUUID()
    while (true) {
      const n = yield* claim(token)
      if (n !== undefined) return { n, token, url: `${redisServer}/${n}` }
      // Real time, not the Clock: specs build this layer under TestClock.
      yield* Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 200)))
    }
  }),
  ({ n, token }) =>
    withAdmin((admin) =>
      admin.eval(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`, 1, `sweeper-test:db:${n}`, token))
).pipe(Effect.map(({ url }) => url))

export class TestRedisUrl extends Context.Service<TestRedisUrl, string>()("test/support/TestRedisUrl") {}

/** The Redis service on a freshly flushed database, plus its URL for child processes. */
export const RedisTest = Layer.unwrap(Effect.map(freshRedisUrl, (url) =>
  Redis.layerSingle(Redacted.make(url)).pipe(Layer.merge(Layer.succeed(TestRedisUrl, url)), Layer.orDie)))
