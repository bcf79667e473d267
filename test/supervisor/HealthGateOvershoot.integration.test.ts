/**
 * The brake stops within one unit of its threshold: Sweeper pointed at a primary whose streaming
 * standby has stopped replaying runs drop-canceling-builds with `replicationLag` stop 4 MB; the
 * standby starts just under it, so the batch's own writes push it over. When the batch holds, the
 * standby is at most stop + one page's WAL behind (asserted: ≤ 1.5 × stop), not a second's worth
 * of writes past it. Resumed, the run finishes with every build dropped once.
 *
 * Real parts only: a private primary + standby (test/support/pgStandby.ts), real Redis, the CLI
 * as a child process. Sized to run in well under a minute on a loaded machine.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, layer } from "@effect/vitest"
import { Context, Effect, Layer, Redacted } from "effect"
import { seedStuckCancelingBuilds } from "../../src/simulator/Fixtures.ts"
import { runCli } from "../support/cli.ts"
import { type ReplicatedPostgres, replicatedPostgres } from "../support/pgStandby.ts"
import { waitFor } from "../support/processes.ts"
import { freshRedisUrl } from "../support/redis.ts"

const STUCK = 30_000
const STOP = 4_000_000
const DATABASE = "sweeper_gate_overshoot"
const HEALTH = JSON.stringify({ replicationLag: { stop: "4MB", resume: "1MB" } })

class Setup extends Context.Service<Setup, { readonly pair: ReplicatedPostgres; readonly redisUrl: string }>()(
  "test/HealthGateOvershoot/Setup"
) {}
const SetupLive = Layer.effect(
  Setup,
  Effect.gen(function*() {
    return { pair: yield* replicatedPostgres, redisUrl: yield* freshRedisUrl }
  })
)

const count = async (pair: ReplicatedPostgres, sql: string) =>
  Number((await pair.primary(sql, DATABASE))[0]?.[0] ?? Number.NaN)

layer(SetupLive, { excludeTestServices: true, timeout: "120 seconds" })("health gate overshoot", (it) => {
  it.effect("holds with the standby at most 1.5 × stop behind, then finishes once it catches up", () =>
    Effect.gen(function*() {
      const { pair, redisUrl } = yield* Setup
      const env = { DATABASE_URL: pair.urlOf(DATABASE), REDIS_URL: redisUrl, SWEEPER_HEALTH: HEALTH }
      yield* Effect.promise(() => pair.primary(`CREATE DATABASE ${DATABASE}`))
      const migrated = yield* Effect.promise(() => runCli(["migrate"], env))
      assert.strictEqual(migrated.code, 0, migrated.stderr)
      yield* seedStuckCancelingBuilds(STUCK).pipe(
        Effect.provide(PgClient.layer({ url: Redacted.make(pair.urlOf(DATABASE)) }))
      )
      // Vacuumed and analysed now, so neither autovacuum nor the first reads of the seeded rows (hint
      // bits, full-page images after the checkpoint) write WAL while replay is paused: CI once saw the
      // standby 13 MB behind before the run had written anything.
      yield* Effect.promise(() => pair.primary("VACUUM (ANALYZE) ci_builds", DATABASE))
      yield* Effect.promise(() => pair.primary("CHECKPOINT"))
      // Replay stops; about 3 MB of WAL later the standby is just under the stop.
      yield* Effect.promise(() => pair.pauseReplay())
      yield* Effect.promise(() =>
        pair.primary(
          `CREATE TABLE filler (pad text); INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 2500)`,
          DATABASE
        )
      )
      const before = yield* Effect.promise(() => pair.lagBytes())
      assert.isBelow(before, STOP)

      const run = runCli(["run", "drop-canceling-builds", "--json"], env, 100_000)
      yield* Effect.promise(() =>
        waitFor(
          "RepairHeld",
          async () =>
            (await count(pair, "SELECT count(*) FROM sweeper_events WHERE type = 'RepairHeld'")) > 0
              ? true
              : undefined,
          60_000
        )
      )
      // Held: nothing more is written, so the lag now is the lag at the hold.
      const atHold = yield* Effect.promise(() => pair.lagBytes())
      const droppedAtHold = yield* Effect.promise(() =>
        count(pair, "SELECT count(*) FROM ci_builds WHERE status = 'failed'")
      )
      assert.isAbove(atHold, STOP)
      assert.isAtMost(atHold, 1.5 * STOP, `standby ${atHold} bytes behind at the hold (${droppedAtHold} dropped)`)
      assert.isBelow(droppedAtHold, STUCK)

      yield* Effect.promise(() => pair.resumeReplay())
      const result = yield* Effect.promise(() => run)
      assert.strictEqual(result.code, 0, `${result.stderr}\n${result.stdout}`)
      const finished = JSON.parse(result.stdout.trim().split("\n").at(-1)!) as { summary: { dropped: number } }
      assert.strictEqual(finished.summary.dropped, STUCK)
    }))
})
