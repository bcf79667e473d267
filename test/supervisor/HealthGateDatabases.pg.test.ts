/**
 * The health gate of a decomposed GitLab on real replication: two private primaries, main and ci,
 * each with a streaming standby (test/support/pgStandby.ts), and the gate as the composition root
 * wires it (App.ts: ciClientLayer from CI_DATABASE_URL, healthLayer over the registry's batches).
 * Replay paused on ci's standby holds drop-canceling-builds (RepairHeld on ci) while
 * stuck-export-jobs, which writes main, goes on; paused on main's instead, the reverse. Then the same
 * through the CLI, as an operator runs it with DATABASE_URL and CI_DATABASE_URL: the drop run waits
 * on ci's lag (its RepairHeld in main's ledger says ci) while stuck-export-jobs runs to its end, and
 * the drop finishes once ci's standby catches up.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, layer } from "@effect/vitest"
import { Clock, Context, Effect, Layer, Option, Redacted, Schema } from "effect"
import { HealthJson } from "../../src/domain/HealthConfig.ts"
import { EventLogMemory, MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { HealthGate } from "../../src/services/HealthGate.ts"
import { seedStuckCancelingBuilds } from "../../src/simulator/Fixtures.ts"
import { ciClientLayer, healthLayer } from "../../src/supervisor/App.ts"
import { runCli } from "../support/cli.ts"
import { type ReplicatedPostgres, replicatedPostgres } from "../support/pgStandby.ts"
import { waitFor } from "../support/processes.ts"
import { freshRedisUrl } from "../support/redis.ts"

const STOP = 4_000_000
const STUCK = 300
/** The CLI's databases, one on each primary. */
const DATABASE = "hg_gate_e2e"
const HEALTH = Schema.decodeUnknownSync(HealthJson)(
  JSON.stringify({ replicationLag: { stop: "4MB", resume: "1MB" } })
)

class Pairs extends Context.Service<Pairs, { readonly main: ReplicatedPostgres; readonly ci: ReplicatedPostgres }>()(
  "test/HealthGateDatabases/Pairs"
) {}
const PairsLive = Layer.effect(
  Pairs,
  Effect.map(
    Effect.all([replicatedPostgres, replicatedPostgres], { concurrency: 2 }),
    ([main, ci]) => ({ main, ci })
  )
)

/** The gate as App.ts builds it, over main's and ci's primaries. */
const GateLive = Layer.unwrap(
  Effect.map(
    Pairs,
    ({ ci, main }) =>
      healthLayer({ health: Option.some(HEALTH), healthStandbys: {}, concurrencyLimits: {} }).pipe(
        Layer.provideMerge(
          ciClientLayer({
            ciDatabaseUrl: Option.some(Redacted.make(ci.primaryUrl)),
            embeddedCiDatabase: false,
            dataDir: ""
          })
        ),
        Layer.provideMerge(PgClient.layer({ url: Redacted.make(main.primaryUrl), maxConnections: 2 })),
        Layer.provideMerge(EventLogMemory),
        Layer.provideMerge(MemoryEvents.layer),
        Layer.provideMerge(MetricsPrometheus),
        Layer.orDie
      )
  )
)

const sleep = (ms: number) => Effect.promise(() => new Promise((resolve) => setTimeout(resolve, ms)))

/** Replay paused on the pair's standby and WAL written on its primary until the standby is past stop. */
const lagging = (pair: ReplicatedPostgres) =>
  Effect.gen(function*() {
    yield* Effect.promise(() => pair.pauseReplay())
    yield* Effect.promise(() =>
      pair.primary(
        "CREATE TABLE IF NOT EXISTS filler (pad text); INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 6000)"
      )
    )
    // With synchronous_commit off the WAL position goes on moving after the INSERT returns.
    for (let i = 0; i < 300 && (yield* Effect.promise(() => pair.lagBytes())) <= 1.5 * STOP; i++) yield* sleep(100)
    assert.isAbove(yield* Effect.promise(() => pair.lagBytes()), 1.5 * STOP)
  })

/** Replay resumed, until the standby has caught up (under resume). */
const caughtUp = (pair: ReplicatedPostgres) =>
  Effect.gen(function*() {
    yield* Effect.promise(() => pair.resumeReplay())
    for (let i = 0; i < 300 && (yield* Effect.promise(() => pair.lagBytes())) > 500_000; i++) yield* sleep(100)
    assert.isAtMost(yield* Effect.promise(() => pair.lagBytes()), 500_000)
  })

