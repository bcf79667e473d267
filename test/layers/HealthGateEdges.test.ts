/**
 * The health gate's brakes at their edges, under TestClock over in-memory signals: the WAL
 * position read fresh before each unit; an unknown reading never ends a hold; a sampler round that
 * dies or hangs neither stops sampling nor leaves units deciding on frozen readings; dry runs are
 * never held and never move the throttle; holds belong to the run (one pair, wall-clock heldMs,
 * ended by its last waiter); gate events leave the batch's folded state alone; signals watch only
 * what the batch would harm; an idle sampler reads less.
 */
import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect, Fiber, Layer, Option, Schema } from "effect"
import { TestClock } from "effect/testing"
import { CurrentRun, type RunInfo } from "../../src/domain/Batch.ts"
import { RepairHeld, RunStarted } from "../../src/domain/Events.ts"
import type { HealthConfig } from "../../src/domain/Health.ts"
import { HealthJson } from "../../src/domain/HealthConfig.ts"
import { type GatedBatch, HealthGateLive } from "../../src/layers/health/HealthGateLive.ts"
import { EventLogMemory, MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import { HealthSignalsMemory, MemorySignalValues } from "../../src/layers/memory/HealthSignalsMemory.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { EventLog } from "../../src/services/EventLog.ts"
import { HealthGate } from "../../src/services/HealthGate.ts"
import { HealthReport } from "../../src/services/HealthReport.ts"
import { loadHistory } from "../../src/supervisor/Scheduler.ts"
import { settled } from "../support/gate.ts"

const DROP: GatedBatch = { name: "drop-canceling-builds", writes: { tables: ["ci_builds", "sweeper_events"] } }
const RESUME: GatedBatch = {
  name: "concurrency-limit-resume",
  writes: { tables: ["sweeper_events"], redisStores: ["queues"], concurrencyLimitQueues: true }
}

const health = (json: unknown): HealthConfig => Schema.decodeUnknownSync(HealthJson)(JSON.stringify(json))

/** An event log whose appends take a few scheduler turns, as a PostgreSQL insert takes a round trip. */
const SlowAppends = Layer.effect(
  EventLog,
  Effect.map(EventLog, (log) => ({
    ...log,
    append: (event: Parameters<typeof log.append>[0]) =>
      Effect.andThen(Effect.repeat(Effect.yieldNow, { times: 5 }), log.append(event))
  }))
).pipe(Layer.provide(EventLogMemory))

/** An event log whose appends never return, as an insert into a ledger whose table is locked. */
const HungAppends = Layer.effect(
  EventLog,
  Effect.map(EventLog, (log) => ({ ...log, append: () => Effect.never }))
).pipe(Layer.provide(EventLogMemory))

const Gate = (json: unknown, events: Layer.Layer<EventLog, never, MemoryEvents> = EventLogMemory) =>
  HealthGateLive({
    config: health(json),
    batches: [DROP, RESUME],
    concurrencyLimits: { "Releases::CreateEvidenceWorker": { limit: 10, queue: "evidence" } }
  }).pipe(
    Layer.provideMerge(HealthSignalsMemory),
    Layer.provideMerge(MemorySignalValues.layer),
    Layer.provideMerge(events),
    Layer.provideMerge(MemoryEvents.layer),
    Layer.provideMerge(MetricsPrometheus)
  )

const LAG = { replicationLag: { stop: "8MB", resume: "2MB" } }
const second = TestClock.adjust(Duration.seconds(1))
const seconds = (n: number) => Effect.repeat(second, { times: n - 1 })

const inRun = (overrides: Partial<RunInfo>) => <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.provideService(effect, CurrentRun, {
    runId: null,
    batch: null,
    dryRun: false,
    budget: Option.none(),
    fence: Option.none(),
    ...overrides
  })

const gateEvents = Effect.map(
  MemoryEvents,
  (events) =>
    events.filter((e) => e.type === "RepairHeld" || e.type === "RepairReleased").map((e) => ({
      type: e.type,
      stream: e.stream,
      ...e.data
    } as Record<string, unknown>))
)

describe("HealthGate at its edges", () => {
  it.effect("the replication lag is read fresh before a unit: WAL written since the last round holds the very next unit", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const values = yield* MemorySignalValues
      yield* second
      assert.isTrue((yield* gate.beforeUnit({ batch: DROP.name })).proceed)
      // The last page pushed the standby past stop; no round has run since (same instant).
      values.replicationLagBytes = 9_000_000
      const verdict = yield* gate.beforeUnit({ batch: DROP.name, deadlineMillis: 0 })
      assert.deepStrictEqual([verdict.proceed, verdict.heldBy], [false, ["replicationLag"]])
    }).pipe(Effect.provide(Gate(LAG))))

  it.effect("a failed read never hides a fresh reading over stop: the unit's own read failing still holds it", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const values = yield* MemorySignalValues
      // The round a moment ago read the standby 9 MB behind, over the 8 MB stop.
      values.replicationLagBytes = 9_000_000
      yield* second
      // The primary struggles: the unit's own read of the lag fails (onUnknown is healthy).
      values.replicationLagBytes = "no answer within 2s"
      const verdict = yield* gate.beforeUnit({ batch: DROP.name, deadlineMillis: 0 })
      assert.deepStrictEqual([verdict.proceed, verdict.heldBy], [false, ["replicationLag"]])
      // Once that reading is no longer fresh, unknown is what it is: healthy, as configured.
      yield* seconds(6)
      assert.isTrue((yield* gate.beforeUnit({ batch: DROP.name, deadlineMillis: 0 })).proceed)
    }).pipe(Effect.provide(Gate(LAG))))

  it.effect("an unknown reading keeps a hold (one slow read mid-incident writes no page)", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const values = yield* MemorySignalValues
      values.replicationLagBytes = 38_000_000
      yield* second
      const fiber = yield* gate.beforeUnit({ batch: DROP.name }).pipe(Effect.forkChild)
      yield* settled
      values.replicationLagBytes = "no answer within 2s"
      yield* seconds(3)
      assert.isUndefined(fiber.pollUnsafe(), "still held")
      assert.deepStrictEqual((yield* gateEvents).map((e) => e.type), ["RepairHeld"])
      values.replicationLagBytes = 1_000_000
      yield* second
      assert.isTrue((yield* Fiber.join(fiber)).proceed)
      assert.deepStrictEqual((yield* gateEvents).map((e) => e.type), ["RepairHeld", "RepairReleased"])
    }).pipe(Effect.provide(Gate(LAG))))

  it.effect("a sampler round that dies is logged and the next one still runs", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const values = yield* MemorySignalValues
      yield* second
      values.replicationLagBytes = { _tag: "Die", message: "bug in a reader" }
      values.oldestTransaction = { _tag: "Die", message: "bug in a reader" }
      yield* seconds(2)
      values.replicationLagBytes = 0
      values.oldestTransaction = 3600
      yield* seconds(2)
      // Only the sampler reads pg_stat_activity: a dead sampler would leave it at 0 s forever.
      const verdict = yield* gate.beforeUnit({ batch: DROP.name, deadlineMillis: 0 })
      assert.deepStrictEqual([verdict.proceed, verdict.heldBy], [false, ["longTransactions"]])
    }).pipe(Effect.provide(Gate({ longTransactions: { stop: "10m" } }))))

  it.effect("a hung round: readings older than a few rounds are unknown, and the unit's wait ends at its deadline", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const values = yield* MemorySignalValues
      yield* second
      assert.isTrue((yield* gate.beforeUnit({ batch: DROP.name })).proceed)
      values.oldestTransaction = { _tag: "Hang" }
      yield* seconds(6)
      const fiber = yield* gate.beforeUnit({ batch: DROP.name, deadlineMillis: 9_000 }).pipe(Effect.forkChild)
      yield* seconds(3)
      const verdict = yield* Fiber.join(fiber)
      assert.deepStrictEqual([verdict.proceed, verdict.heldBy], [false, ["longTransactions"]])
      const held = (yield* gateEvents)[0]!
      assert.match(String(held.unknown), /not read for \d+ s/)
    }).pipe(Effect.provide(Gate({ longTransactions: { stop: "10m", onUnknown: "hold" } }))))

  it.effect("the throttle's wait for a fresh round ends at the run's deadline, not 5 s later", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const values = yield* MemorySignalValues
      yield* second
      values.replicationLagBytes = { _tag: "Hang" }
      yield* seconds(2)
      const now = yield* Effect.clockWith((clock) => clock.currentTimeMillis)
      const fiber = yield* gate.effectiveLimit({ batch: RESUME.name, worker: "W", limit: 10 }).pipe(
        inRun({ deadline: now + 1_000 }),
        Effect.forkChild
      )
      yield* settled
      yield* second
      yield* settled
      assert.isDefined(fiber.pollUnsafe(), "answered by the run's deadline")
    }).pipe(Effect.provide(Gate({ ...LAG, throttleLimits: true }))))

  it.effect("a dry run is never held, writes no gate event, and names what would have held it", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const values = yield* MemorySignalValues
      values.replicationLagBytes = 38_000_000
      yield* second
      const verdict = yield* gate.beforeUnit({ batch: DROP.name, deadlineMillis: 60_000 }).pipe(
        inRun({ runId: "dry", dryRun: true })
      )
      assert.deepStrictEqual(verdict, { proceed: true, heldMs: 0, heldBy: ["replicationLag"] })
      assert.deepStrictEqual(yield* gateEvents, [])
    }).pipe(Effect.provide(Gate(LAG))))

  it.effect("a dry pass of concurrency-limit-resume does not throttle the real limit further", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const values = yield* MemorySignalValues
      const worker = "Releases::CreateEvidenceWorker"
      values.replicationLagBytes = 50_000_000
      yield* second
      const limit = (dryRun: boolean) =>
        gate.effectiveLimit({ batch: RESUME.name, worker, limit: 10 }).pipe(inRun({ dryRun }))
      assert.strictEqual(yield* limit(true), 8, "what a real pass would get")
      assert.strictEqual(yield* limit(true), 8)
      assert.strictEqual(yield* limit(false), 8, "the dry passes moved nothing")
      assert.strictEqual(yield* limit(false), 6)
    }).pipe(Effect.provide(Gate({ ...LAG, throttleLimits: true }))))

  it.effect("holds belong to the run: waiters share one pair, the first to reach its deadline ends nothing, heldMs is wall-clock", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const values = yield* MemorySignalValues
      values.replicationLagBytes = 38_000_000
      yield* second
      const run = inRun({ runId: "run-1" })
      const early = yield* gate.beforeUnit({ batch: DROP.name, deadlineMillis: 3_000 }).pipe(run, Effect.forkChild)
      const waiters = yield* Effect.forEach(
        [1, 2, 3],
        () => gate.beforeUnit({ batch: DROP.name }).pipe(run, Effect.forkChild)
      )
      yield* settled
      yield* seconds(3)
      assert.isFalse((yield* Fiber.join(early)).proceed)
      // The others still wait on the same hold: it was not closed.
      assert.deepStrictEqual((yield* gateEvents).map((e) => e.type), ["RepairHeld"])
      yield* seconds(4)
      yield* settled
      values.replicationLagBytes = 1_000_000
      yield* second
      const verdicts = yield* Effect.forEach(waiters, Fiber.join)
      assert.isTrue(verdicts.every((v) => v.proceed))
      const events = yield* gateEvents
      assert.deepStrictEqual(events.map((e) => e.type), ["RepairHeld", "RepairReleased"])
      // Summed over every waiter (as the repair loop sums verdicts): the hold's wall-clock time, once.
      const summed = verdicts.reduce((sum, v) => sum + v.heldMs, 0) + (yield* Fiber.join(early)).heldMs
      assert.strictEqual(summed, events[1]!.heldMs)
      assert.strictEqual(summed, 8_000)
    }).pipe(Effect.provide(Gate(LAG))))

  it.effect("two waiters and two signals: one RepairHeld per signal and hold, never a duplicate", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const values = yield* MemorySignalValues
      values.replicationLagBytes = 38_000_000
      values.oldestTransaction = 3600
      yield* second
      const run = inRun({ runId: "run-1" })
      const waiters = yield* Effect.forEach(
        [1, 2],
        () => gate.beforeUnit({ batch: DROP.name, deadlineMillis: 3_000 }).pipe(run, Effect.forkChild)
      )
      yield* settled
      yield* seconds(3)
      yield* Effect.forEach(waiters, Fiber.join)
      const events = yield* gateEvents
      assert.deepStrictEqual(
        events.map((e) => [e.type, e.signal]).sort(),
        [
          ["RepairHeld", "longTransactions"],
          ["RepairHeld", "replicationLag"],
          ["RepairReleased", "longTransactions"],
          ["RepairReleased", "replicationLag"]
        ]
      )
    }).pipe(Effect.provide(Gate({ ...LAG, longTransactions: { stop: "10m" } }, SlowAppends))))

  it.effect("a gate event append that hangs does not hang the gate: the unit still gets its verdict at its deadline", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const values = yield* MemorySignalValues
      values.replicationLagBytes = 38_000_000
      yield* second
      const fiber = yield* gate.beforeUnit({ batch: DROP.name, deadlineMillis: 3_000 }).pipe(Effect.forkChild)
      yield* settled
      yield* seconds(20)
      yield* settled
      const verdict = fiber.pollUnsafe()
      assert.isDefined(verdict, "answered")
    }).pipe(Effect.provide(Gate(LAG, HungAppends))))

  it.effect("gate events stay out of the batch's folded state: a thousand holds keep the last RunStarted", () =>
    Effect.gen(function*() {
      const events = yield* EventLog
      yield* events.append(
        new RunStarted({
          batch: DROP.name,
          run_id: "11111111-1111-4111-8111-111111111111",
          scheduled_at: null,
          node: "test",
          trigger: "schedule",
          dryRun: false
        })
      )
      for (let i = 0; i < 1001; i++) {
        yield* events.append(
          new RepairHeld({
            batch: DROP.name,
            signal: "walRate",
            value: 1,
            threshold: 0,
            stop: "3x",
            unit: "bytes/s"
          })
        )
      }
      const history = yield* loadHistory(DROP.name)
      assert.isDefined(history.lastStartedAt)
    }).pipe(Effect.provide(Gate(LAG))))

  it.effect("signals watch what the batch would harm: not a vacuum of Sweeper's own ledger; the default queue resumed into", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const values = yield* MemorySignalValues
      values.vacuuming = ["sweeper_events"]
      yield* second
      assert.isTrue((yield* gate.beforeUnit({ batch: DROP.name, deadlineMillis: 0 })).proceed)
      values.queueLatency = { default: 3600 }
      yield* second
      assert.deepStrictEqual((yield* gate.beforeUnit({ batch: RESUME.name, deadlineMillis: 0 })).heldBy, [
        "queueLatency"
      ])
    }).pipe(Effect.provide(Gate({ autovacuum: { stop: true }, queueLatency: { stop: "5m", resume: "1m" } }))))

  it.effect("idle, the sampler reads every 10 s; a starting batch still decides on a fresh reading", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const values = yield* MemorySignalValues
      yield* seconds(60)
      assert.isAtMost(values.reads["pg_stat_activity"]!, 8)
      values.oldestTransaction = 3600
      yield* seconds(2)
      const verdict = yield* gate.beforeUnit({ batch: DROP.name, deadlineMillis: 0 })
      assert.deepStrictEqual(verdict.heldBy, ["longTransactions"])
    }).pipe(Effect.provide(Gate({ longTransactions: { stop: "10m" } }))))

  it.effect("a relative walRate has a floor: a quiet database's median of 0 B/s does not hold on 50 B/s", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const values = yield* MemorySignalValues
      // Ten minutes of a database writing nothing: the baseline is warmed up at a median of 0.
      values.walPosition = 1_000
      yield* seconds(600)
      assert.isTrue((yield* gate.beforeUnit({ batch: DROP.name, deadlineMillis: 0 })).proceed)
      values.walPosition = 1_050
      yield* second
      const verdict = yield* gate.beforeUnit({ batch: DROP.name, deadlineMillis: 0 })
      assert.deepStrictEqual([verdict.proceed, verdict.heldBy], [true, []])
    }).pipe(Effect.provide(Gate({ walRate: { stop: "3x" } }))))

  it.effect("a relative walRate's baseline takes out the WAL this process's batches wrote, not their samples", () =>
    Effect.gen(function*() {
      const gate = yield* HealthGate
      const values = yield* MemorySignalValues
      let position = 0
      const write = (bytes: number) =>
        Effect.sync(() => {
          position += bytes
          values.walPosition = position
        })
      const at = (rate: number, n: number, own: number) =>
        Effect.gen(function*() {
          for (let i = 0; i < n; i++) {
            yield* write(rate)
            if (own > 0) {
              yield* gate.beforeUnit({ batch: DROP.name, deadlineMillis: 0 })
              yield* gate.ownWrite(DROP.name)(write(own))
            }
            yield* second
          }
        })
      // Ten quiet minutes at the platform's normal, then twenty with a batch writing 10 MB/s of its own on top.
      yield* at(10e6, 600, 0)
      yield* at(10e6, 1200, 10e6)
      const report = yield* (yield* HealthReport).snapshot
      assert.strictEqual(report.signals[0]!.stop, "3x median (30 MB/s)")
    }).pipe(Effect.provide(Gate({ walRate: { stop: "3x" } }))))
})

