/**
 * The run guard on the memory platform under TestClock, with small fake batches: outcomes, events,
 * retries of transient errors only, defects, the hard timeout, tick claims, the exclusive lease's
 * release on failure, and the `sweeper_runs_total` metric.
 */
import { assert, describe, it } from "@effect/vitest"
import { DateTime, Duration, Effect, Fiber, Option, Ref, Schema } from "effect"
import { PrometheusMetrics } from "effect/observability"
import { TestClock } from "effect/testing"
import { randomUUID } from "node:crypto"
import { type Batch, checkFence, CurrentRun, HARD_TIMEOUT_GRACE } from "../../src/domain/Batch.ts"
import { RedisError } from "../../src/domain/Errors.ts"
import { leaseKey } from "../../src/domain/Lease.ts"
import { MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { batches } from "../../src/programs/index.ts"
import { budget } from "../../src/repair/RepairLoop.ts"
import { Lease } from "../../src/services/Lease.ts"
import { runBatch, type RunOptions, type RunResult } from "../../src/supervisor/RunGuard.ts"
import { MemoryPlatform } from "../support/memory.ts"

const START = Date.parse("2026-01-01T00:00:00Z")

class PlainError extends Schema.TaggedError<PlainError>()("PlainError", { message: Schema.String }) {}

/** A fake batch with a unique name (metrics are process-wide). */
const fake = <S, E>(run: Effect.Effect<S, E>, overrides: Partial<Batch<S, E, never>> = {}): Batch<S, E, never> => ({
  name: `fake-${randomUUID().slice(0, 8)}`,
  worker: "FakeWorker",
  description: "a fake batch",
  cron: "* * * * *",
  budget: Duration.minutes(1),
  lease: Option.none(),
  run,
  ...overrides
})

/** Runs the guard in a fiber and moves the TestClock `advance` forward, then joins. */
const guard = <S, E>(batch: Batch<S, E, never>, options: Partial<RunOptions> = {}, advance: Duration.Input = 0) =>
  Effect.gen(function*() {
    const fiber = yield* Effect.forkChild(runBatch(batch, { trigger: "manual", ...options }))
    yield* TestClock.adjust(advance)
    return yield* Fiber.join(fiber)
  })

const eventsOf = (result: RunResult) =>
  Effect.map(MemoryEvents, (events) => events.filter((e) => e.stream === `batch:${result.batch}`))

const runsTotal = (batch: string, outcome: string) =>
  Effect.map(PrometheusMetrics.format(), (text) => {
    const line = text.split("\n").find((l) =>
      l.startsWith("sweeper_runs_total{") && l.includes(`batch="${batch}"`) && l.includes(`outcome="${outcome}"`)
    )
    return line === undefined ? 0 : Number(line.split(" ").at(-1))
  })

const setup = TestClock.setTime(START)

describe("runBatch (run guard)", () => {
  it.effect("succeeded: RunStarted and RunFinished with summary and duration, run id on both", () =>
    Effect.gen(function*() {
      yield* setup
      const seen = yield* Ref.make<string | null>(null)
      const batch = fake(Effect.gen(function*() {
        const run = yield* CurrentRun
        yield* Ref.set(seen, run.runId)
        yield* Effect.sleep("3 seconds")
        return { repaired: 2, batch: run.batch }
      }))
      const result = yield* guard(batch, {}, "3 seconds")
      assert.strictEqual(result.outcome, "succeeded")
      assert.deepStrictEqual(result.summary, { repaired: 2, batch: batch.name })
      assert.strictEqual(result.durationMs, 3000)
      assert.strictEqual(yield* Ref.get(seen), result.runId)
      const events = yield* eventsOf(result)
      assert.deepStrictEqual(events.map((e) => e.type), ["RunStarted", "RunFinished"])
      const [started, finished] = events
      assert.deepStrictEqual(started!.data, {
        batch: batch.name,
        run_id: result.runId,
        scheduled_at: null,
        node: "test-node",
        trigger: "manual",
        dryRun: false,
        budget_ms: 60_000
      })
      assert.strictEqual(started!.occurredAt.getTime(), START)
      assert.deepStrictEqual(finished!.data, {
        batch: batch.name,
        outcome: "succeeded",
        summary: { repaired: 2, batch: batch.name },
        duration_ms: 3000,
        dryRun: false
      })
      assert.strictEqual(finished!.occurredAt.getTime(), START + 3000)
      assert.isTrue(events.every((e) => e.runId === result.runId))
      assert.strictEqual(yield* runsTotal(batch.name, "succeeded"), 1)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("RunFinished carries the items repaired: the sum of the counts the batch names, failed runs included", () =>
    Effect.gen(function*() {
      yield* setup
      const batch = fake(Effect.succeed({ dropped: 40, doomed: 2, batches: 3, skippedLocked: 9 }), {
        repairedCounts: ["dropped", "doomed"]
      })
      const done = yield* guard(batch)
      assert.strictEqual((yield* eventsOf(done)).at(-1)!.data.repaired, 42)
      // A failed run reports what it did before failing: those count too.
      const failing = fake(
        Effect.gen(function*() {
          const run = yield* CurrentRun
          run.progress?.report({ dropped: 5 })
          return yield* new PlainError({ message: "boom" })
        }),
        { repairedCounts: ["dropped", "doomed"] }
      )
      const failed = yield* guard(failing)
      assert.strictEqual(failed.outcome, "failed")
      assert.strictEqual((yield* eventsOf(failed)).at(-1)!.data.repaired, 5)
      // A batch that names no counts writes none.
      const plain = yield* guard(fake(Effect.succeed({ n: 1 })))
      assert.notProperty((yield* eventsOf(plain)).at(-1)!.data, "repaired")
      // Every registered batch names its counts.
      for (const registered of batches) assert.isNotEmpty(registered.repairedCounts ?? [], registered.name)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a transient RedisError is retried with backoff; twice failing then succeeding → succeeded", () =>
    Effect.gen(function*() {
      yield* setup
      const attempts = yield* Ref.make(0)
      const batch = fake(Effect.gen(function*() {
        const n = yield* Ref.updateAndGet(attempts, (k) => k + 1)
        if (n <= 2) return yield* new RedisError({ operation: "mget", cause: new Error("ECONNRESET") })
        return { attempt: n }
      }))
      const fiber = yield* Effect.forkChild(runBatch(batch, { trigger: "manual" }))
      // Backoff is real time: without the clock moving, only the first attempt has run.
      yield* Effect.yieldNow
      assert.strictEqual(yield* Ref.get(attempts), 1)
      yield* TestClock.adjust("10 seconds")
      const result = yield* Fiber.join(fiber)
      assert.strictEqual(result.outcome, "succeeded")
      assert.deepStrictEqual(result.summary, { attempt: 3 })
      assert.strictEqual(yield* Ref.get(attempts), 3)
      assert.deepStrictEqual((yield* eventsOf(result)).map((e) => e.type), ["RunStarted", "RunFinished"])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a transient error that persists gives up after the capped retries → failed", () =>
    Effect.gen(function*() {
      yield* setup
      const attempts = yield* Ref.make(0)
      const batch = fake(
        Ref.update(attempts, (k) => k + 1).pipe(
          Effect.andThen(Effect.fail(new RedisError({ operation: "get", cause: new Error("down") })))
        )
      )
      const result = yield* guard(batch, {}, "1 minute")
      assert.strictEqual(result.outcome, "failed")
      assert.strictEqual(yield* Ref.get(attempts), 4)
      assert.include(result.error ?? "", "RedisError")
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a non-transient failure → failed with the error text, not retried", () =>
    Effect.gen(function*() {
      yield* setup
      const attempts = yield* Ref.make(0)
      const batch = fake(
        Ref.update(attempts, (k) => k + 1).pipe(
          Effect.andThen(Effect.fail(new PlainError({ message: "row 42 is inconsistent" })))
        )
      )
      const result = yield* guard(batch, {}, "1 minute")
      assert.strictEqual(result.outcome, "failed")
      assert.include(result.error ?? "", "row 42 is inconsistent")
      assert.strictEqual(yield* Ref.get(attempts), 1)
      const finished = (yield* eventsOf(result)).at(-1)!
      assert.strictEqual(finished.type, "RunFinished")
      assert.strictEqual(finished.data.outcome, "failed")
      assert.include(String(finished.data.error), "row 42 is inconsistent")
      assert.strictEqual(yield* runsTotal(batch.name, "failed"), 1)
      assert.strictEqual(yield* runsTotal(batch.name, "succeeded"), 0)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a defect (Effect.die) → failed with its message; the guard itself does not die", () =>
    Effect.gen(function*() {
      yield* setup
      const batch = fake(Effect.die(new Error("kaboom")))
      const exit = yield* Effect.exit(guard(batch))
      assert.strictEqual(exit._tag, "Success")
      const result = (exit as { value: RunResult }).value
      assert.strictEqual(result.outcome, "failed")
      assert.include(result.error ?? "", "kaboom")
      const types = (yield* eventsOf(result)).map((e) => [e.type, e.data.outcome])
      assert.deepStrictEqual(types, [["RunStarted", undefined], ["RunFinished", "failed"]])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("budget exceeded: interrupted at budget + HARD_TIMEOUT_GRACE → timed_out", () =>
    Effect.gen(function*() {
      yield* setup
      const finishedWork = yield* Ref.make(false)
      const batch = fake(Effect.sleep("2 hours").pipe(Effect.andThen(Ref.set(finishedWork, true))), {
        budget: Duration.minutes(1)
      })
      const fiber = yield* Effect.forkChild(runBatch(batch, { trigger: "manual" }))
      const limit = Duration.sum(Duration.minutes(1), HARD_TIMEOUT_GRACE)
      yield* TestClock.adjust(Duration.subtract(limit, Duration.seconds(1)))
      assert.isUndefined(fiber.pollUnsafe(), "still running within budget + grace")
      yield* TestClock.adjust("2 seconds")
      const result = yield* Fiber.join(fiber)
      assert.strictEqual(result.outcome, "timed_out")
      assert.isFalse(yield* Ref.get(finishedWork))
      const finished = (yield* eventsOf(result)).at(-1)!
      assert.strictEqual(finished.data.outcome, "timed_out")
      assert.strictEqual(finished.data.duration_ms, Duration.toMillis(limit))
      assert.strictEqual(yield* runsTotal(batch.name, "timed_out"), 1)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("one deadline per run: a retried attempt's loops get what is left of the run's budget, not a fresh one", () =>
    Effect.gen(function*() {
      yield* setup
      let attempt = 0
      const batch = fake(
        Effect.gen(function*() {
          attempt++
          const clock = yield* budget(Duration.minutes(1))
          if (attempt === 1) {
            yield* Effect.sleep("40 seconds")
            return yield* new RedisError({ operation: "GET", cause: new Error("ECONNRESET") })
          }
          return clock.deadlineMillis - START
        }),
        { budget: Duration.minutes(1) }
      )
      const result = yield* guard(batch, {}, "2 minutes")
      assert.strictEqual(result.outcome, "succeeded")
      assert.strictEqual(result.summary, 60_000)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("the budget override of a run replaces the batch's", () =>
    Effect.gen(function*() {
      yield* setup
      const batch = fake(Effect.sleep("40 seconds").pipe(Effect.as("ok")), { budget: Duration.hours(1) })
      const result = yield* guard(batch, { budget: Duration.seconds(1) }, "1 minute")
      assert.strictEqual(result.outcome, "timed_out")
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("claimTick: a second run for the same scheduledAt is skipped without a RunStarted; another tick runs", () =>
    Effect.gen(function*() {
      yield* setup
      const runs = yield* Ref.make(0)
      const batch = fake(Ref.updateAndGet(runs, (n) => n + 1))
      const tick = DateTime.makeUnsafe("2026-01-01T00:00:00Z")
      const first = yield* guard(batch, { trigger: "schedule", scheduledAt: tick, tickClaimTtl: Duration.minutes(10) })
      const second = yield* guard(batch, { trigger: "schedule", scheduledAt: tick, tickClaimTtl: Duration.minutes(10) })
      assert.strictEqual(first.outcome, "succeeded")
      assert.strictEqual(second.outcome, "skipped")
      assert.strictEqual(second.reason, "tick claimed elsewhere")
      assert.strictEqual(yield* Ref.get(runs), 1)
      const started = (yield* eventsOf(first)).filter((e) => e.type === "RunStarted")
      assert.lengthOf(started, 1)
      assert.strictEqual(started[0]!.data.scheduled_at, "2026-01-01T00:00:00.000Z")
      assert.strictEqual(started[0]!.data.trigger, "schedule")
      const next = yield* guard(batch, {
        trigger: "schedule",
        scheduledAt: DateTime.makeUnsafe("2026-01-01T00:01:00Z"),
        tickClaimTtl: Duration.minutes(10)
      })
      assert.strictEqual(next.outcome, "succeeded")
      assert.strictEqual(yield* Ref.get(runs), 2)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("the exclusive lease is fenced into the run and released when the run fails", () =>
    Effect.gen(function*() {
      yield* setup
      const redis = yield* MemoryRedis
      const name = `fake/${randomUUID()}`
      const fenceSeen = yield* Ref.make<number | undefined>(undefined)
      const batch = fake(
        Effect.gen(function*() {
          const run = yield* CurrentRun
          yield* Ref.set(fenceSeen, Option.getOrUndefined(Option.map(run.fence, (f) => f.epoch)))
          assert.isNotNull(redis.get(leaseKey(name)))
          return yield* new PlainError({ message: "broken" })
        }),
        { lease: Option.some({ name, ttl: Duration.minutes(5) }) }
      )
      const result = yield* guard(batch)
      assert.strictEqual(result.outcome, "failed")
      const first = yield* Ref.get(fenceSeen)
      assert.isAbove(first ?? 0, 0)
      assert.isFalse(redis.exists(leaseKey(name)))
      // A second run takes a newer epoch (max(stored + 1, clock ms): see Lease.ts).
      const again = yield* guard(fake(Effect.map(CurrentRun, (run) => Option.getOrThrow(run.fence).epoch), {
        name: batch.name,
        lease: batch.lease
      }))
      assert.isAbove(again.summary as number, first!)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a lease check whose read fails stops the run before its next write; the run is retried as transient", () =>
    Effect.gen(function*() {
      yield* setup
      // The lease store answers the first check, then fails `failures` reads (the Redis cut),
      // then answers again: the run is retried and, once the read works, finishes.
      const run = (failures: number) =>
        Effect.gen(function*() {
          const lease = yield* Lease
          const reads = yield* Ref.make(0)
          const flaky = Lease.of({
            ...lease,
            isHeld: (handle) =>
              Effect.flatMap(Ref.updateAndGet(reads, (n) => n + 1), (n) =>
                n >= 2 && n < 2 + failures
                  ? Effect.fail(
                    new RedisError({ operation: "GET lease", cause: new Error("connect ECONNREFUSED 127.0.0.1:6390") })
                  )
                  : lease.isHeld(handle))
          })
          const writes: Array<string> = []
          const batch = fake(
            Effect.gen(function*() {
              for (const step of ["a", "b"]) {
                yield* checkFence
                writes.push(step)
              }
              return { writes: writes.length }
            }),
            { lease: Option.some({ name: `fake/${randomUUID()}`, ttl: Duration.minutes(5) }) }
          )
          const result = yield* guard(batch, {}, "1 minute").pipe(Effect.provideService(Lease, flaky))
          return { result, writes, reads: yield* Ref.get(reads) }
        })

      const persists = yield* run(Infinity)
      assert.strictEqual(persists.result.outcome, "failed")
      assert.include(persists.result.error ?? "", "ECONNREFUSED")
      assert.notStrictEqual(persists.result.reason, "lease lost", "an unknown lease is not a lost one")
      // Step a (first check answered), then every attempt stops at its first check: nothing more.
      assert.deepStrictEqual(persists.writes, ["a"])
      assert.strictEqual(persists.reads, 5, "the first attempt's two checks, then one per retry (three)")

      const once = yield* run(1)
      assert.strictEqual(once.result.outcome, "succeeded")
      // Attempt 1 wrote a and stopped at b's check; attempt 2 (retried) wrote a and b.
      assert.deepStrictEqual(once.writes, ["a", "a", "b"])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a long run renews its lease every TTL/3, so it outlives the TTL", () =>
    Effect.gen(function*() {
      yield* setup
      const redis = yield* MemoryRedis
      const name = `fake/${randomUUID()}`
      const batch = fake(
        Effect.sleep("100 seconds").pipe(Effect.andThen(Effect.sync(() => redis.get(leaseKey(name))))),
        {
          lease: Option.some({ name, ttl: Duration.seconds(30) }),
          budget: Duration.minutes(5)
        }
      )
      const result = yield* guard(batch, {}, "100 seconds")
      assert.strictEqual(result.outcome, "succeeded")
      assert.isString(result.summary, "the lease was still held after 100 s with a 30 s TTL")
      assert.isFalse(redis.exists(leaseKey(name)))
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("sweeper_runs_total counts by batch and outcome", () =>
    Effect.gen(function*() {
      yield* setup
      const a = fake(Effect.succeed(1))
      const b = fake(Effect.fail(new PlainError({ message: "no" })))
      yield* guard(a)
      yield* guard(a)
      yield* guard(b)
      const held = fake(Effect.succeed(1), {
        lease: Option.some({ name: `fake/${randomUUID()}`, ttl: Duration.minutes(1) })
      })
      const redis = yield* MemoryRedis
      redis.set(leaseKey(Option.getOrThrow(held.lease).name), "other", { exSeconds: 60 })
      const skipped = yield* guard(held)
      assert.strictEqual(skipped.outcome, "skipped")
      assert.strictEqual(yield* runsTotal(a.name, "succeeded"), 2)
      assert.strictEqual(yield* runsTotal(a.name, "failed"), 0)
      assert.strictEqual(yield* runsTotal(b.name, "failed"), 1)
      assert.strictEqual(yield* runsTotal(b.name, "succeeded"), 0)
      assert.strictEqual(yield* runsTotal(held.name, "skipped"), 1)
      const text = yield* PrometheusMetrics.format()
      assert.include(text, "sweeper_lease_skips_total")
    }).pipe(Effect.provide(MemoryPlatform())))
})