/** One unit's question, with two seconds to be let through. */
const ask = (batch: string) =>
  Effect.gen(function*() {
    const gate = yield* HealthGate
    const now = yield* Clock.currentTimeMillis
    const verdict = yield* gate.beforeUnit({ batch, deadlineMillis: now + 2_000 })
    return [verdict.proceed, verdict.heldBy] as const
  })

const heldOn = Effect.map(
  MemoryEvents,
  (events) => events.filter((e) => e.type === "RepairHeld").map((e) => [e.data.batch, e.data.signal, e.data.database])
)

layer(PairsLive, { excludeTestServices: true, timeout: "300 seconds" })(
  "health gate per database (two primaries, each with a streaming standby)",
  (it) => {
    it.effect("ci's standby behind holds drop-canceling-builds, not stuck-export-jobs; main's behind, the reverse", () =>
      Effect.gen(function*() {
        const { ci, main } = yield* Pairs
        yield* Effect.scoped(
          Effect.gen(function*() {
            assert.deepStrictEqual(yield* ask("drop-canceling-builds"), [true, []])
            assert.deepStrictEqual(yield* ask("stuck-export-jobs"), [true, []])

            yield* lagging(ci)
            assert.deepStrictEqual(yield* ask("stuck-export-jobs"), [true, []])
            assert.deepStrictEqual(yield* ask("drop-canceling-builds"), [false, ["replicationLag"]])
            assert.deepStrictEqual(yield* heldOn, [["drop-canceling-builds", "replicationLag", "ci"]])
            yield* caughtUp(ci)

            yield* lagging(main)
            assert.deepStrictEqual(yield* ask("drop-canceling-builds"), [true, []])
            assert.deepStrictEqual(yield* ask("stuck-export-jobs"), [false, ["replicationLag"]])
            assert.deepStrictEqual(yield* heldOn, [
              ["drop-canceling-builds", "replicationLag", "ci"],
              ["stuck-export-jobs", "replicationLag", "main"]
            ])
            yield* caughtUp(main)
          }).pipe(Effect.provide(GateLive))
        )
      }))

    it.effect("through the CLI: ci behind holds the drop run (RepairHeld on ci), stuck-export-jobs runs to its end", () =>
      Effect.scoped(Effect.gen(function*() {
        const { ci, main } = yield* Pairs
        yield* Effect.promise(() => Promise.all([main, ci].map((pair) => pair.primary(`CREATE DATABASE ${DATABASE}`))))
        const env = {
          DATABASE_URL: main.urlOf(DATABASE),
          CI_DATABASE_URL: ci.urlOf(DATABASE),
          REDIS_URL: yield* freshRedisUrl,
          SWEEPER_HEALTH: JSON.stringify({ replicationLag: { stop: "4MB", resume: "1MB" } })
        }
        const migrated = yield* Effect.promise(() => runCli(["migrate"], env))
        assert.strictEqual(migrated.code, 0, migrated.stderr)
        yield* seedStuckCancelingBuilds(STUCK).pipe(
          Effect.provide(PgClient.layer({ url: Redacted.make(ci.urlOf(DATABASE)), maxConnections: 1 }))
        )
        const gateEvents = () =>
          main.primary(
            `SELECT type, data->>'batch', data->>'database' FROM sweeper_events
             WHERE type IN ('RepairHeld', 'RepairReleased') ORDER BY id`,
            DATABASE
          )

        // Both runs start with ci's standby behind: the drop waits on it, stuck-export-jobs (main) does not.
        yield* lagging(ci)
        const drop = runCli(["run", "drop-canceling-builds", "--json"], env, 120_000)
        const exports = yield* Effect.promise(() => runCli(["run", "stuck-export-jobs", "--json"], env))
        assert.strictEqual(exports.code, 0, exports.stderr)
        yield* Effect.promise(() =>
          waitFor("the drop run held", async () => (await gateEvents()).length > 0 || undefined, 60_000)
        )
        assert.deepStrictEqual(yield* Effect.promise(gateEvents), [["RepairHeld", "drop-canceling-builds", "ci"]])

        yield* caughtUp(ci)
        const dropped = yield* Effect.promise(() => drop)
        assert.strictEqual(dropped.code, 0, `${dropped.stderr}\n${dropped.stdout}`)
        const summary = JSON.parse(dropped.stdout.trim().split("\n").at(-1)!) as { summary: { dropped: number } }
        assert.strictEqual(summary.summary.dropped, STUCK)
        assert.deepStrictEqual(yield* Effect.promise(gateEvents), [
          ["RepairHeld", "drop-canceling-builds", "ci"],
          ["RepairReleased", "drop-canceling-builds", "ci"]
        ])
      })))
  }
)