describe("HealthGate's readings have one writer", () => {
  it.effect("a unit that stops waiting leaves its fresh lag read running: the sampler publishes it for the others", () =>
    Effect.gen(function*() {
      const values = yield* MemorySignalValues
      const report = yield* HealthReport
      const gate = yield* HealthGate
      // A batch of this process is running: a round every second.
      yield* gate.beforeUnit({ batch: DROP.name })
      yield* seconds(2)
      // From now on the primary answers in 3 s, 9 MB behind.
      values.replicationLagBytes = { _tag: "Slow", millis: 3_000, value: 9_000_000 }
      const now = yield* Effect.clockWith((clock) => clock.currentTimeMillis)
      // A unit whose deadline is a second away asks for its fresh read, and gives up waiting at the deadline.
      const unit = yield* Effect.forkChild(gate.beforeUnit({ batch: DROP.name, deadlineMillis: now + 1_000 }))
      yield* settled
      yield* second
      yield* settled
      assert.isTrue((yield* Fiber.join(unit)).proceed)
      // Its read, begun a second before the sampler's next round, is in at 3 s; that round is not yet.
      yield* seconds(2)
      yield* settled
      const lag = (yield* report.snapshot).signals.find((s) => s.signal === "replicationLag")!
      assert.deepStrictEqual([lag.display, lag.state], ["9 MB", "over"])
    }).pipe(Effect.provide(Gate(LAG))))

  it.effect("a fresh lag read whose reader dies is an unknown reading, and the next unit still gets its own read", () =>
    Effect.gen(function*() {
      const values = yield* MemorySignalValues
      const gate = yield* HealthGate
      yield* gate.beforeUnit({ batch: DROP.name })
      yield* second
      yield* settled
      const now = yield* Effect.clockWith((clock) => clock.currentTimeMillis)
      values.replicationLagBytes = { _tag: "Die", message: "bug in a reader" }
      const first = yield* Effect.forkChild(gate.beforeUnit({ batch: DROP.name, deadlineMillis: now + 10_000 }))
      yield* settled
      // The primary answers again, 9 MB behind: the next unit's read sees it (its deadline has passed, so
      // a hold answers at once).
      values.replicationLagBytes = 9_000_000
      const next = yield* Effect.forkChild(gate.beforeUnit({ batch: DROP.name, deadlineMillis: now }))
      yield* settled
      yield* TestClock.adjust(Duration.millis(1))
      yield* settled
      const verdict = yield* Fiber.join(next)
      assert.deepStrictEqual([verdict.proceed, verdict.heldBy], [false, ["replicationLag"]])
      yield* Fiber.interrupt(first)
    }).pipe(Effect.provide(Gate(LAG))))
})
