/**
 * A run the guard retries after a transient error reports the work of all its attempts: programs
 * report what they did as they go (`reportProgress`), and the final summary is the last attempt's
 * plus what the failed attempts reported (numbers add, booleans OR, lists concatenate, capped). A
 * run that ends without a summary — failed for good, out of retries, timed out, lease lost — carries
 * what all its attempts reported.
 */
import { assert, describe, it } from "@effect/vitest"
import { DateTime, Duration, Effect, Fiber, Option, Ref } from "effect"
import { TestClock } from "effect/testing"
import { randomUUID } from "node:crypto"
import { type Batch, reportProgress } from "../../src/domain/Batch.ts"
import { DropBatchSize } from "../../src/domain/Build.ts"
import { LeaseLost, RedisError } from "../../src/domain/Errors.ts"
import { addSummaries, SUMMARY_LIST_CAP } from "../../src/domain/Summary.ts"
import { type BuildRecord, MemoryBuilds } from "../../src/layers/memory/BuildsMemory.ts"
import { MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import { DropCancelingBuilds } from "../../src/programs/DropCancelingBuilds.ts"
import { Builds } from "../../src/services/Builds.ts"
import { runBatch } from "../../src/supervisor/RunGuard.ts"
import { MemoryPlatform } from "../support/memory.ts"

const NOW = DateTime.makeUnsafe("2026-03-01T12:00:00Z")
const transient = new RedisError({ operation: "test", cause: new Error("read ECONNRESET") })

/** Runs the guard in a fiber, moving the TestClock past the retry backoff. */
const guarded = <S, E, R>(batch: Batch<S, E, R>) =>
  Effect.gen(function*() {
    const fiber = yield* Effect.forkChild(runBatch(batch, { trigger: "manual" }))
    yield* TestClock.adjust("1 minute")
    return yield* Fiber.join(fiber)
  })

/** `count` builds canceling for two hours at NOW (ids 1..count), in the memory platform. */
const seedCanceling = (count: number) =>
  Effect.gen(function*() {
    const state = yield* MemoryBuilds
    const old = DateTime.subtractDuration(NOW, Duration.hours(2))
    for (let id = 1; id <= count; id++) {
      state.rows.set(
        id,
        {
          id,
          projectId: 1,
          runnerId: 7,
          type: "Ci::Build",
          status: "canceling",
          failureReason: null,
          lockVersion: 0,
          createdAt: old,
          updatedAt: old,
          finishedAt: null
        } satisfies BuildRecord
      )
    }
    return state
  })

describe("summaries of retried runs add up all attempts", () => {
  it.effect("a program that fails transiently once after some work: numbers add, booleans OR, lists concatenate", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
      const attempts = yield* Ref.make(0)
      const batch: Batch<unknown, RedisError, never> = {
        name: `fake-${randomUUID().slice(0, 8)}`,
        worker: "FakeWorker",
        description: "fails once after doing some work",
        cron: "* * * * *",
        budget: Duration.minutes(5),
        lease: Option.none(),
        run: Effect.gen(function*() {
          const attempt = yield* Ref.updateAndGet(attempts, (n) => n + 1)
          if (attempt === 1) {
            yield* reportProgress({ repaired: 2, ids: [1, 2], truncated: true })
            yield* reportProgress({ repaired: 1, ids: [3] })
            return yield* transient
          }
          yield* reportProgress({ repaired: 4, ids: [4, 5, 6, 7] })
          // The last attempt's own summary is authoritative for what it did; unreported fields
          // (seen) are the last attempt's alone.
          return { repaired: 4, ids: [4, 5, 6, 7], truncated: false, seen: 4 }
        })
      }
      const result = yield* guarded(batch)
      assert.strictEqual(result.outcome, "succeeded")
      assert.strictEqual(yield* Ref.get(attempts), 2)
      assert.deepStrictEqual(result.summary, { repaired: 7, ids: [1, 2, 3, 4, 5, 6, 7], truncated: true, seen: 4 })
      const finished = (yield* MemoryEvents).find((e) => e.type === "RunFinished" && e.stream === `batch:${batch.name}`)
      assert.deepStrictEqual(finished!.data.summary, result.summary)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("drop-canceling-builds: a transient failure after 3 of 5 drops → dropped 5, not 2", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
      const state = yield* seedCanceling(5)
      // The connection drops on the 4th write, once.
      const builds = yield* Builds
      let drops = 0
      const flaky = Builds.of({
        ...builds,
        drop: (build, now) => ++drops === 4 ? Effect.fail(transient as never) : builds.drop(build, now)
      })
      const { backlog: _backlog, ...descriptor } = DropCancelingBuilds
      const batch = { ...descriptor, run: DropCancelingBuilds.run.pipe(Effect.provideService(Builds, flaky)) }
      const result = yield* guarded(batch)
      assert.strictEqual(result.outcome, "succeeded")
      assert.deepStrictEqual(result.summary, {
        dropped: 5,
        doomed: 0,
        batches: 1,
        skippedLocked: 0,
        heldMs: 0,
        heldBy: []
      })
      assert.isTrue([...state.rows.values()].every((row) => row.status === "failed"))
      const dropped = (yield* MemoryEvents).filter((e) => e.type === "BuildDropped")
      assert.lengthOf(dropped, 5)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("drop-canceling-builds: a permanent failure after 3 of 5 pages → failed, dropped 3 in RunFinished", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
      yield* seedCanceling(5)
      // Pages of one build; the 4th page's write fails for good (not a lost connection: not retried).
      const builds = yield* Builds
      let pages = 0
      const permanent = new RedisError({ operation: "test", cause: new Error("ERR unknown command") })
      const broken = Builds.of({
        ...builds,
        dropMany: (page, now) => ++pages >= 4 ? Effect.fail(permanent as never) : builds.dropMany(page, now)
      })
      const { backlog: _backlog, ...descriptor } = DropCancelingBuilds
      const batch = {
        ...descriptor,
        run: DropCancelingBuilds.run.pipe(
          Effect.provideService(Builds, broken),
          Effect.provideService(DropBatchSize, 1)
        )
      }
      const result = yield* guarded(batch)
      assert.strictEqual(result.outcome, "failed")
      assert.deepStrictEqual(result.summary, { dropped: 3, doomed: 0, skippedLocked: 0 })
      const finished = (yield* MemoryEvents).find((e) => e.type === "RunFinished" && e.stream === `batch:${batch.name}`)
      assert.deepStrictEqual(finished!.data.summary, { dropped: 3, doomed: 0, skippedLocked: 0 })
      assert.lengthOf((yield* MemoryEvents).filter((e) => e.type === "BuildDropped"), 3)
    }).pipe(Effect.provide(MemoryPlatform())))

  /** A fake batch whose attempts run `attempt(n)` in turn (n from 1). */
  const fake = (budget: Duration.Duration, attempt: (n: number) => Effect.Effect<unknown, RedisError | LeaseLost>) =>
    Effect.map(Ref.make(0), (attempts): Batch<unknown, RedisError | LeaseLost, never> => ({
      name: `fake-${randomUUID().slice(0, 8)}`,
      worker: "FakeWorker",
      description: "repairs some, then ends without a summary",
      cron: "* * * * *",
      budget,
      lease: Option.none(),
      run: Effect.flatMap(Ref.updateAndGet(attempts, (n) => n + 1), attempt)
    }))

  /** RunFinished's summary: what the run's `--json` prints too (RunResult.summary). */
  const finishedSummary = (name: string) =>
    Effect.map(
      MemoryEvents,
      (events) => events.find((e) => e.type === "RunFinished" && e.stream === `batch:${name}`)!.data.summary
    )

  it.effect("a run that repairs, is retried, repairs more, then fails permanently: failed, with every attempt's reported repairs", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
      const batch = yield* fake(Duration.minutes(5), (n) =>
        Effect.gen(function*() {
          yield* reportProgress({ repaired: n, ids: [n] })
          return yield* (n === 1
            ? transient
            : new RedisError({
              operation: "test",
              cause: new Error("WRONGTYPE Operation against a key holding the wrong kind of value")
            }))
        }))
      const result = yield* guarded(batch)
      assert.strictEqual(result.outcome, "failed")
      assert.include(result.error, "WRONGTYPE")
      assert.deepStrictEqual(result.summary, { repaired: 3, ids: [1, 2] })
      assert.deepStrictEqual(yield* finishedSummary(batch.name), { repaired: 3, ids: [1, 2] })
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("retries exhausted: failed, with the repairs of all four attempts", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
      const batch = yield* fake(Duration.minutes(5), () => Effect.andThen(reportProgress({ repaired: 1 }), transient))
      const result = yield* guarded(batch)
      assert.strictEqual(result.outcome, "failed")
      assert.deepStrictEqual(result.summary, { repaired: 4 })
      assert.deepStrictEqual(yield* finishedSummary(batch.name), { repaired: 4 })
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a run that repairs, is retried, repairs more, then exceeds its budget: timed_out, with every attempt's reported repairs", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
      const batch = yield* fake(Duration.seconds(1), (n) =>
        Effect.gen(function*() {
          yield* reportProgress({ repaired: 2 })
          if (n === 1) return yield* transient
          return yield* Effect.never
        }))
      const result = yield* guarded(batch)
      assert.strictEqual(result.outcome, "timed_out")
      assert.deepStrictEqual(result.summary, { repaired: 4 })
      assert.deepStrictEqual(yield* finishedSummary(batch.name), { repaired: 4 })
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a run that loses its lease after repairs: failed (lease lost), with the repairs it made", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
      const batch = yield* fake(
        Duration.minutes(5),
        () => Effect.andThen(reportProgress({ repaired: 5 }), new LeaseLost({ lease: "sweeper/fake", epoch: 1 }))
      )
      const result = yield* guarded(batch)
      assert.strictEqual(result.outcome, "failed")
      assert.strictEqual(result.reason, "lease lost")
      assert.deepStrictEqual(result.summary, { repaired: 5 })
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a failed run that reported nothing keeps summary null", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
      const batch = yield* fake(Duration.minutes(5), () =>
        new RedisError({ operation: "test", cause: new Error("ERR syntax error") }))
      const result = yield* guarded(batch)
      assert.strictEqual(result.outcome, "failed")
      assert.isNull(result.summary)
      assert.isNull(yield* finishedSummary(batch.name))
    }).pipe(Effect.provide(MemoryPlatform())))

  it("addSummaries: merged lists keep their first SUMMARY_LIST_CAP entries like every summary list", () => {
    const earlier = { ids: Array.from({ length: SUMMARY_LIST_CAP - 1 }, (_, i) => i), n: 1, name: "a" }
    const later = { ids: [-1, -2], n: 2, name: "b" }
    const merged = addSummaries(earlier, later) as { ids: Array<number>; n: number; name: string }
    assert.lengthOf(merged.ids, SUMMARY_LIST_CAP)
    assert.deepStrictEqual(merged.ids.slice(-2), [SUMMARY_LIST_CAP - 2, -1])
    assert.strictEqual(merged.n, 3)
    assert.strictEqual(merged.name, "b")
    assert.deepStrictEqual(addSummaries({ a: { b: 1 } }, { a: { b: 2, c: true } }), { a: { b: 3, c: true } })
  })
})
