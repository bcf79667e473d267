/**
 * SweeperConfig from the environment: SWEEPER_DROP_BATCH_SIZE (drop-canceling-builds' page) is an
 * integer 1..10000, the seed's 100 when unset; anything else fails naming the variable (main.ts
 * turns InvalidConfig into one line and exit 2, as the CLI integration test shows for another
 * variable). The layer's value reaches the program as DropBatchSize.
 */
import { assert, describe, it } from "@effect/vitest"
import { ConfigProvider, Effect, Layer } from "effect"
import { SweeperConfig, TuningFromConfig } from "../../src/config/Config.ts"
import { DropBatchSize } from "../../src/domain/Build.ts"
import { InvalidConfig } from "../../src/domain/Errors.ts"
import { CurrentFailureReasonSet, describeReasonSet } from "../../src/domain/StuckBuilds.ts"

const load = (env: Record<string, string>) =>
  Effect.gen(function*() {
    const settings = yield* SweeperConfig
    const pageSize = yield* DropBatchSize
    return { dropBatchSize: settings.dropBatchSize, pageSize }
  }).pipe(
    Effect.provide(TuningFromConfig.pipe(Layer.provideMerge(SweeperConfig.layer))),
    Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromEnv({ env }))
  )

describe("SWEEPER_DROP_BATCH_SIZE", () => {
  it.effect("unset: the seed's 100", () =>
    Effect.gen(function*() {
      assert.deepStrictEqual(yield* load({}), { dropBatchSize: 100, pageSize: 100 })
    }))

  it.effect("set: honoured, and provided to the program as DropBatchSize", () =>
    Effect.gen(function*() {
      assert.deepStrictEqual(yield* load({ SWEEPER_DROP_BATCH_SIZE: "1000" }), { dropBatchSize: 1000, pageSize: 1000 })
      assert.deepStrictEqual(yield* load({ SWEEPER_DROP_BATCH_SIZE: "1" }), { dropBatchSize: 1, pageSize: 1 })
      assert.deepStrictEqual(yield* load({ SWEEPER_DROP_BATCH_SIZE: "10000" }), {
        dropBatchSize: 10000,
        pageSize: 10000
      })
    }))

  for (const bad of ["0", "-5", "10001", "2.5", "many"]) {
    it.effect(`${JSON.stringify(bad)} → InvalidConfig naming SWEEPER_DROP_BATCH_SIZE`, () =>
      Effect.gen(function*() {
        const error = yield* Effect.flip(load({ SWEEPER_DROP_BATCH_SIZE: bad }))
        assert.instanceOf(error, InvalidConfig)
        assert.strictEqual(error.variable, "SWEEPER_DROP_BATCH_SIZE")
      }))
  }
})

describe("SWEEPER_FAILURE_REASONS", () => {
  const reasons = (env: Record<string, string>) =>
    Effect.gen(function*() {
      const settings = yield* SweeperConfig
      return { setting: settings.failureReasons, provided: yield* CurrentFailureReasonSet }
    }).pipe(
      Effect.provide(TuningFromConfig.pipe(Layer.provideMerge(SweeperConfig.layer))),
      Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromEnv({ env }))
    )

  it.effect("unset: the legacy set (stuck_or_timeout_failure); gitlab-19 honoured and provided to the programs", () =>
    Effect.gen(function*() {
      assert.deepStrictEqual(yield* reasons({}), { setting: "legacy", provided: "legacy" })
      assert.deepStrictEqual(yield* reasons({ SWEEPER_FAILURE_REASONS: "gitlab-19" }), {
        setting: "gitlab-19",
        provided: "gitlab-19"
      })
      assert.match(describeReasonSet("legacy"), /stuck_or_timeout_failure \(3\)/)
      assert.match(describeReasonSet("gitlab-19"), /stuck_pending_no_matching_runners \(26\)/)
    }))

  it.effect("anything else → InvalidConfig naming SWEEPER_FAILURE_REASONS", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(reasons({ SWEEPER_FAILURE_REASONS: "19" }))
      assert.instanceOf(error, InvalidConfig)
      assert.strictEqual(error.variable, "SWEEPER_FAILURE_REASONS")
    }))
})
