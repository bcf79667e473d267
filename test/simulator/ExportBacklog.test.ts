/**
 * The demo's exports, as the simulator makes them (real PostgreSQL, the embedded Redis): workers
 * that die, parallel exports that die inside their 6 h grace, old parallel ones past it, healthy
 * ones. The console's stuck-export-jobs backlog (the sampler, as the dashboard shows it) is exactly
 * what a dry run of the batch would fail, never the parallel exports it leaves alone — which is
 * what made the demo show "backlog 10, oldest due 7 h ago" beside a run that skipped 7.
 */
import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect, Layer } from "effect"
import { SweeperConfig, TuningFromConfig } from "../../src/config/Config.ts"
import { CurrentRun } from "../../src/domain/Batch.ts"
import { ObjectStorageMemory } from "../../src/layers/memory/ObjectStorageMemory.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { StuckExportJobs } from "../../src/programs/StuckExportJobs.ts"
import { Backlog } from "../../src/services/Backlog.ts"
import { emptyLedger } from "../../src/simulator/Ledger.ts"
import { produce, SimulatorLive } from "../../src/simulator/Simulator.ts"
import { MemoryBackends, RepairSteps, SqlBackends } from "../../src/supervisor/App.ts"
import { BacklogLive } from "../../src/views/Backlog.ts"
import { PgTest } from "../support/postgres.ts"

const Platform = Layer.mergeAll(BacklogLive, SimulatorLive).pipe(
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

describe("the simulator's exports: backlog = what a dry run would fail", () => {
  it.live(
    "the console's export backlog counts exactly the jobs a dry run fails, no parallel export in its grace",
    () =>
      Effect.gen(function*() {
        const ledger = emptyLedger()
        yield* produce(
          { scenarios: ["exports"], rate: 10, tick: Duration.millis(200), duration: Duration.millis(500) },
          ledger
        )
        const snapshot = yield* (yield* Backlog).refresh
        const backlog = snapshot.batches.find((b) => b.batch === StuckExportJobs.name)!
        const defaults = yield* CurrentRun
        const dry = yield* StuckExportJobs.run.pipe(Effect.provideService(CurrentRun, { ...defaults, dryRun: true }))
        console.log(`simulated exports: backlog ${backlog.count}, dry run ${JSON.stringify(dry)}`)
        assert.isAbove(dry.skippedParallel, 0, "the demo's parallel exports in their grace")
        assert.strictEqual(dry.failed, ledger.exports.stuck.length)
        assert.deepInclude(backlog, { count: dry.failed, capped: false, error: null })
      }).pipe(Effect.provide(Platform)),
    60_000
  )
})
