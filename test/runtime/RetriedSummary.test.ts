/**
 * A run the guard retries after a transient error reports the work of all its attempts: programs
 * report what they did as they go (`reportProgress`), and the final summary is the last attempt's
 * plus what the failed attempts reported (numbers add, booleans OR, lists concatenate, capped).
 */
import { assert, describe, it } from "@effect/vitest"
import { DateTime, Duration, Effect, Fiber, Option, Ref } from "effect"
import { TestClock } from "effect/testing"
import { randomUUID } from "node:crypto"
import { type Batch, reportProgress } from "../../src/domain/Batch.ts"
import { RedisError } from "../../src/domain/Errors.ts"
import { addSummaries, SUMMARY_LIST_CAP } from "../../src/domain/Summary.ts"
import { type BuildRecord, MemoryBuilds } from "../../src/layers/memory/BuildsMemory.ts"
import { MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import { DropCancelingBuilds } from "../../src/programs/DropCancelingBuilds.ts"
import { runBatch } from "../../src/runtime/RunGuard.ts"
import { Builds } from "../../src/services/Builds.ts"
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
      const state = yield* MemoryBuilds
      const old = DateTime.subtractDuration(NOW, Duration.hours(2))
      for (let id = 1; id <= 5; id++) {
        state.rows.set(id, {
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
        } satisfies BuildRecord)
      }
      // The connection drops on the 4th write, once.
      const builds = yield* Builds
      let drops = 0
      const flaky = Builds.of({
        ...builds,
        drop: (build, now) => ++drops === 4 ? Effect.fail(transient as never) : builds.drop(build, now)
      })
      const batch = { ...DropCancelingBuilds, run: DropCancelingBuilds.run.pipe(Effect.provideService(Builds, flaky)) }
      const result = yield* guarded(batch)
      assert.strictEqual(result.outcome, "succeeded")
      assert.deepStrictEqual(result.summary, { dropped: 5, doomed: 0, batches: 1 })
      assert.isTrue([...state.rows.values()].every((row) => row.status === "failed"))
      const dropped = (yield* MemoryEvents).filter((e) => e.type === "BuildDropped")
      assert.lengthOf(dropped, 5)
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
