/**
 * A pause that answers success is durable and cluster-wide; one that cannot be
 * recorded fails loudly and changes nothing. A real `sweeper start` reaches PostgreSQL through a
 * proxy the test closes, so the database really refuses connections (ECONNREFUSED) while the
 * supervisor and its HTTP server stay up.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { runCli } from "../support/cli.ts"
import { PgTest, TestDatabaseUrl } from "../support/postgres.ts"
import { startSweeper } from "../support/processes.ts"
import { RedisTest, TestRedisUrl } from "../support/redis.ts"
import { startTcpProxy } from "../support/tcpProxy.ts"

const TOKEN = "pause-token"
const BATCH = "stuck-export-jobs"

layer(Layer.mergeAll(PgTest, RedisTest), { excludeTestServices: true })("pause durability", (it) => {
  it.effect(
    "with PostgreSQL refusing, pause and resume answer 503 (exit 3 from the CLI) and change nothing; a 200 is in the log",
    () =>
      Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        const direct = new URL(yield* TestDatabaseUrl)
        const proxy = yield* Effect.acquireRelease(
          Effect.promise(() => startTcpProxy(Number(direct.port || 5432), direct.hostname)),
          (p) => Effect.promise(() => p.refuse())
        )
        const viaProxy = new URL(direct)
        viaProxy.port = String(proxy.port)
        const env = { DATABASE_URL: viaProxy.toString(), REDIS_URL: yield* TestRedisUrl }
        const sweeper = yield* Effect.acquireRelease(
          Effect.sync(() =>
            startSweeper("pause", {
              ...env,
              SWEEPER_API_TOKEN: TOKEN,
              // A tick every second: each refreshes the pause state from the event log (the "periodic sync").
              SWEEPER_CRON_STUCK_EXPORT_JOBS: "* * * * * *"
            })
          ),
          (p) =>
            Effect.promise(async () => {
              p.child.kill("SIGKILL")
              await p.exited
            })
        )
        const base = yield* Effect.promise(() => sweeper.listening)
        const call = (method: "GET" | "POST", path: string) =>
          Effect.promise(async () => {
            const response = await fetch(`${base}${path}`, { method, headers: { authorization: `Bearer ${TOKEN}` } })
            return { status: response.status, body: await response.json() as any }
          })
        const stateOf = Effect.map(call("GET", "/api/batches"), (r) =>
          (r.body as Array<{ name: string; state: string }>).find((b) => b.name === BATCH)!.state)
        const recorded = (type: string) =>
          Effect.map(
            sql<
              { n: string }
            >`SELECT count(*) AS n FROM sweeper_events WHERE type = ${type} AND stream = ${`batch:${BATCH}`}`,
            (rows) =>
              Number(rows[0]!.n)
          )

        yield* Effect.promise(() => proxy.refuse())
        const refused = yield* call("POST", `/api/batches/${BATCH}/pause`)
        assert.strictEqual(refused.status, 503, JSON.stringify(refused.body))
        assert.deepStrictEqual(Object.keys(refused.body), ["error"])
        assert.strictEqual(refused.body.error.code, "unavailable")
        assert.match(
          refused.body.error.message,
          /pause of stuck-export-jobs could not be recorded, nothing changed: .*ECONNREFUSED/
        )
        assert.notStrictEqual(yield* stateOf, "paused")
        // The CLI on the same refusing database: one line, exit 3.
        const cli = yield* Effect.promise(() => runCli(["pause", BATCH], env))
        assert.strictEqual(cli.code, 3, cli.stderr)
        assert.lengthOf(cli.stderr.split("\n").filter((l) => l.startsWith("sweeper:")), 1, cli.stderr)

        yield* Effect.promise(() => proxy.accept())
        yield* Effect.sleep("2500 millis")
        assert.notStrictEqual(yield* stateOf, "paused", "still not paused once the database is back")
        assert.strictEqual(yield* recorded("BatchPaused"), 0)

        const paused = yield* call("POST", `/api/batches/${BATCH}/pause`)
        assert.strictEqual(paused.status, 200, JSON.stringify(paused.body))
        assert.strictEqual(yield* recorded("BatchPaused"), 1, "a 200 is in the log before it answers")
        // Ticks keep refreshing from the log: the pause stays, and another process sees it.
        yield* Effect.sleep("2500 millis")
        assert.strictEqual(yield* stateOf, "paused")
        const status = yield* Effect.promise(() => runCli(["status", "--json"], env))
        assert.strictEqual(
          (JSON.parse(status.stdout) as Array<{ name: string; state: string }>).find((b) => b.name === BATCH)!.state,
          "paused"
        )

        yield* Effect.promise(() => proxy.refuse())
        const resume = yield* call("POST", `/api/batches/${BATCH}/resume`)
        assert.strictEqual(resume.status, 503)
        assert.strictEqual(resume.body.error.code, "unavailable")
        assert.strictEqual(yield* stateOf, "paused")
        yield* Effect.promise(() => proxy.accept())
        assert.strictEqual(yield* recorded("BatchResumed"), 0)
      }).pipe(Effect.scoped),
    180_000
  )
})
