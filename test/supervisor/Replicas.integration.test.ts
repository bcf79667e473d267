/**
 * Three Sweeper processes against one real PostgreSQL and Redis, drop-canceling-builds ticking every
 * second: every tick runs exactly once cluster-wide, and a process killed with SIGKILL mid-run is
 * taken over by another within the lease TTL, with no duplicate and no lost repair.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect, Redacted } from "effect"
import { layerServer } from "../../src/layers/postgres/Postgres.ts"
import { batchNames } from "../../src/programs/index.ts"
import { seedStuckCancelingBuilds } from "../../src/simulator/Fixtures.ts"
import { freshDatabase } from "../support/postgres.ts"
import { startSweeper, type SweeperProcess } from "../support/processes.ts"
import { freshRedisUrl } from "../support/redis.ts"

const LEASE_TTL_SECONDS = 4
const STUCK_BUILDS = 6000

const waitUntil = <E, R>(what: string, condition: Effect.Effect<boolean, E, R>, timeout: Duration.Input) =>
  Effect.gen(function*() {
    const deadline = Date.now() + Duration.toMillis(Duration.fromInputUnsafe(timeout))
    while (!(yield* condition)) {
      if (Date.now() > deadline) return yield* Effect.die(new Error(`timed out waiting for ${what}`))
      yield* Effect.sleep("250 millis")
    }
  })

describe("many replicas", () => {
  it.live(
    "each tick runs exactly once; a SIGKILLed holder is taken over with no duplicate and no lost repair",
    () =>
      Effect.gen(function*() {
        const db = yield* freshDatabase
        yield* scenario(db.url).pipe(Effect.provide(layerServer(Redacted.make(db.url))))
      }).pipe(Effect.scoped),
    180_000
  )
})

const scenario = (databaseUrl: string) =>
  Effect.gen(function*() {
    const db = { url: databaseUrl }
    const redisUrl = yield* freshRedisUrl
    const env = {
      DATABASE_URL: db.url,
      REDIS_URL: redisUrl,
      SWEEPER_HTTP_PORT: "0",
      SWEEPER_CRON_DROP_CANCELING_BUILDS: "* * * * * *",
      SWEEPER_LEASE_TTL_DROP_CANCELING_BUILDS: `${LEASE_TTL_SECONDS} seconds`,
      SWEEPER_DISABLED_BATCHES: batchNames.filter((name) => name !== "drop-canceling-builds").join(",")
    }
    const processes = yield* Effect.acquireRelease(
      Effect.sync(() => ["p1", "p2", "p3"].map((name) => startSweeper(name, env))),
      (all) =>
        Effect.promise(async () => {
          for (const p of all) p.child.kill("SIGKILL")
          await Promise.all(all.map((p) => p.exited))
        })
    )
    yield* Effect.promise(() => Promise.all(processes.map((p) => p.listening)))

    const sql = yield* PgClient.PgClient
    const ticks = sql<{ scheduled_at: string; runs: string; nodes: string }>`
        SELECT data->>'scheduled_at' AS scheduled_at, count(*) AS runs, string_agg(data->>'node', ',') AS nodes
        FROM sweeper_events WHERE type = 'RunStarted' AND stream = 'batch:drop-canceling-builds'
        GROUP BY 1 ORDER BY 1`

    // 1. Exactly once per tick, for at least 20 ticks with all three replicas up.
    const allUp = new Date()
    yield* waitUntil(
      "22 ticks",
      Effect.map(ticks, (rows) => rows.filter((r) => new Date(r.scheduled_at) > allUp).length >= 22),
      "60 seconds"
    )
    const observed = (yield* ticks).filter((r) => new Date(r.scheduled_at) > allUp)
    for (const row of observed) {
      assert.strictEqual(Number(row.runs), 1, `tick ${row.scheduled_at} ran ${row.runs} times (${row.nodes})`)
    }
    const seconds = observed.map((r) => Date.parse(r.scheduled_at) / 1000)
    for (let i = 1; i < seconds.length; i++) assert.strictEqual(seconds[i]! - seconds[i - 1]!, 1, "no tick is lost")
    const nodes = new Set(observed.flatMap((r) => r.nodes.split(",")))
    assert.isAtLeast(nodes.size, 2, "ticks are shared between replicas")

    // 2. Kill the replica holding the lease mid-run.
    yield* seedStuckCancelingBuilds(STUCK_BUILDS)
    yield* waitUntil(
      "the first 300 drops",
      Effect.map(sql<{ n: string }>`SELECT count(*) AS n FROM sweeper_events WHERE type = 'BuildDropped'`, (r) =>
        Number(r[0]!.n) >= 300),
      "60 seconds"
    )
    const holder = yield* sql<{ node: string; run_id: string }>`
        SELECT s.data->>'node' AS node, s.run_id FROM sweeper_events s
        WHERE s.type = 'RunStarted' AND s.run_id IN (SELECT run_id FROM sweeper_events WHERE type = 'BuildDropped')
          AND NOT EXISTS (SELECT 1 FROM sweeper_events f WHERE f.type = 'RunFinished' AND f.run_id = s.run_id)
        ORDER BY s.id DESC LIMIT 1`
    assert.lengthOf(holder, 1, "a run is dropping builds right now")
    const victim = processes.find((p) =>
      p.name === holder[0]!.node
    ) as SweeperProcess
    victim.child.kill("SIGKILL")
    yield* Effect.promise(() => victim.exited)
    const killedAt = Date.now()

    // 3. Another replica takes over within the lease TTL (+ one tick) and finishes the work.
    yield* waitUntil(
      "all builds dropped",
      Effect.map(sql<{ n: string }>`SELECT count(*) AS n FROM ci_builds WHERE status = 'canceling'`, (r) =>
        Number(r[0]!.n) === 0),
      "120 seconds"
    )
    const takeover = yield* sql<{ node: string; first_drop: Date }>`
        SELECT s.data->>'node' AS node, min(d.occurred_at) AS first_drop
        FROM sweeper_events d JOIN sweeper_events s ON s.run_id = d.run_id AND s.type = 'RunStarted'
        WHERE d.type = 'BuildDropped' AND d.run_id <> ${holder[0]!.run_id}
          AND d.occurred_at > ${new Date(killedAt - 1000)}
        GROUP BY 1 ORDER BY 2 LIMIT 1`
    assert.lengthOf(takeover, 1)
    assert.notStrictEqual(takeover[0]!.node, victim.name)
    const takeoverMs = takeover[0]!.first_drop.getTime() - killedAt
    assert.isBelow(takeoverMs, (LEASE_TTL_SECONDS + 3) * 1000, `took over after ${takeoverMs} ms`)

    // The killed run is closed once, as abandoned, by the run that took its lease over.
    const killedRun = yield* sql<{ outcome: string }>`
        SELECT data->>'outcome' AS outcome FROM sweeper_events WHERE type = 'RunFinished' AND run_id = ${
      holder[0]!.run_id
    }`
    assert.deepStrictEqual(
      killedRun.map((r) =>
        r.outcome
      ),
      ["abandoned"]
    )

    const drops = yield* sql<{ builds: string; events: string }>`
        SELECT count(DISTINCT stream) AS builds, count(*) AS events FROM sweeper_events WHERE type = 'BuildDropped'`
    assert.strictEqual(Number(drops[0]!.builds), STUCK_BUILDS, "no lost repair")
    assert.strictEqual(Number(drops[0]!.events), STUCK_BUILDS, "no duplicate repair")
    const rows = yield* sql<
      { n: string }
    >`SELECT count(*) AS n FROM ci_builds WHERE status = 'failed' AND failure_reason = 3`
    assert.strictEqual(Number(rows[0]!.n), STUCK_BUILDS)

    // 4. The survivors shut down gracefully on SIGTERM.
    for (const p of processes.filter((other) => other !== victim)) p.child.kill("SIGTERM")
    const codes = yield* Effect.promise(() => Promise.all(processes.filter((p) => p !== victim).map((p) => p.exited)))
    assert.deepStrictEqual(codes, [0, 0])
  }).pipe(Effect.scoped)
