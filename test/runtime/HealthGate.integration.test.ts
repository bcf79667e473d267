/**
 * Issue 18's "done when", end to end: Sweeper pointed at a primary whose streaming standby is
 * behind (replay paused, tens of MB of WAL unreplayed) runs `sweeper run drop-canceling-builds`
 * with SWEEPER_HEALTH's replicationLag; it holds at the threshold — nothing dropped while held —
 * and, once replay resumes and the standby catches up, releases and finishes: every stuck build
 * dropped exactly once, one RepairHeld and one RepairReleased in the batch's stream.
 *
 * Real parts only: a private primary + standby (test/support/pgStandby.ts), the shared test
 * Redis, the real CLI as a child process.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, layer } from "@effect/vitest"
import { Context, Effect, Layer, Redacted } from "effect"
import { seedStuckCancelingBuilds } from "../../src/simulator/Fixtures.ts"
import { runCli } from "../support/cli.ts"
import { replicatedPostgres, type ReplicatedPostgres } from "../support/pgStandby.ts"
import { waitFor } from "../support/processes.ts"
import { freshRedisUrl } from "../support/redis.ts"

const STUCK = 3000
const DATABASE = "sweeper_health_e2e"
const HEALTH = JSON.stringify({ replicationLag: { stop: "32MB", resume: "1MB" } })

class Setup extends Context.Service<Setup, { readonly pair: ReplicatedPostgres; readonly redisUrl: string }>()("test/HealthGateE2E/Setup") {}
const SetupLive = Layer.effect(Setup, Effect.gen(function*() {
  const pair = yield* replicatedPostgres
  const redisUrl = yield* freshRedisUrl
  return { pair, redisUrl }
}))

const count = async (pair: ReplicatedPostgres, sql: string) => Number((await pair.primary(sql, DATABASE))[0]?.[0] ?? Number.NaN)

layer(SetupLive, { excludeTestServices: true, timeout: "120 seconds" })("health gate end to end (primary + lagging standby, CLI)", (it) => {
  it.effect("drop-canceling-builds holds while the standby is behind and finishes once it catches up, each build dropped once", () =>
    Effect.gen(function*() {
      const { pair, redisUrl } = yield* Setup
      const env = { DATABASE_URL: pair.urlOf(DATABASE), REDIS_URL: redisUrl, SWEEPER_HEALTH: HEALTH }
      yield* Effect.promise(() => pair.primary(`CREATE DATABASE ${DATABASE}`))
      const migrated = yield* Effect.promise(() => runCli(["migrate"], env))
      assert.strictEqual(migrated.code, 0, migrated.stderr)
      yield* seedStuckCancelingBuilds(STUCK).pipe(Effect.provide(PgClient.layer({ url: Redacted.make(pair.urlOf(DATABASE)) })))

      // The standby stops replaying; 40 MB of WAL later it is well past the 32 MB stop.
      yield* Effect.promise(() => pair.pauseReplay())
      yield* Effect.promise(() => pair.primary("CREATE TABLE filler (pad text); INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 40000)"))
      const lag = yield* Effect.promise(() => pair.lagBytes())
      assert.isAbove(lag, 40_000_000)

      const run = runCli(["run", "drop-canceling-builds", "--json"], env, 100_000)
      const held = yield* Effect.promise(() =>
        waitFor("RepairHeld", async () => (await count(pair, "SELECT count(*) FROM sweeper_events WHERE type = 'RepairHeld'")) > 0 ? true : undefined, 30_000))
      assert.isTrue(held)
      // Held: two re-checks later, still nothing dropped.
      yield* Effect.sleep("2500 millis")
      assert.strictEqual(yield* Effect.promise(() => count(pair, "SELECT count(*) FROM ci_builds WHERE status = 'failed'")), 0)
      assert.strictEqual(yield* Effect.promise(() => count(pair, "SELECT count(*) FROM sweeper_events WHERE type = 'RepairReleased'")), 0)

      yield* Effect.promise(() => pair.resumeReplay())
      const result = yield* Effect.promise(() => run)
      assert.strictEqual(result.code, 0, `${result.stderr}\n${result.stdout}`)
      const finished = JSON.parse(result.stdout.trim().split("\n").at(-1)!) as { outcome: string; summary: { dropped: number } }
      assert.strictEqual(finished.outcome, "succeeded")
      assert.strictEqual(finished.summary.dropped, STUCK)

      // Every build dropped exactly once.
      assert.strictEqual(yield* Effect.promise(() => count(pair, "SELECT count(*) FROM ci_builds WHERE status = 'failed'")), STUCK)
      const [dropped, distinct] = (yield* Effect.promise(() =>
        pair.primary("SELECT count(*), count(DISTINCT stream) FROM sweeper_events WHERE type = 'BuildDropped'", DATABASE)))[0]!
      assert.deepStrictEqual([Number(dropped), Number(distinct)], [STUCK, STUCK])

      // One hold, one pair, in the batch's stream, the held value past the threshold.
      const gateEvents = yield* Effect.promise(() =>
        pair.primary(
          "SELECT type, stream, data::text, run_id IS NOT NULL FROM sweeper_events WHERE type IN ('RepairHeld', 'RepairReleased') ORDER BY id",
          DATABASE
        ))
      assert.deepStrictEqual(gateEvents.map((row) => [row[0], row[1], row[3]]), [
        ["RepairHeld", "batch:drop-canceling-builds", "t"],
        ["RepairReleased", "batch:drop-canceling-builds", "t"]
      ])
      const heldData = JSON.parse(gateEvents[0]![2]!) as { signal: string; value: number; threshold: number }
      assert.strictEqual(heldData.signal, "replicationLag")
      assert.strictEqual(heldData.threshold, 32_000_000)
      assert.isAbove(heldData.value, 32_000_000)
      const releasedData = JSON.parse(gateEvents[1]![2]!) as { heldMs: number; reason?: string }
      assert.isAtLeast(releasedData.heldMs, 2500)
      assert.isUndefined(releasedData.reason)
    }))
})
