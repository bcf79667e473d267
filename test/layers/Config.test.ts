/**
 * SweeperConfig from the environment: SWEEPER_DROP_BATCH_SIZE (drop-canceling-builds' page) is an
 * integer 1..10000, the seed's 100 when unset; anything else fails naming the variable (main.ts
 * turns InvalidConfig into one line and exit 2, as the CLI integration test shows for another
 * variable). The layer's value reaches the program as DropBatchSize.
 */
import { assert, describe, it } from "@effect/vitest"
import { ConfigProvider, Effect, Layer, Option } from "effect"
import { SweeperConfig, TuningFromConfig } from "../../src/config/Config.ts"
import { DropBatchSize } from "../../src/domain/Build.ts"
import { InvalidConfig } from "../../src/domain/Errors.ts"
import {
  CurrentFailureReasonSet,
  describeReasonSet,
  RunnerProvisioningTimeoutReason
} from "../../src/domain/StuckBuilds.ts"
import { CurrentTransitionQueues, DEFAULT_ROUTING } from "../../src/domain/TransitionJobs.ts"

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

describe("SWEEPER_TRANSITION_QUEUES and SWEEPER_RUNNER_PROVISIONING_TIMEOUT_REASON", () => {
  const tuning = (env: Record<string, string>) =>
    Effect.gen(function*() {
      const settings = yield* SweeperConfig
      return {
        queues: settings.transitionQueues,
        provided: yield* CurrentTransitionQueues,
        provisioning: yield* RunnerProvisioningTimeoutReason
      }
    }).pipe(
      Effect.provide(TuningFromConfig.pipe(Layer.provideMerge(SweeperConfig.layer))),
      Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromEnv({ env }))
    )

  it.effect("unset: every job on `default` (GitLab's default routing), the waiting-for-ack rule off", () =>
    Effect.gen(function*() {
      const loaded = yield* tuning({})
      assert.deepStrictEqual(loaded.queues, DEFAULT_ROUTING)
      assert.deepStrictEqual(loaded.provided, DEFAULT_ROUTING)
      assert.isTrue(Option.isNone(loaded.provisioning))
      assert.match(describeReasonSet("legacy"), /rule off \(SWEEPER_RUNNER_PROVISIONING_TIMEOUT_REASON unset\)/)
    }))

  it.effect("`worker`: each worker's own queue; a JSON object: those named, the rest on default", () =>
    Effect.gen(function*() {
      assert.deepStrictEqual((yield* tuning({ SWEEPER_TRANSITION_QUEUES: "worker" })).provided, {
        PipelineProcessWorker: "pipeline_processing:pipeline_process",
        "Ci::BuildFinishedWorker": "pipeline_processing:ci_build_finished",
        "Ci::ResourceGroups::AssignResourceFromResourceGroupWorker":
          "pipeline_processing:ci_resource_groups_assign_resource_from_resource_group"
      })
      const some = yield* tuning({ SWEEPER_TRANSITION_QUEUES: JSON.stringify({ PipelineProcessWorker: "pipelines" }) })
      assert.deepStrictEqual(some.provided, { ...DEFAULT_ROUTING, PipelineProcessWorker: "pipelines" })
    }))

  it.effect("the operator's integer for runner_provisioning_timeout is provided to the programs", () =>
    Effect.gen(function*() {
      const loaded = yield* tuning({ SWEEPER_RUNNER_PROVISIONING_TIMEOUT_REASON: "24" })
      assert.deepStrictEqual(loaded.provisioning, Option.some(24))
      assert.match(describeReasonSet("legacy", loaded.provisioning), /runner_provisioning_timeout \(24\)/)
    }))

  for (
    const [variable, bad] of [
      ["SWEEPER_TRANSITION_QUEUES", "routed"],
      ["SWEEPER_TRANSITION_QUEUES", JSON.stringify({ PipelineProcesWorker: "typo" })],
      ["SWEEPER_TRANSITION_QUEUES", JSON.stringify({ PipelineProcessWorker: "" })],
      ["SWEEPER_RUNNER_PROVISIONING_TIMEOUT_REASON", "runner_provisioning_timeout"],
      ["SWEEPER_RUNNER_PROVISIONING_TIMEOUT_REASON", "-1"]
    ] as const
  ) {
    it.effect(`${variable}=${bad} → InvalidConfig naming it`, () =>
      Effect.gen(function*() {
        const error = yield* Effect.flip(tuning({ [variable]: bad }))
        assert.instanceOf(error, InvalidConfig)
        assert.strictEqual(error.variable, variable)
      }))
  }
})
