/**
 * Real Redis for storage tests. Sweeper's keys are fixed (GitLab's formats), so isolation is by
 * database number: each call takes the next of dbs 1–15 (round robin through a counter in db 0)
 * and flushes it. TEST_REDIS_URL overrides the server (default redis://127.0.0.1:6379).
 */
import { Context, Effect, Layer, Redacted } from "effect"
import { Redis as IORedis } from "ioredis"
import { Redis } from "../../src/layers/Redis.ts"

export const redisServer = process.env.TEST_REDIS_URL ?? "redis://127.0.0.1:6379"

export const freshRedisUrl = Effect.promise(async () => {
  const admin = new IORedis(redisServer, { lazyConnect: true, maxRetriesPerRequest: 1 })
  await admin.connect()
  const n = (await admin.incr("sweeper-test:next-db")) % 15 + 1
  await admin.select(n)
  await admin.flushdb()
  await admin.quit()
  return `${redisServer}/${n}`
})

export class TestRedisUrl extends Context.Service<TestRedisUrl, string>()("test/support/TestRedisUrl") {}

/** The Redis service on a freshly flushed database, plus its URL for child processes. */
export const RedisTest = Layer.unwrap(Effect.map(freshRedisUrl, (url) =>
  Redis.layer(Redacted.make(url)).pipe(Layer.merge(Layer.succeed(TestRedisUrl, url)), Layer.orDie)))
