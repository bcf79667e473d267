/**
 * The production layers a Sweeper phase runs on (supervisor/App.ts's SQL and Redis backends over the
 * phase's fresh database and Redis db), and running one batch through the run guard on them.
 */
import { Data, type Duration, Effect, Layer, Option, Redacted } from "effect"
import { performance } from "node:perf_hooks"
import { SweeperConfig, type SweeperSettings, TuningFromConfig } from "../../src/config/Config.ts"
import type { Batch } from "../../src/domain/Batch.ts"
import { ObjectStorageLocal } from "../../src/layers/objectStorage/ObjectStorageLocal.ts"
import { SingleDatabase } from "../../src/layers/postgres/Databases.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { healthLayer, RedisBackends, RepairSteps, SqlBackends } from "../../src/supervisor/App.ts"
import { startingAt } from "../../src/supervisor/Clocks.ts"
import { runBatch, type RunResult } from "../../src/supervisor/RunGuard.ts"
import type { PhaseContext } from "../support/compare.ts"
import { migratedDatabase } from "../support/harness.ts"
import { BenchLogging } from "../support/logging.ts"
import { spansEnabled, takeSpanReport, tallyTracer } from "../support/spans.ts"

export const sweeperPlatform = (context: PhaseContext, settings: Partial<SweeperSettings> = {}) => {
  // The sweeper+gate phase: the health gate as the composition root provides it (App.ts).
  const all = {
    node: "bench",
    ...settings,
    ...(context.health === undefined ? {} : { health: Option.some(context.health) })
  }
  const config = SweeperConfig.layerWith(all)
  const roots = settings.objectStorage?._tag === "Local" ? settings.objectStorage.roots : {}
  const redis = Redacted.make(context.redisUrl)
  // One database (ci in main): the gate reads every PostgreSQL signal there, as main.
  const gate = healthLayer({
    health: all.health ?? Option.none(),
    healthStandbys: all.healthStandbys ?? {},
    concurrencyLimits: all.concurrencyLimits ?? {}
  })
    .pipe(Layer.provide(SingleDatabase))
  return Layer.merge(gate, RepairSteps).pipe(
    Layer.provideMerge(
      Layer.mergeAll(
        // The drops push their after-transition jobs through the Redis-backed JobQueue.
        SqlBackends.pipe(
          Layer.provideMerge(RedisBackends({ sharedState: redis, queues: redis, queuesMetadata: redis })),
          Layer.provideMerge(MetricsPrometheus)
        ),
        ObjectStorageLocal(roots),
        TuningFromConfig,
        MetricsPrometheus
      )
    ),
    Layer.provideMerge(Layer.mergeAll(migratedDatabase(context.databaseUrl), config)),
    Layer.orDie
  )
}

export interface RunOnceOptions {
  readonly now?: Date
  readonly budget?: Duration.Duration
  readonly settings?: Partial<SweeperSettings>
}

/**
 * Manual runs of batches (no dry run) on the production layers, built once for all of them, each
 * timed without the layers' set-up; the clock at `now` when given; logging as in production (Info,
 * JSON lines: support/logging.ts).
 */
export const withSweeper = <A, E>(
  context: PhaseContext,
  options: RunOnceOptions,
  use: (
    run: (
      batch: Batch<unknown, unknown, any>
    ) => Effect.Effect<{ readonly result: RunResult; readonly seconds: number }>
  ) => Effect.Effect<A, E>
) =>
  Effect.gen(function*() {
    const services = yield* Layer.build(sweeperPlatform(context, options.settings))
    const run = (batch: Batch<unknown, unknown, any>) =>
      Effect.gen(function*() {
        const start = performance.now()
        const guarded = runBatch(batch, { trigger: "manual", budget: options.budget })
        const result = yield* (options.now === undefined ? guarded : guarded.pipe(startingAt(options.now)))
        return { result, seconds: (performance.now() - start) / 1000 }
      }).pipe(Effect.provide(services), Effect.provide(BenchLogging)) as Effect.Effect<
        { readonly result: RunResult; readonly seconds: number }
      >
    return yield* use(run)
  }).pipe(
    Effect.scoped,
    // BENCH_SPANS=1: where the run's time goes, by span (support/spans.ts), the layers' fibers included.
    (effect) =>
      spansEnabled
        ? effect.pipe(
          Effect.withTracer(tallyTracer),
          Effect.ensuring(Effect.sync(() => console.log(takeSpanReport().map((line) => `    ${line}`).join("\n"))))
        )
        : effect
  )

/** One run of `batch`: its summary (failing the phase unless it succeeded) and its wall time. */
export const runOnce = (batch: Batch<unknown, unknown, any>, context: PhaseContext, options: RunOnceOptions = {}) =>
  withSweeper(
    context,
    options,
    (run) =>
      Effect.flatMap(
        run(batch),
        ({ result, seconds }) => Effect.map(succeeded(result), (summary) => ({ summary, seconds }))
      )
  )

/** A measured run that did not succeed. */
export class RunNotSucceeded extends Data.TaggedError("RunNotSucceeded")<{ readonly message: string }> {}

/** Fails the phase loudly when the run did not succeed: a failed run's rate means nothing. */
export const succeeded = (result: RunResult) =>
  result.outcome === "succeeded"
    ? Effect.succeed(result.summary as Record<string, unknown>)
    : Effect.fail(
      new RunNotSucceeded({ message: `run ${result.outcome}: ${result.reason ?? ""} ${result.error ?? ""}` })
    )
