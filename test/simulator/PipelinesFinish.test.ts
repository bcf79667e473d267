/**
 * The demo's builds end to end, on the production layers (real PostgreSQL, the embedded Redis): the
 * simulator's pipelines hold stuck builds beside a finished one, or only healthy builds; the four
 * drop batches fail the stuck ones, their after-transition jobs are relayed to the queue, and the
 * simulator's stand-in for GitLab's PipelineProcessWorker finishes every stuck pipeline (failed),
 * while the healthy pipelines are never processed and stay running. Each dropped build also gets its
 * one Ci::BuildFinishedWorker; its runner-queue rows are gone.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect, Fiber, Layer, Option } from "effect"
import { SweeperConfig, TuningFromConfig } from "../../src/config/Config.ts"
import { CurrentRun } from "../../src/domain/Batch.ts"
import { ObjectStorageMemory } from "../../src/layers/memory/ObjectStorageMemory.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { DropCancelingBuilds } from "../../src/programs/DropCancelingBuilds.ts"
import { DropPendingBuilds } from "../../src/programs/DropPendingBuilds.ts"
import { DropRunningBuilds } from "../../src/programs/DropRunningBuilds.ts"
import { DropScheduledBuilds } from "../../src/programs/DropScheduledBuilds.ts"
import { emptyLedger } from "../../src/simulator/Ledger.ts"
import { consume, produce, SimulatorLive } from "../../src/simulator/Simulator.ts"
import { MemoryBackends, RepairSteps, SqlBackends } from "../../src/supervisor/App.ts"
import { PgTest } from "../support/postgres.ts"

const Platform = SimulatorLive.pipe(
  Layer.provideMerge(RepairSteps),
  Layer.provideMerge(
    Layer.mergeAll(
      SqlBackends.pipe(Layer.provideMerge(MemoryBackends), Layer.provideMerge(MetricsPrometheus)),
      ObjectStorageMemory(),
      TuningFromConfig,
      MetricsPrometheus
    )
  ),
  Layer.provideMerge(SweeperConfig.layerWith({})),
  Layer.provideMerge(PgTest)
)

describe("the simulator's pipelines", () => {
  it.live(
    "a dropped build's pipeline finishes (GitLab's worker played), healthy pipelines stay running",
    () =>
      Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        const ledger = emptyLedger()
        const options = { scenarios: ["builds"] as const, rate: 2, tick: Duration.millis(200) }
        yield* produce({ ...options, duration: Duration.millis(300) }, ledger)
        assert.isAtLeast(ledger.pipelines.stuck.length, 1)
        const consumer = yield* Effect.forkChild(consume(options, ledger))
        const run = (batch: string) =>
          Effect.provideService(CurrentRun, {
            runId: null,
            batch,
            dryRun: false,
            budget: Option.none(),
            fence: Option.none()
          })
        yield* DropCancelingBuilds.run.pipe(run(DropCancelingBuilds.name))
        yield* DropPendingBuilds.run.pipe(run(DropPendingBuilds.name))
        yield* DropRunningBuilds.run.pipe(run(DropRunningBuilds.name))
        yield* DropScheduledBuilds.run.pipe(run(DropScheduledBuilds.name))
        // The relay runs beside the drops and the consumer polls: a loaded machine may take seconds.
        for (let i = 0; i < 600; i++) {
          const finished = ledger.pipelines.stuck.every((id) => ledger.pipelines.status[id] === "failed")
          const built = ledger.builds.stuck.every((id) => ledger.transitionJobs.buildFinished[id] !== undefined)
          if (finished && built) break
          yield* Effect.sleep("50 millis")
        }
        yield* Fiber.interrupt(consumer)

        const pipelines = yield* sql<{ id: string; status: string; finished: boolean }>`
          SELECT id::text, status, finished_at IS NOT NULL AS finished FROM ci_pipelines ORDER BY id`
        const statusOf = new Map(pipelines.map((p) => [Number(p.id), [p.status, p.finished]]))
        for (const id of ledger.pipelines.stuck) {
          assert.deepStrictEqual([id, ...statusOf.get(id)!], [id, "failed", true])
        }
        for (const id of ledger.pipelines.healthy) {
          assert.deepStrictEqual([id, ...statusOf.get(id)!], [id, "running", false])
          assert.isUndefined(ledger.pipelines.processed[id], "no drop, no processing")
        }
        // Every dropped build finished once in GitLab's eyes; the queue rows of dropped builds are gone.
        assert.deepStrictEqual(
          Object.keys(ledger.transitionJobs.buildFinished).map(Number).toSorted((a, b) => a - b),
          [...ledger.builds.stuck].toSorted((a, b) => a - b)
        )
        assert.isTrue(Object.values(ledger.transitionJobs.buildFinished).every((n) => n === 1))
        const [left] = yield* sql<{ pending: string; running: string }>`SELECT
          (SELECT count(*) FROM ci_pending_builds WHERE build_id IN ${sql.in(ledger.builds.stuck)}) AS pending,
          (SELECT count(*) FROM ci_running_builds WHERE build_id IN ${sql.in(ledger.builds.stuck)}) AS running`
        assert.deepStrictEqual([Number(left!.pending), Number(left!.running)], [0, 0])
        assert.strictEqual(ledger.unknownJobs, 0)
      }).pipe(Effect.provide(Platform)),
    60_000
  )
})
