/**
 * Real Redis for storage tests. Sweeper's keys are fixed (GitLab's formats), so isolation is by
 * database number: each scope claims one of dbs 1–15 exclusively (a `SET NX EX` claim in db 0,
 * released when the scope closes, expiring on its own if a test process dies), flushes it, and
 * hands out its URL. When all 15 are taken the claim waits. TEST_REDIS_URL overrides the server.
 *
 * The suite never flushes data it did not write: a database is used only if it is empty or marked
 * in db 0 (`sweeper-test:owned:<n>`) as one the suite claimed before; a database holding anyone
 * else's keys is left alone, and if all are like that the claim fails saying so.
 */
import { Context, Effect, Layer, Redacted } from "effect"
import { Redis as IORedis } from "ioredis"
import { randomUUID } from "node:crypto"
import { Redis } from "../../src/layers/redis/Redis.ts"

export const redisServer = process.env.TEST_REDIS_URL ?? "redis://127.0.0.1:6379"

const DATABASES = 15
const CLAIM_SECONDS = 900
/** How long a db stays known as the suite's own after its last claim (its test keys may not expire). */
const OWNED_SECONDS = 30 * 24 * 3600

/** db 0 marker: "database n holds only what this test suite wrote", set before the suite writes there. */
export const ownedMarker = (n: number) => `sweeper-test:owned:${n}`

const withAdmin = <A>(server: string, f: (admin: IORedis) => Promise<A>) =>
  Effect.promise(async () => {
    const admin = new IORedis(server, { lazyConnect: true, maxRetriesPerRequest: 1 })
    await admin.connect()
    try {
      return await f(admin)
    } finally {
      await admin.quit()
    }
  })

/** Someone else's data: the suite flushes a database only if it is empty or marked as its own. */
export class ForeignRedisData extends Error {
  constructor(server: string, databases: ReadonlyArray<number>) {
    super(
      `refusing to flush Redis ${server} db ${databases.join(", ")}: they hold keys this test suite did not write ` +
        `(no ${ownedMarker(databases[0] ?? 1)} marker in db 0). Point TEST_REDIS_URL at a Redis server for tests, ` +
        `or empty those databases yourself if their data is disposable.`
    )
  }
}

type Claimed = { readonly _tag: "claimed"; readonly n: number } | {
  readonly _tag: "busy"
  readonly foreign: ReadonlyArray<number>
}

const claim = (server: string, token: string) =>
  withAdmin(server, async (admin): Promise<Claimed> => {
    const start = await admin.incr("sweeper-test:next-db")
    const foreign: Array<number> = []
    for (let i = 0; i < DATABASES; i++) {
      const n = (start + i) % DATABASES + 1
      if (!(await admin.set(`sweeper-test:db:${n}`, token, "EX", CLAIM_SECONDS, "NX"))) continue
      await admin.select(n)
      const empty = (await admin.dbsize()) === 0
      await admin.select(0)
      if (!empty && (await admin.exists(ownedMarker(n))) === 0) {
        foreign.push(n)
        await admin.eval(RELEASE, 1, `sweeper-test:db:${n}`, token)
        continue
      }
      // Marked before the first write, so a test process killed mid-way leaves a db we may reuse.
      await admin.set(ownedMarker(n), token, "EX", OWNED_SECONDS)
      await admin.select(n)
      await admin.flushdb()
      return { _tag: "claimed", n }
    }
    return { _tag: "busy", foreign }
  })

const RELEASE = `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`

/**
 * A flushed Redis database of our own on `server` for the current scope; yields its URL. Fails with
 * ForeignRedisData when every database holds keys the suite did not write; waits while the
 * suite's own databases are all claimed.
 */
export const freshRedisUrlOn = (server: string) =>
  Effect.acquireRelease(
    Effect.gen(function*() {
      const token = randomUUID()
      while (true) {
        const result = yield* claim(server, token)
        if (result._tag === "claimed") return { n: result.n, token, url: `${server}/${result.n}` }
        if (result.foreign.length === DATABASES) return yield* Effect.die(new ForeignRedisData(server, result.foreign))
        // Real time, not the Clock: specs build this layer under TestClock.
        yield* Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 200)))
      }
    }),
    ({ n, token }) =>
      withAdmin(server, async (admin) => {
        // Leave the database empty for the next claim; only while the claim is still ours.
        if ((await admin.get(`sweeper-test:db:${n}`)) === token) {
          await admin.select(n)
          await admin.flushdb()
          await admin.select(0)
        }
        return admin.eval(RELEASE, 1, `sweeper-test:db:${n}`, token)
      })
  ).pipe(Effect.map(({ url }) => url))

/** A flushed Redis database of our own on the test server for the current scope; yields its URL. */
export const freshRedisUrl = freshRedisUrlOn(redisServer)

export class TestRedisUrl extends Context.Service<TestRedisUrl, string>()("test/support/TestRedisUrl") {}

/** The Redis service on a freshly flushed database, plus its URL for child processes. */
export const RedisTest = Layer.unwrap(
  Effect.map(
    freshRedisUrl,
    (url) => Redis.layerSingle(Redacted.make(url)).pipe(Layer.merge(Layer.succeed(TestRedisUrl, url)), Layer.orDie)
  )
)
