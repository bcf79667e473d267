/**
 * Soak: a real supervisor process on real PostgreSQL and Redis, every batch on a seconds cron, and
 * the simulator playing GitLab beside it for SWEEPER_SOAK_SECONDS (default 45). When the simulator
 * stops making things and everything it made has settled, the ledger is held against the event log:
 * - every stuck thing is repaired exactly once (its repair event exists once, its row/key changed);
 * - every healthy control is untouched (no event on its stream, row/key as seeded);
 * - no limited worker ever ran above its limit, and every throttled job ran exactly once;
 * - every run the supervisor recorded succeeded.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect, Fiber, Layer, Redacted } from "effect"
import { existsSync, mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { SweeperConfig } from "../../src/config/Config.ts"
import { workerKeys } from "../../src/domain/ConcurrencyLimit.ts"
import { PENDING_DIRECT_UPLOADS_KEY } from "../../src/domain/DirectUpload.ts"
import { RUNNING_REBALANCES_KEY } from "../../src/domain/Rebalancing.ts"
import { cronVariable } from "../../src/domain/Schedule.ts"
import { emptyLedger, ledgerCounts } from "../../src/simulator/Ledger.ts"
import { consume, produce, SCENARIOS, type SimulateOptions, SimulatorLive } from "../../src/simulator/Simulator.ts"
import { SimulatorStores } from "../../src/simulator/Stores.ts"
import { RedisBackends } from "../../src/supervisor/App.ts"
import { PgTest, TestDatabaseUrl } from "../support/postgres.ts"
import { startSweeper } from "../support/processes.ts"
import { freshRedisUrlOn, redisServer } from "../support/redis.ts"

const SECONDS = Number(process.env.SWEEPER_SOAK_SECONDS ?? "45")
const WORKER = "Releases::CreateEvidenceWorker"
const LIMIT = 2

describe("soak: supervisor + simulator on real servers", () => {
  it.live(
    `${SECONDS}s of simulated GitLab: every stuck thing repaired exactly once, nothing healthy touched, no worker above its limit`,
    () =>
      Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        const databaseUrl = yield* TestDatabaseUrl
        const redisUrl = yield* freshRedisUrlOn(redisServer)
        const dir = mkdtempSync(join(tmpdir(), "sweeper-soak-"))
        yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(dir, { recursive: true, force: true })))
        const uploadsRoot = join(dir, "objects", "uploads")
        const limits = { [WORKER]: { limit: LIMIT, queue: "default" } }

        const supervisor = startSweeper("soak", {
          DATABASE_URL: databaseUrl,
          REDIS_URL: redisUrl,
          SWEEPER_DATA_DIR: join(dir, "data"),
          SWEEPER_OBJECT_STORAGE: JSON.stringify({ uploads: uploadsRoot }),
          SWEEPER_CONCURRENCY_LIMITS: JSON.stringify(limits),
          [cronVariable("stuck-export-jobs")]: "*/3 * * * * *",
          [cronVariable("drop-canceling-builds")]: "*/3 * * * * *",
          [cronVariable("drop-pending-builds")]: "*/3 * * * * *",
          [cronVariable("drop-running-builds")]: "*/3 * * * * *",
          [cronVariable("drop-scheduled-builds")]: "*/3 * * * * *",
          [cronVariable("delete-stale-direct-uploads")]: "*/3 * * * * *",
          [cronVariable("reschedule-stuck-issue-rebalances")]: "*/4 * * * * *",
          [cronVariable("concurrency-limit-resume")]: "* * * * * *"
        })
        yield* Effect.addFinalizer(() =>
          Effect.promise(async () => {
            if (supervisor.child.exitCode === null && supervisor.child.signalCode === null) {
              supervisor.child.kill("SIGKILL")
            }
            await supervisor.exited
          })
        )
        yield* Effect.promise(() => supervisor.listening)

        const ledger = emptyLedger()
        const options: SimulateOptions = {
          scenarios: SCENARIOS,
          rate: 2,
          duration: Duration.seconds(SECONDS),
          jobDuration: Duration.millis(500)
        }
        const url = Redacted.make(redisUrl)
        const simulatorLayer = SimulatorLive.pipe(
          Layer.provideMerge(RedisBackends({ sharedState: url, queues: url, queuesMetadata: url })),
          Layer.provideMerge(
            SweeperConfig.layerWith({
              objectStorage: { _tag: "Local", roots: { uploads: uploadsRoot } },
              concurrencyLimits: limits
            })
          ),
          Layer.orDie
        )

        yield* Effect.gen(function*() {
          const stores = yield* SimulatorStores
          const consumer = yield* Effect.forkChild(consume(options, ledger))
          yield* produce(options, ledger)

          // Settled: every stuck thing repaired and every throttled job run (or the wait times out).
          const settled = Effect.gen(function*() {
            const [exports] = yield* sql<{ n: string }>`SELECT count(*) AS n FROM project_export_jobs WHERE id IN ${
              sql.in(ledger.exports.stuck)
            } AND status <> 3`
            const [builds] = yield* sql<{ n: string }>`SELECT count(*) AS n FROM ci_builds WHERE id IN ${
              sql.in(ledger.builds.stuck)
            } AND status <> 'failed'`
            let uploads = 0
            for (
              const field of ledger.uploads.stuck
            ) if (yield* stores.hexists("sharedState", PENDING_DIRECT_UPLOADS_KEY, field)) uploads++
            const running = (yield* stores.smembers("sharedState", RUNNING_REBALANCES_KEY)).length
            const deferred = yield* stores.llen("sharedState", workerKeys(WORKER).deferred)
            const ran = Object.values(ledger.throttled.ran).reduce((a, b) => a + b, 0)
            return {
              exports: Number(exports!.n),
              builds: Number(builds!.n),
              uploads,
              running,
              deferred,
              unran: ledger.throttled.pushed.length - ran
            }
          })
          let last = yield* settled
          const deadline = Date.now() + 90_000
          while (Object.values(last).some((n) => n > 0) && Date.now() < deadline) {
            yield* Effect.sleep("1 second")
            last = yield* settled
          }
          yield* Fiber.interrupt(consumer)
          console.log(
            `soak: made ${JSON.stringify(ledgerCounts(ledger))}; unsettled at the end: ${JSON.stringify(last)}`
          )
          assert.deepStrictEqual(
            last,
            { exports: 0, builds: 0, uploads: 0, running: 0, deferred: 0, unran: 0 },
            "everything settled"
          )

          // The simulator made real work of every kind.
          assert.isAtLeast(ledger.exports.stuck.length, 4)
          assert.isAtLeast(ledger.builds.stuck.length, 10)
          assert.isAtLeast(ledger.uploads.stuck.length, 10)
          assert.isAtLeast(ledger.rebalances.stalled.length, 5)
          assert.isAbove(ledger.throttled.deferred, 0)
          assert.isAbove(ledger.throttled.resumedRan, 0)

          const eventsPerStream = Effect.fn(function*(type: string, extra = sql``) {
            const rows = yield* sql<
              { stream: string; n: string }
            >`SELECT stream, count(*) AS n FROM sweeper_events WHERE type = ${type} ${extra} GROUP BY stream`
            return new Map(rows.map((row) => [row.stream, Number(row.n)]))
          })
          const exactlyOnce = (kind: string, events: Map<string, number>, streams: ReadonlyArray<string>) => {
            const wrong = streams.filter((stream) => events.get(stream) !== 1).map((stream) =>
              `${stream}: ${events.get(stream) ?? 0}`
            )
            assert.deepStrictEqual(wrong, [], `${kind}: every stuck thing repaired exactly once`)
          }
          const untouched = (
            kind: string,
            events: ReadonlyArray<Map<string, number>>,
            streams: ReadonlyArray<string>
          ) => {
            const touched = streams.filter((stream) => events.some((e) => e.has(stream)))
            assert.deepStrictEqual(touched, [], `${kind}: no healthy control touched`)
          }

          // Exports: the dead ones failed once; finished, running and young parallel ones left alone.
          const failedExports = yield* eventsPerStream("ExportJobFailed")
          exactlyOnce("exports", failedExports, ledger.exports.stuck.map((id) => `export_job:${id}`))
          untouched("exports", [failedExports], ledger.exports.healthy.map((id) => `export_job:${id}`))
          const [healthyFailed] = yield* sql<{ n: string }>`SELECT count(*) AS n FROM project_export_jobs WHERE id IN ${
            sql.in(ledger.exports.healthy)
          } AND status = 3`
          assert.strictEqual(Number(healthyFailed!.n), 0)

          // Builds: the stuck ones dropped once (stuck_or_timeout_failure); recent/running left alone.
          const dropped = yield* eventsPerStream("BuildDropped")
          const doomed = yield* eventsPerStream("BuildDoomed")
          exactlyOnce("builds", dropped, ledger.builds.stuck.map((id) => `build:${id}`))
          untouched("builds", [dropped, doomed], ledger.builds.healthy.map((id) => `build:${id}`))
          // Each failed with its rule's reason, as its event says: stale_schedule (7) for a delayed
          // build (its scheduled_at cleared by the drop, as GitLab's transition clears it),
          // runner_provisioning_timeout (24 when the operator names it so; the rule is off
          // otherwise) when the waiting-for-ack rule reached it first (an old pending build the
          // simulator wrote behind the outdated walk's cursor qualifies for both, as in GitLab),
          // stuck_or_timeout_failure (3) otherwise.
          const [wrongReason] = yield* sql<{ n: string }>`SELECT count(*) AS n FROM ci_builds b WHERE id IN ${
            sql.in(ledger.builds.stuck)
          } AND NOT EXISTS (SELECT FROM sweeper_events e
            WHERE e.stream = 'build:' || b.id AND e.type = 'BuildDropped'
              AND (e.data->>'failure_reason')::int = b.failure_reason
              AND b.failure_reason = CASE WHEN e.data->>'rule' = 'scheduled_outdated' THEN 7
                WHEN e.data->>'rule' = 'pending_waiting_for_ack' THEN 24 ELSE 3 END)`
          assert.strictEqual(Number(wrongReason!.n), 0)
          const [healthyChanged] = yield* sql<{ n: string }>`SELECT count(*) AS n FROM ci_builds WHERE id IN ${
            sql.in(ledger.builds.healthy)
          } AND (status = 'failed' OR lock_version <> 0)`
          assert.strictEqual(Number(healthyChanged!.n), 0)

          // Uploads: stale entries deleted once with their objects; fresh ones and their objects kept.
          const deleted = yield* eventsPerStream("StaleDirectUploadDeleted")
          exactlyOnce("uploads", deleted, ledger.uploads.stuck.map((field) => `direct_upload:${field}`))
          untouched("uploads", [deleted], ledger.uploads.healthy.map((field) => `direct_upload:${field}`))
          assert.lengthOf(ledger.uploads.objects, ledger.uploads.stuck.length, "every stale upload had its object")
          assert.deepStrictEqual(ledger.uploads.objects.filter(existsSync), [], "stale objects deleted")
          for (const field of ledger.uploads.healthy) {
            assert.isTrue(yield* stores.hexists("sharedState", PENDING_DIRECT_UPLOADS_KEY, field), field)
            assert.isTrue(existsSync(join(uploadsRoot, field.slice("uploads:".length))), `object of ${field}`)
          }

          // Rebalances: each stalled one rescheduled once (not as a duplicate) and run once, for real.
          const rescheduled = yield* eventsPerStream("RebalanceRescheduled", sql`AND data->>'duplicate' = 'false'`)
          exactlyOnce("rebalances", rescheduled, ledger.rebalances.stalled.map((member) => `rebalance:${member}`))
          assert.deepStrictEqual(
            ledger.rebalances.stalled.filter((member) => ledger.rebalances.ran[member] !== 1),
            [],
            "each stalled rebalance ran exactly once"
          )
          // Seeded with ties and nulls: after a rebalance every issue has its own position.
          const unbalanced = yield* sql<{ project_id: string }>`
          SELECT project_id FROM issues WHERE project_id IN (SELECT id FROM projects WHERE name LIKE 'simulator-%-r%')
          GROUP BY project_id HAVING count(relative_position) <> count(*) OR count(DISTINCT relative_position) <> count(*)`
          assert.deepStrictEqual(unbalanced, [], "every stalled project's issues rebalanced")

          // Throttled: never above the limit, every job ran exactly once, the resumes were recorded.
          assert.isAtMost(ledger.throttled.maxExecuting[WORKER] ?? 0, LIMIT, "no resumed job above its limit")
          const twice = Object.entries(ledger.throttled.ran).filter(([, n]) => n !== 1)
          assert.deepStrictEqual(twice, [], "every throttled job ran exactly once")
          const [resumedEvents] = yield* sql<
            { n: string | null }
          >`SELECT sum((data->>'count')::int) AS n FROM sweeper_events WHERE type = 'ConcurrencyLimitJobsResumed'`
          assert.strictEqual(
            Number(resumedEvents!.n),
            ledger.throttled.resumedRan,
            "one resume recorded per resumed job"
          )

          // And every run the supervisor recorded succeeded (or was skipped: a lease held by a run still going).
          const badRuns = yield* sql<{ stream: string; outcome: string }>`
          SELECT stream, data->>'outcome' AS outcome FROM sweeper_events WHERE type = 'RunFinished' AND data->>'outcome' NOT IN ('succeeded', 'skipped')`
          assert.deepStrictEqual(badRuns, [])
        }).pipe(Effect.provide(simulatorLayer))

        supervisor.child.kill("SIGTERM")
        const code = yield* Effect.promise(() => supervisor.exited)
        assert.strictEqual(code, 0, supervisor.output().slice(-4000))
      }).pipe(Effect.provide(PgTest), Effect.scoped),
    (SECONDS + 180) * 1000
  )
})
