/**
 * Rows skipped as locked by another transaction, tallied the same way by every batch that skips
 * them (repair/LockedRowTally.ts), on memory layers under the run guard: each row is counted once
 * per run (a retried attempt meeting it again counts nothing more, in the summary's
 * `skippedLocked` as across runs), runs in a row add up to a warning from the 3rd, and a run that
 * gets past the row (repairs it, or finds it no longer a candidate) forgets its count.
 */
import { assert, describe, it } from "@effect/vitest"
import { DateTime, Duration, Effect, Fiber, Logger, References } from "effect"
import { TestClock } from "effect/testing"
import type { Batch } from "../../src/domain/Batch.ts"
import { RedisError } from "../../src/domain/Errors.ts"
import { type BuildRecord, MemoryBuilds } from "../../src/layers/memory/BuildsMemory.ts"
import { type FamilyBuildRecord, MemoryStuckBuilds } from "../../src/layers/memory/StuckBuildsMemory.ts"
import { DropCancelingBuilds } from "../../src/programs/DropCancelingBuilds.ts"
import { DropRunningBuilds } from "../../src/programs/DropRunningBuilds.ts"
import { LockedRows } from "../../src/services/LockedRows.ts"
import { runBatch, type RunOptions } from "../../src/supervisor/RunGuard.ts"
import { MemoryPlatform } from "../support/memory.ts"

const NOW = DateTime.makeUnsafe("2026-03-01T12:00:00Z")
const transient = new RedisError({ operation: "test", cause: new Error("read ECONNRESET") })

/** A batch that skips locked rows, with the memory table it reads staged by the test. */
/** What staging the memory tables needs. */
type Tables = MemoryBuilds | MemoryStuckBuilds

/** A batch that skips locked rows, with the memory table it reads staged by the test. */
interface Fixture {
  readonly name: string
  // Whatever the batch needs, the memory platform provides.
  readonly batch: Batch<unknown, unknown, any>
  /** A row the batch repairs, stuck for two hours at the clock's now; its id. */
  readonly stuck: Effect.Effect<number, never, Tables>
  /** Another open transaction holds the row (true) or lets go of it (false). */
  readonly hold: (id: number, held: boolean) => Effect.Effect<void, never, Tables>
  /** Someone else touches the row now: it is no longer a candidate (until it is stuck again). */
  readonly touch: (id: number) => Effect.Effect<void, never, Tables>
  /** The row is stuck again, as for `stuck`. */
  readonly stale: (id: number) => Effect.Effect<void, never, Tables>
}

const twoHoursAgo = Effect.map(DateTime.now, (now) => DateTime.subtractDuration(now, Duration.hours(2)))

let nextId = 1

const dropCanceling: Fixture = {
  name: DropCancelingBuilds.name,
  batch: DropCancelingBuilds,
  stuck: Effect.gen(function*() {
    const old = yield* twoHoursAgo
    const row: BuildRecord = {
      id: nextId++,
      projectId: 1,
      runnerId: 7,
      type: "Ci::Build",
      status: "canceling",
      failureReason: null,
      lockVersion: 0,
      createdAt: old,
      updatedAt: old,
      finishedAt: null
    }
    ;(yield* MemoryBuilds).rows.set(row.id, row)
    return row.id
  }),
  hold: (id, held) => Effect.map(MemoryBuilds, (s) => void (held ? s.locked.add(id) : s.locked.delete(id))),
  touch: (id) =>
    Effect.gen(function*() {
      const row = (yield* MemoryBuilds).rows.get(id)
      if (row !== undefined) row.updatedAt = yield* DateTime.now
    }),
  stale: (id) =>
    Effect.gen(function*() {
      const row = (yield* MemoryBuilds).rows.get(id)
      if (row !== undefined) row.updatedAt = yield* twoHoursAgo
    })
}

const dropRunning: Fixture = {
  name: DropRunningBuilds.name,
  batch: DropRunningBuilds,
  stuck: Effect.gen(function*() {
    const old = yield* twoHoursAgo
    const row: FamilyBuildRecord = {
      id: nextId++,
      projectId: 1,
      runnerId: 7,
      status: "running",
      failureReason: null,
      lockVersion: 0,
      createdAt: old,
      updatedAt: old,
      scheduledAt: null,
      finishedAt: null
    }
    ;(yield* MemoryStuckBuilds).rows.set(row.id, row)
    return row.id
  }),
  hold: (id, held) => Effect.map(MemoryStuckBuilds, (s) => void (held ? s.locked.add(id) : s.locked.delete(id))),
  touch: (id) =>
    Effect.gen(function*() {
      const row = (yield* MemoryStuckBuilds).rows.get(id)
      if (row !== undefined) row.updatedAt = yield* DateTime.now
    }),
  stale: (id) =>
    Effect.gen(function*() {
      const row = (yield* MemoryStuckBuilds).rows.get(id)
      if (row !== undefined) row.updatedAt = yield* twoHoursAgo
    })
}

