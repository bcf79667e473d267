/**
 * A relative `walRate`'s baseline keeps learning while batches of this process write: Sweeper's own
 * WAL (what its passes and pages wrote, measured by the gate around each write) is taken out of a
 * sample instead of the sample being skipped, and samples older than the window are forgotten on every
 * round. Under TestClock over in-memory signals, with the repair loop's own drivers writing.
 */
import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect, Fiber, Layer, Option, Schema } from "effect"
import { TestClock } from "effect/testing"
import { HealthJson } from "../../src/domain/HealthConfig.ts"
import { type GatedBatch, HealthGateLive } from "../../src/layers/health/HealthGateLive.ts"
import { EventLogMemory, MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import { HealthSignalsMemory, MemorySignalValues } from "../../src/layers/memory/HealthSignalsMemory.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { passes } from "../../src/repair/RepairLoop.ts"
import { HealthGate } from "../../src/services/HealthGate.ts"
import { HealthReport } from "../../src/services/HealthReport.ts"

const DROP: GatedBatch = { name: "drop-canceling-builds", writes: { tables: ["ci_builds", "sweeper_events"] } }
const RESUME: GatedBatch = {
  name: "concurrency-limit-resume",
  writes: { tables: ["sweeper_events"], redisStores: ["queues"] }
}

const Gate = HealthGateLive({
  config: Schema.decodeUnknownSync(HealthJson)(JSON.stringify({ walRate: { stop: "3x" } })),
  batches: [DROP, RESUME],
  concurrencyLimits: {}
}).pipe(
  Layer.provideMerge(HealthSignalsMemory),
  Layer.provideMerge(MemorySignalValues.layer),
  Layer.provideMerge(EventLogMemory),
  Layer.provideMerge(MemoryEvents.layer),
  Layer.provideMerge(MetricsPrometheus)
)

const MB = 1_000_000

/** The database's WAL position, moved by the platform (each second) and by Sweeper's passes. */
const wal = Effect.gen(function*() {
  const values = yield* MemorySignalValues
  let position = 0
  values.walPosition = position
  const write = (bytes: number) => {
    position += bytes
    values.walPosition = position
  }
  /** `seconds` of the platform writing `rate` bytes a second. */
  const platform = (rate: number, seconds: number) =>
    Effect.gen(function*() {
      for (let i = 0; i < seconds; i++) {
        write(rate)
        yield* TestClock.adjust(Duration.seconds(1))
      }
    })
  return { write, platform }
})

/**
 * concurrency-limit-resume's passes, one a second, each writing `bytes` of WAL of its own; `busy`: each
 * pass writes for a whole second and the next starts at once (pages back to back).
 */
const resumePasses = (write: (bytes: number) => void, bytes: number, busy = false) =>
  passes({
    batch: RESUME.name,
    budget: Duration.hours(3),
    delay: Duration.seconds(1),
    pass: () =>
      Effect.gen(function*() {
        write(bytes)
        if (busy) yield* Effect.sleep(Duration.seconds(1))
        return Option.some(null)
      }),
    next: () => busy ? "now" as const : "wait" as const
  }).pipe(Effect.forkChild)

/** drop-canceling-builds asks the gate once; its deadline already passed, so a hold answers at once. */
const dropHeldBy = Effect.gen(function*() {
  const gate = yield* HealthGate
  return (yield* gate.beforeUnit({ batch: DROP.name, deadlineMillis: 0 })).heldBy
})

const walStop = Effect.map(
  Effect.flatMap(HealthReport, (report) => report.snapshot),
  (snapshot) => snapshot.signals.find((s) => s.signal === "walRate" && s.subject === "main")!.stop
)

describe("walRate's relative baseline", () => {
  it.effect("learns through twenty minutes of resume passes, and a 10x burst then holds drop-canceling-builds", () =>
    Effect.gen(function*() {
      const { platform, write } = yield* wal
      const resume = yield* resumePasses(write, 5 * MB)
      // The platform at 10 MB/s, every second of it while the passes write 5 MB each of their own.
      yield* platform(10 * MB, 20 * 60)
      assert.strictEqual(yield* walStop, "3x median (30 MB/s)")
      // Ten times the normal rate.
      yield* platform(100 * MB, 3)
      assert.deepStrictEqual(yield* dropHeldBy, ["walRate"])
      yield* Fiber.interrupt(resume)
    }).pipe(Effect.provide(Gate)))

  it.effect("learned in a quiet hour, stops holding the day's normal rate once the window has passed", () =>
    Effect.gen(function*() {
      const { platform, write } = yield* wal
      // A quiet hour, no batch running: 3 MB/s is the baseline (stop 9 MB/s).
      yield* platform(3 * MB, 60 * 60)
      assert.strictEqual(yield* walStop, "3x median (9 MB/s)")
      // The day's normal, 10 MB/s, while resume passes write 1 MB each.
      const resume = yield* resumePasses(write, MB)
      yield* platform(10 * MB, 70 * 60)
      assert.strictEqual(yield* walStop, "3x median (30 MB/s)")
      assert.deepStrictEqual(yield* dropHeldBy, [])
      yield* Fiber.interrupt(resume)
    }).pipe(Effect.provide(Gate)))

  it.effect("with Sweeper writing back to back, a quiet hour's samples leave the baseline with their window", () =>
    Effect.gen(function*() {
      const { platform, write } = yield* wal
      yield* platform(3 * MB, 60 * 60)
      assert.strictEqual(yield* walStop, "3x median (9 MB/s)")
      // Passes writing without a gap: no round says anything of the platform alone, so none adds a
      // sample, and the old samples leave the window one round at a time.
      const resume = yield* resumePasses(write, MB, true)
      yield* platform(3 * MB, 30 * 60)
      assert.strictEqual(yield* walStop, "3x median (9 MB/s)")
      yield* platform(3 * MB, 31 * 60)
      assert.strictEqual(yield* walStop, "3x median (no baseline yet)")
      yield* Fiber.interrupt(resume)
    }).pipe(Effect.provide(Gate)))
})
