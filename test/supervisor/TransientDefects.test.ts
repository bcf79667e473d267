/**
 * The run guard retries a lost connection even when it surfaces as a defect (a transaction's failed
 * ROLLBACK on a dead connection), and still never retries bugs, permanent SQL errors or LeaseLost.
 */
import { assert, describe, it } from "@effect/vitest"
import { Cause, Duration, Effect, Fiber, Option, Ref } from "effect"
import { ConnectionError, SqlError, SqlSyntaxError } from "effect/sql/SqlError"
import { TestClock } from "effect/testing"
import { randomUUID } from "node:crypto"
import type { Batch } from "../../src/domain/Batch.ts"
import { LeaseLost } from "../../src/domain/Errors.ts"
import { runBatch, transientDefectsAsFailures } from "../../src/supervisor/RunGuard.ts"
import { MemoryPlatform } from "../support/memory.ts"

const lost = () =>
  new SqlError({
    reason: new ConnectionError({ cause: new Error("Connection closed"), message: "PgConnection: Connection closed" })
  })
const syntax = () =>
  new SqlError({
    reason: new SqlSyntaxError({
      cause: Object.assign(new Error("relation does not exist"), { code: "42P01" }),
      message: "PgConnection: Query failed"
    })
  })

/** What a cut connection inside `withTransaction` gives: the statement's error, then ROLLBACK's defect. */
const cutTransaction = Effect.failCause(Cause.combine(Cause.fail(lost()), Cause.die(lost())))

const fake = <S, E>(run: Effect.Effect<S, E>): Batch<S, E, never> => ({
  name: `fake-${randomUUID().slice(0, 8)}`,
  worker: "FakeWorker",
  description: "a fake batch",
  cron: "* * * * *",
  budget: Duration.minutes(1),
  lease: Option.none(),
  run
})

const attemptsThen = <S>(failures: number, failure: Effect.Effect<never, unknown>, success: S) =>
  Effect.gen(function*() {
    const attempts = yield* Ref.make(0)
    const run = Effect.gen(function*() {
      const n = yield* Ref.updateAndGet(attempts, (k) => k + 1)
      if (n <= failures) return yield* failure
      return success
    })
    return { attempts, run }
  })

const guard = <S, E>(batch: Batch<S, E, never>) =>
  Effect.gen(function*() {
    const fiber = yield* Effect.forkChild(runBatch(batch, { trigger: "manual" }))
    yield* TestClock.adjust("1 minute")
    return yield* Fiber.join(fiber)
  })

describe("transient defects", () => {
  it.effect("a cut transaction (failure + ROLLBACK defect) is retried and the run succeeds", () =>
    Effect.gen(function*() {
      const { attempts, run } = yield* attemptsThen(2, cutTransaction, { ok: true })
      const result = yield* guard(fake(run))
      assert.strictEqual(result.outcome, "succeeded", result.error)
      assert.strictEqual(yield* Ref.get(attempts), 3)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a lone defect carrying a lost connection is retried", () =>
    Effect.gen(function*() {
      const { attempts, run } = yield* attemptsThen(1, Effect.die(lost()), "done")
      const result = yield* guard(fake(run))
      assert.strictEqual(result.outcome, "succeeded", result.error)
      assert.strictEqual(yield* Ref.get(attempts), 2)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a permanent SQL error (42P01) is not retried, also as a defect", () =>
    Effect.gen(function*() {
      for (
        const failure of [
          Effect.fail(syntax()),
          Effect.die(syntax()),
          Effect.failCause(Cause.combine(Cause.fail(syntax()), Cause.die(lost())))
        ]
      ) {
        const { attempts, run } = yield* attemptsThen(1, failure, "done")
        const result = yield* guard(fake(run))
        assert.strictEqual(result.outcome, "failed")
        assert.strictEqual(yield* Ref.get(attempts), 1)
      }
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a bug beside a lost connection is not retried", () =>
    Effect.gen(function*() {
      const { attempts, run } = yield* attemptsThen(
        1,
        Effect.failCause(Cause.combine(Cause.fail(lost()), Cause.die(new TypeError("x is undefined")))),
        "done"
      )
      const result = yield* guard(fake(run))
      assert.strictEqual(result.outcome, "failed")
      assert.strictEqual(yield* Ref.get(attempts), 1)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("LeaseLost beside a ROLLBACK defect stays LeaseLost", () =>
    Effect.gen(function*() {
      const leaseLost = new LeaseLost({ lease: "x", epoch: 1 })
      const exit = yield* Effect.exit(
        transientDefectsAsFailures(Effect.failCause(Cause.combine(Cause.fail(leaseLost), Cause.die(lost()))))
      )
      assert.isTrue(exit._tag === "Failure" && Option.getOrUndefined(Cause.findErrorOption(exit.cause)) === leaseLost)
      assert.isTrue(exit._tag === "Failure" && Cause.hasDies(exit.cause), "the cause is left as it was")
    }))
})
