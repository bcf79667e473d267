/**
 * A relative rule's baseline (the median of up to an hour of samples: a copy and a sort) is
 * computed once per sampler round, never per unit asking the gate or per client reading its report:
 * with a batch asking before every page and every console tab reading the report each second, a
 * per-call median would cost far more than the readings themselves.
 */
import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect, Layer, Schema } from "effect"
import { TestClock } from "effect/testing"
import { afterEach, vi } from "vitest"
import * as Health from "../../src/domain/Health.ts"
import { HealthJson } from "../../src/domain/HealthConfig.ts"
import { type GatedBatch, HealthGateLive } from "../../src/layers/health/HealthGateLive.ts"
import { EventLogMemory, MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import { HealthSignalsMemory, MemorySignalValues } from "../../src/layers/memory/HealthSignalsMemory.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { HealthGate } from "../../src/services/HealthGate.ts"
import { HealthReport } from "../../src/services/HealthReport.ts"

// The gate's own import of the domain's median, wrapped so the test can count its calls.
vi.mock("../../src/domain/Health.ts", async (importOriginal) => {
  const actual = await importOriginal<typeof import("../../src/domain/Health.ts")>()
  return { ...actual, ruleBaseline: vi.fn(actual.ruleBaseline) }
})

const DROP: GatedBatch = { name: "drop-canceling-builds", writes: { tables: ["ci_builds", "sweeper_events"] } }

const Gate = HealthGateLive({
  config: Schema.decodeUnknownSync(HealthJson)(JSON.stringify({ walRate: { stop: "3x" } })),
  batches: [DROP],
  concurrencyLimits: {}
}).pipe(
  Layer.provideMerge(HealthSignalsMemory),
  Layer.provideMerge(MemorySignalValues.layer),
  Layer.provideMerge(EventLogMemory),
  Layer.provideMerge(MemoryEvents.layer),
  Layer.provideMerge(MetricsPrometheus)
)

const baselineCalls = () => vi.mocked(Health.ruleBaseline).mock.calls.length

describe("HealthGate's relative baselines", () => {
  afterEach(() => vi.mocked(Health.ruleBaseline).mockClear())

  it.effect("are computed once per sampler round, not per unit or per report reader", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const report = yield* HealthReport
      const values = yield* MemorySignalValues
      // Ten minutes of rounds at a steady 10 MB/s: the baseline is warmed up.
      for (let i = 1; i <= 600; i++) {
        values.walPosition = i * 10e6
        yield* TestClock.adjust(Duration.seconds(1))
      }
      assert.strictEqual((yield* report.snapshot).signals[0]!.stop, "3x median (30 MB/s)")

      // Within one round: a hundred units ask and fifty readers read; nothing is recomputed.
      vi.mocked(Health.ruleBaseline).mockClear()
      for (let i = 0; i < 100; i++) yield* gate.beforeUnit({ batch: DROP.name, deadlineMillis: 0 })
      for (let i = 0; i < 50; i++) yield* report.snapshot
      assert.strictEqual(baselineCalls(), 0)

      // The next round computes it once (one relative rule, one subject).
      values.walPosition = 601 * 10e6
      yield* TestClock.adjust(Duration.seconds(1))
      assert.strictEqual(baselineCalls(), 1)
    }).pipe(Effect.provide(Gate)))
})
