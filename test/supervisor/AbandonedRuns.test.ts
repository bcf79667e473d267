/**
 * Killed runs are closed: a RunStarted with no RunFinished (the process died) is closed with
 * `RunFinished{outcome: "abandoned"}` under the old run id by whoever next runs the batch, once the
 * old run provably cannot be running — its exclusive lease was taken over (newer epoch), or, without
 * a lease, its budget + grace + slack has passed — and by the supervisor at start-up.
 */
import { assert, describe, it } from "@effect/vitest"
import { ConfigProvider, Context, DateTime, Duration, Effect, Exit, Fiber, Layer, Option, Scope } from "effect"
import { PrometheusMetrics } from "effect/observability"
import { TestClock } from "effect/testing"
import { randomUUID } from "node:crypto"
import { type Batch, CurrentRun, HARD_TIMEOUT_GRACE } from "../../src/domain/Batch.ts"
import { foldHistory } from "../../src/domain/BatchState.ts"
import { RunStarted } from "../../src/domain/Events.ts"
import { MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import type { RegisteredBatch } from "../../src/programs/index.ts"
import { EventLog } from "../../src/services/EventLog.ts"
import { Lease } from "../../src/services/Lease.ts"
import { ABANDON_SLACK } from "../../src/supervisor/AbandonedRuns.ts"
import { runBatch } from "../../src/supervisor/RunGuard.ts"
import { Scheduler, schedulerLayer } from "../../src/supervisor/Scheduler.ts"
import { MemoryPlatform } from "../support/memory.ts"

const START = Date.parse("2026-01-01T00:00:00Z")

const fake = (overrides: Partial<Batch<unknown, never, never>> = {}): Batch<unknown, never, never> => ({
  name: `fake-${randomUUID().slice(0, 8)}`,
  worker: "FakeWorker",
  description: "a fake batch",
  cron: "*/10 * * * *",
  budget: Duration.minutes(1),
  lease: Option.none(),
  run: Effect.succeed({ ok: true }),
  ...overrides
})

/** What a process killed with -9 mid-run leaves behind: its RunStarted, nothing more. */
const killedRun = (
  batch: Batch<unknown, never, never>,
  fields: { dryRun?: boolean; lease_epoch?: number; budget_ms?: number } = {}
) =>
  Effect.gen(function*() {
    const events = yield* EventLog
    const runId = randomUUID()
    yield* events.append(
      new RunStarted({
        batch: batch.name,
        run_id: runId,
        scheduled_at: null,
        node: "dead-node:1",
        trigger: "schedule",
        dryRun: fields.dryRun ?? false,
        ...(fields.budget_ms === undefined ? {} : { budget_ms: fields.budget_ms }),
        ...(fields.lease_epoch === undefined ? {} : { lease_epoch: fields.lease_epoch })
      })
    ).pipe(
      Effect.provideService(CurrentRun, {
        runId,
        batch: batch.name,
        dryRun: false,
        budget: Option.none(),
        fence: Option.none()
      })
    )
    return runId
  })

const batchEvents = (name: string) => Effect.map(MemoryEvents, (all) => all.filter((e) => e.stream === `batch:${name}`))

const abandonedOf = (name: string) =>
  Effect.map(
    batchEvents(name),
    (events) => events.filter((e) => e.type === "RunFinished" && e.data.outcome === "abandoned")
  )

const run = (batch: Batch<unknown, never, never>, dryRun = false) =>
  Effect.gen(function*() {
    const fiber = yield* Effect.forkChild(runBatch(batch, { trigger: "manual", dryRun }))
    yield* TestClock.adjust(0)
    return yield* Fiber.join(fiber)
  })

describe("abandoned runs", () => {
  it.effect("leased batch: closed by the next run once the dead holder's lease expired (newer epoch), not while it is held", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(START)
      const leaseName = `fake/${randomUUID()}`
      const batch = fake({
        lease: Option.some({ name: leaseName, ttl: Duration.minutes(5) }),
        budget: Duration.hours(2)
      })
      // The killed process took the lease (epoch 1) and wrote its RunStarted.
      const lease = yield* Lease
      const dead = Option.getOrThrow(yield* lease.tryAcquire(leaseName, Duration.minutes(5)))
      const killed = yield* killedRun(batch, {
        lease_epoch: dead.epoch,
        budget_ms: Duration.toMillis(Duration.hours(2))
      })

      // Its lease is still held: the old run might be alive, nothing is closed.
      yield* TestClock.adjust("1 minute")
      const skipped = yield* run(batch)
      assert.strictEqual(skipped.reason, "lease held")
      assert.lengthOf(yield* abandonedOf(batch.name), 0)

      // The lease expired (nobody renews it): the next holder has epoch 2 and closes run 1, long
      // before its 2 h budget would have.
      yield* TestClock.adjust("5 minutes")
      const next = yield* run(batch)
      assert.strictEqual(next.outcome, "succeeded")
      const closed = yield* abandonedOf(batch.name)
      assert.lengthOf(closed, 1)
      assert.strictEqual(closed[0]!.runId, killed)
      assert.strictEqual(closed[0]!.data.summary, null)
      assert.strictEqual(closed[0]!.data.duration_ms, 6 * 60_000)
      assert.include(String(closed[0]!.data.reason), "epoch 1")
      assert.include(String(closed[0]!.data.reason), next.runId)
      assert.deepStrictEqual(next.closed?.map((r) => [r.runId, r.outcome]), [[killed, "abandoned"]])
      // Closed before the new run started, and only once.
      const types = (yield* batchEvents(batch.name)).map((e) => `${e.type}:${e.data.outcome ?? ""}`)
      assert.deepStrictEqual(types.slice(-3), ["RunFinished:abandoned", "RunStarted:", "RunFinished:succeeded"])
      yield* run(batch)
      assert.lengthOf(yield* abandonedOf(batch.name), 1)
      const text = yield* PrometheusMetrics.format()
      assert.isTrue(
        text.split("\n").some((l) =>
          l.startsWith("sweeper_runs_total{") && l.includes(`batch="${batch.name}"`) &&
          l.includes(`outcome="abandoned"`) && l.endsWith(" 1")
        )
      )
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("batch without a lease: closed only once budget + grace + slack has passed since RunStarted", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(START)
      const batch = fake({ budget: Duration.minutes(1) })
      // Recorded with a 10-minute budget (a --budget override): that one counts, not the batch's.
      const killed = yield* killedRun(batch, { budget_ms: 10 * 60_000 })
      const deadline = Duration.sum(Duration.sum(Duration.minutes(10), HARD_TIMEOUT_GRACE), ABANDON_SLACK)
      yield* TestClock.setTime(START + Duration.toMillis(deadline))
      yield* run(batch)
      assert.lengthOf(yield* abandonedOf(batch.name), 0, "at the deadline it might still be finishing")
      yield* TestClock.adjust("1 second")
      yield* run(batch)
      const closed = yield* abandonedOf(batch.name)
      assert.deepStrictEqual(closed.map((e) => e.runId), [killed])
      assert.include(String(closed[0]!.data.reason), "budget")
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a dry run of a leased batch takes no lease: only the budget rule closes it", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(START)
      const batch = fake({ lease: Option.some({ name: `fake/${randomUUID()}`, ttl: Duration.minutes(5) }) })
      const dry = yield* killedRun(batch, { dryRun: true, budget_ms: 60_000 })
      yield* run(batch)
      assert.lengthOf(yield* abandonedOf(batch.name), 0)
      yield* TestClock.adjust("3 minutes")
      yield* run(batch)
      const closed = yield* abandonedOf(batch.name)
      assert.deepStrictEqual(closed.map((e) => [e.runId, e.data.dryRun]), [[dry, true]])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("the fold: an open run is visible until closed; abandoned counts as a failure for the breaker", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(START)
      const batch = fake()
      const killed = yield* killedRun(batch, { budget_ms: 60_000 })
      const open = foldHistory(yield* batchEvents(batch.name))
      assert.strictEqual(open.openRun?.runId, killed)
      assert.strictEqual(open.openRun?.node, "dead-node:1")
      yield* TestClock.adjust("10 minutes")
      yield* run(batch)
      const after = foldHistory((yield* batchEvents(batch.name)).slice(0, -2))
      assert.isUndefined(after.openRun)
      assert.strictEqual(after.lastRun?.outcome, "abandoned")
      assert.strictEqual(after.consecutiveFailures, 1)
      const latest = foldHistory(yield* batchEvents(batch.name))
      assert.strictEqual(latest.lastRun?.outcome, "succeeded")
      assert.strictEqual(latest.consecutiveFailures, 0)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("supervisor start-up closes runs whose budget has passed, and its state shows them", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(START)
      const batch = fake({ lease: Option.some({ name: `fake/${randomUUID()}`, ttl: Duration.minutes(5) }) })
      const old = yield* killedRun(batch, { lease_epoch: 1, budget_ms: 60_000 })
      yield* TestClock.adjust("10 minutes")
      const recent = yield* killedRun(batch, { lease_epoch: 2, budget_ms: 60_000 })
      yield* TestClock.adjust("1 minute")
      const scope = yield* Scope.make()
      const context = yield* Layer.buildWithScope(schedulerLayer([batch as unknown as RegisteredBatch]), scope).pipe(
        Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromEnv({ env: {} }))
      )
      // The old one is overdue; the recent one may still be running elsewhere (no lease taken at start-up).
      assert.deepStrictEqual((yield* abandonedOf(batch.name)).map((e) => e.runId), [old])
      const snapshot = (yield* Context.get(context, Scheduler).snapshots)[0]!
      assert.strictEqual(snapshot.history.lastRun?.outcome, "abandoned")
      assert.strictEqual(snapshot.history.openRun?.runId, recent)
      assert.strictEqual(
        DateTime.toEpochMillis(DateTime.fromDateUnsafe(snapshot.history.lastRun!.finishedAt)),
        START + 11 * 60_000
      )
      yield* Scope.close(scope, Exit.void)
    }).pipe(Effect.provide(MemoryPlatform())))
})
