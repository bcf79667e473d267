/**
 * The suite's Redis claim never flushes data it did not write. Run against a private redis-server
 * on a free loopback port, so the shared server's databases are never seeded with "foreign" keys.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit } from "effect"
import { Redis as IORedis } from "ioredis"
import { execFileSync } from "node:child_process"
import { mkdtempSync, realpathSync, rmSync } from "node:fs"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { freshRedisUrlOn, ownedMarker } from "./redis.ts"

const freePort = () =>
  new Promise<number>((resolve) => {
    const server = createServer().listen(0, "127.0.0.1", () => {
      const { port } = server.address() as { port: number }
      server.close(() => resolve(port))
    })
  })

const privateRedis = Effect.acquireRelease(
  Effect.promise(async () => {
    // The port was free when the OS handed it out, but another server may bind it first: the one
    // answering must run in our directory, or the start is tried again on a new port.
    for (let attempt = 0;; attempt++) {
      const port = await freePort()
      const dir = realpathSync(mkdtempSync(join(tmpdir(), "sweeper-redis-claim-")))
      execFileSync("redis-server", [
        "--port",
        String(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        dir,
        "--daemonize",
        "yes"
      ])
      const client = new IORedis(`redis://127.0.0.1:${port}`, { maxRetriesPerRequest: 20 })
      const ownDir = await (client.config("GET", "dir") as Promise<ReadonlyArray<string>>).then(
        ([, value]) => value,
        () => undefined
      )
      if (ownDir === dir) return { url: `redis://127.0.0.1:${port}`, client, dir, port }
      client.disconnect()
      rmSync(dir, { recursive: true, force: true })
      if (attempt >= 4) throw new Error("no private redis-server could bind a port of its own")
    }
  }),
  ({ client, dir, port }) =>
    Effect.promise(async () => {
      client.disconnect()
      try {
        execFileSync("redis-cli", ["-p", String(port), "shutdown", "nosave"])
      } catch {
        // shutdown closes the connection before replying
      }
      rmSync(dir, { recursive: true, force: true })
    })
)

const seed = (client: IORedis, db: number, key: string) =>
  Effect.promise(async () => {
    await client.select(db)
    await client.set(key, "x")
    await client.select(0)
  })

const keysIn = (client: IORedis, db: number) =>
  Effect.promise(async () => {
    await client.select(db)
    const keys = await client.keys("*")
    await client.select(0)
    return keys.sort()
  })

describe("test Redis claim", () => {
  it.live("skips a database holding foreign keys, refuses when all do, reuses its own", () =>
    Effect.gen(function*() {
      const redis = yield* privateRedis
      for (let db = 1; db <= 15; db++) yield* seed(redis.client, db, `someone-elses:${db}`)

      // Every database holds someone else's keys: refused, with a message that says so; nothing flushed.
      const refused = yield* Effect.exit(Effect.scoped(freshRedisUrlOn(redis.url)))
      assert.isTrue(Exit.isFailure(refused))
      assert.match(
        String(Exit.isFailure(refused) ? refused.cause : ""),
        /refusing to flush Redis .* keys this test suite did not write/
      )
      for (let db = 1; db <= 15; db++) assert.deepStrictEqual(yield* keysIn(redis.client, db), [`someone-elses:${db}`])

      // One database the suite marked as its own (a previous run's leftovers): that one is used and flushed.
      yield* Effect.promise(() => redis.client.set(ownedMarker(7), "earlier-run"))
      yield* Effect.scoped(Effect.gen(function*() {
        const url = yield* freshRedisUrlOn(redis.url)
        assert.strictEqual(url, `${redis.url}/7`)
        assert.deepStrictEqual(yield* keysIn(redis.client, 7), [])
        yield* seed(redis.client, 7, "written-by-the-test")
      }))
      // Left empty on release; the others untouched.
      assert.deepStrictEqual(yield* keysIn(redis.client, 7), [])
      assert.deepStrictEqual(yield* keysIn(redis.client, 8), ["someone-elses:8"])
    }).pipe(Effect.scoped), 120_000)
})