/** One run under the run guard (its retries wait on the clock, so the clock moves on a minute). */
const guarded = <S, E, R>(batch: Batch<S, E, R>, options: Partial<RunOptions> = {}) =>
  Effect.gen(function*() {
    const fiber = yield* Effect.forkChild(runBatch(batch, { trigger: "manual", ...options }))
    yield* TestClock.adjust("1 minute")
    return yield* Fiber.join(fiber)
  })

/** The batch whose first attempt does all its work, then fails as a lost connection would: retried. */
const failingOnceAfterItsWork = <S, E, R>(batch: Batch<S, E, R>): Batch<S, E | RedisError, R> => {
  let attempts = 0
  return {
    ...batch,
    run: Effect.flatMap(batch.run, (summary) => ++attempts === 1 ? transient : Effect.succeed(summary))
  }
}

/** The "run after run" warnings logged while `effect` runs, as [row id, runs]. */
const runAfterRunWarnings = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.gen(function*() {
    const warnings: Array<[unknown, unknown]> = []
    const collector = Logger.make((options) => {
      const message = Array.isArray(options.message) ? options.message : [options.message]
      if (options.logLevel !== "Warn" || !String(message[0]).includes("run after run")) return
      const fields = { ...options.fiber.getRef(References.CurrentLogAnnotations), ...message[1] }
      warnings.push([fields.build_id ?? fields.export_job_id ?? fields.event_id, fields.runs])
    })
    const result = yield* effect.pipe(Effect.provide(Logger.layer([collector])))
    return { result, warnings }
  })

const skippedLocked = (summary: unknown) => (summary as { readonly skippedLocked: number }).skippedLocked

describe.each([dropCanceling, dropRunning])("$name: rows skipped as locked", (fixture) => {
  it.effect("are counted once per run, across runs, and warned about from the 3rd run in a row", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
      const held = yield* fixture.stuck
      yield* fixture.stuck
      yield* fixture.hold(held, true)
      const { result, warnings } = yield* runAfterRunWarnings(Effect.gen(function*() {
        const runs = []
        for (let run = 1; run <= 4; run++) runs.push(yield* guarded(fixture.batch))
        return runs
      }))
      assert.deepStrictEqual(result.map((run) => [run.outcome, skippedLocked(run.summary)]), [
        ["succeeded", 1],
        ["succeeded", 1],
        ["succeeded", 1],
        ["succeeded", 1]
      ])
      assert.deepStrictEqual(warnings, [[held, 3], [held, 4]])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a retried attempt that meets the row again counts nothing more, in the run or across runs", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
      const held = yield* fixture.stuck
      yield* fixture.hold(held, true)
      const { result, warnings } = yield* runAfterRunWarnings(Effect.gen(function*() {
        const retried = yield* guarded(failingOnceAfterItsWork(fixture.batch))
        const second = yield* guarded(fixture.batch)
        const third = yield* guarded(fixture.batch)
        return [retried, second, third]
      }))
      assert.deepStrictEqual(result.map((run) => [run.outcome, skippedLocked(run.summary)]), [
        ["succeeded", 1],
        ["succeeded", 1],
        ["succeeded", 1]
      ])
      // Two attempts, one run: the third run is the row's third run in a row, not its fourth.
      assert.deepStrictEqual(warnings, [[held, 3]])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a run that finds the row no longer a candidate forgets its count: locked again, it starts from 1", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
      const held = yield* fixture.stuck
      yield* fixture.hold(held, true)
      const { warnings } = yield* runAfterRunWarnings(Effect.gen(function*() {
        yield* guarded(fixture.batch)
        yield* guarded(fixture.batch)
        // Let go of and touched by its holder: not stuck, so the next run passes it by.
        yield* fixture.hold(held, false)
        yield* fixture.touch(held)
        yield* guarded(fixture.batch)
        // Stuck again, and held again: three more runs skip it.
        yield* fixture.stale(held)
        yield* fixture.hold(held, true)
        for (let run = 1; run <= 3; run++) yield* guarded(fixture.batch)
      }))
      assert.deepStrictEqual(warnings, [[held, 3]])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("a run cut short by its budget still forgets the rows its pages repaired", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(DateTime.toEpochMillis(NOW))
      const held = yield* fixture.stuck
      yield* fixture.hold(held, true)
      yield* guarded(fixture.batch)
      yield* guarded(fixture.batch)
      assert.deepStrictEqual(yield* (yield* LockedRows).counted(fixture.name), [String(held)])
      yield* fixture.hold(held, false)
      // A second row after it: the one page repairs the held row, and the budget ends the run there.
      yield* fixture.stuck
      const cut = yield* guarded(fixture.batch, { budget: Duration.zero })
      assert.strictEqual(cut.outcome, "succeeded", cut.error)
      assert.deepStrictEqual(yield* (yield* LockedRows).counted(fixture.name), [])
    }).pipe(Effect.provide(MemoryPlatform({ dropBatchSize: 1 }))))
})
