/**
 * prune-events on the memory platform under TestClock: what goes (events strictly older than
 * now − retention, except those batch state folds from), in pages, each with its EventsPruned; the
 * boundary to the millisecond; dry run; budget; lease held; lease lost between pages; and every
 * batch's folded state the same before and after.
 */
import { assert, describe, it } from "@effect/vitest"
import { DateTime, Duration, Effect } from "effect"
import { TestClock } from "effect/testing"
import { foldHistory, unfinishedRuns } from "../../src/domain/BatchState.ts"
import type { StoredEvent } from "../../src/domain/Events.ts"
import { leaseKey } from "../../src/domain/Lease.ts"
import { PrunePageSize } from "../../src/domain/Retention.ts"
import { MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { PruneEvents } from "../../src/programs/PruneEvents.ts"
import { runBatch } from "../../src/supervisor/RunGuard.ts"
import { randomHistory } from "../support/eventHistory.ts"
import { MemoryPlatform } from "../support/memory.ts"

const NOW = DateTime.makeUnsafe("2026-06-01T00:00:00Z")
const NOW_MS = DateTime.toEpochMillis(NOW)
const DAY = 86_400_000
const CUTOFF = NOW_MS - 90 * DAY

/** Seeds events at the given times (ms), on `build:<n>` streams: no state depends on them. */
const seedRepairs = (times: ReadonlyArray<number>) =>
  Effect.gen(function*() {
    yield* TestClock.setTime(NOW_MS)
    const events = yield* MemoryEvents
    for (const time of times) {
      const id = events.length + 1
      events.push({
        id,
        stream: `build:${id}`,
        type: "BuildDropped",
        data: { id },
        runId: null,
        occurredAt: new Date(time)
      })
    }
  })

const guarded = (options: { dryRun?: boolean; budget?: Duration.Duration } = {}) =>
  Effect.gen(function*() {
    yield* TestClock.setTime(NOW_MS)
    return yield* runBatch(PruneEvents, { trigger: "manual", ...options })
  })

const streamsOf = (events: ReadonlyArray<StoredEvent>) =>
  [...new Set(events.map((e) => e.stream))].filter((s) => s.startsWith("batch:"))

describe("prune-events", () => {
  it.effect("nothing to do: every event is within the retention period", () =>
    Effect.gen(function*() {
      yield* seedRepairs([CUTOFF, NOW_MS - DAY])
      const summary = yield* PruneEvents.run
      assert.deepStrictEqual(summary, {
        before: new Date(CUTOFF).toISOString(),
        pruned: 0,
        keptForState: 0,
        pages: 0,
        executionTimeout: false,
        skippedLocked: 0,
        heldMs: 0,
        heldBy: []
      })
      assert.lengthOf(yield* MemoryEvents, 2)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("boundary: exactly 90 days old stays, 1 ms older goes, 1 ms younger stays", () =>
    Effect.gen(function*() {
      yield* seedRepairs([CUTOFF - 1, CUTOFF, CUTOFF + 1])
      const summary = yield* PruneEvents.run
      assert.strictEqual(summary.pruned, 1)
      const left = (yield* MemoryEvents).filter((e) => e.type === "BuildDropped").map((e) => e.occurredAt.getTime())
      assert.deepStrictEqual(left, [CUTOFF, CUTOFF + 1])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("SWEEPER_EVENT_RETENTION sets the cutoff", () =>
    Effect.gen(function*() {
      yield* seedRepairs([NOW_MS - 2 * DAY, NOW_MS - DAY + 1])
      const summary = yield* PruneEvents.run
      assert.strictEqual(summary.before, new Date(NOW_MS - DAY).toISOString())
      assert.strictEqual(summary.pruned, 1)
    }).pipe(Effect.provide(MemoryPlatform({ eventRetention: Duration.days(1) }))))

  it.effect("pages: 25 old events in pages of 10 → three pages, each with its own EventsPruned", () =>
    Effect.gen(function*() {
      yield* seedRepairs(Array.from({ length: 25 }, (_, i) => CUTOFF - DAY - i * 1000))
      const result = yield* guarded().pipe(Effect.provideService(PrunePageSize, 10))
      assert.strictEqual(result.outcome, "succeeded")
      assert.deepStrictEqual(result.summary, {
        before: new Date(CUTOFF).toISOString(),
        pruned: 25,
        keptForState: 0,
        pages: 3,
        executionTimeout: false,
        skippedLocked: 0,
        heldMs: 0,
        heldBy: []
      })
      const events = yield* MemoryEvents
      assert.deepStrictEqual(events.map((e) => e.type), [
        "RunStarted",
        "EventsPruned",
        "EventsPruned",
        "EventsPruned",
        "RunFinished"
      ])
      assert.deepStrictEqual(
        events.filter((e) => e.type === "EventsPruned").map((e) => [e.stream, e.data]),
        [10, 10, 5].map((count) => ["retention:sweeper_events", { before: new Date(CUTOFF).toISOString(), count }])
      )
      // The run's own events are all there, under its id.
      assert.isTrue(events.every((e) => e.runId === result.runId))
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("dry run: reports how many would go, deletes nothing, takes no lease", () =>
    Effect.gen(function*() {
      yield* seedRepairs([CUTOFF - 5, CUTOFF - 4, NOW_MS])
      const redis = yield* MemoryRedis
      redis.set(leaseKey("sweeper/prune_events"), "someone-else", { exSeconds: 900 })
      const result = yield* guarded({ dryRun: true })
      assert.strictEqual(result.outcome, "succeeded")
      assert.deepStrictEqual(result.summary, {
        before: new Date(CUTOFF).toISOString(),
        pruned: 2,
        keptForState: 0,
        pages: 0,
        executionTimeout: false,
        skippedLocked: 0,
        heldMs: 0,
        heldBy: []
      })
      assert.lengthOf((yield* MemoryEvents).filter((e) => e.type === "BuildDropped"), 3)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("lease held elsewhere → skipped, nothing deleted", () =>
    Effect.gen(function*() {
      yield* seedRepairs([CUTOFF - 5])
      const redis = yield* MemoryRedis
      redis.set(leaseKey("sweeper/prune_events"), "someone-else", { exSeconds: 900 })
      const result = yield* guarded()
      assert.strictEqual(result.outcome, "skipped")
      assert.strictEqual(result.reason, "lease held")
      assert.lengthOf((yield* MemoryEvents).filter((e) => e.type === "BuildDropped"), 1)
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("lease taken over between pages: the page in flight commits, nothing after it; LeaseLost recorded", () =>
    Effect.gen(function*() {
      yield* seedRepairs(Array.from({ length: 25 }, (_, i) => CUTOFF - DAY - i * 1000))
      const redis = yield* MemoryRedis
      const events = yield* MemoryEvents
      // When the first EventsPruned is appended, another process takes the lease.
      const push = events.push.bind(events)
      events.push = (...items: Array<StoredEvent>) => {
        if (items.some((e) => e.type === "EventsPruned")) {
          redis.set(leaseKey("sweeper/prune_events"), "other", { exSeconds: 900 })
        }
        return push(...items)
      }
      const result = yield* guarded().pipe(Effect.provideService(PrunePageSize, 10))
      assert.strictEqual(result.outcome, "failed")
      assert.strictEqual(result.reason, "lease lost")
      assert.lengthOf(events.filter((e) => e.type === "BuildDropped"), 15)
      assert.deepStrictEqual(events.filter((e) => e.type !== "BuildDropped").map((e) => e.type), [
        "RunStarted",
        "EventsPruned",
        "LeaseLost",
        "RunFinished"
      ])
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("budget: stops after the page that spends it (executionTimeout), the next run carries on", () =>
    Effect.gen(function*() {
      yield* seedRepairs(Array.from({ length: 25 }, (_, i) => CUTOFF - DAY - i * 1000))
      const first = yield* guarded({ budget: Duration.zero }).pipe(Effect.provideService(PrunePageSize, 10))
      assert.deepStrictEqual(first.summary, {
        before: new Date(CUTOFF).toISOString(),
        pruned: 10,
        keptForState: 0,
        pages: 1,
        executionTimeout: true,
        skippedLocked: 0,
        heldMs: 0,
        heldBy: []
      })
      const second = yield* guarded().pipe(Effect.provideService(PrunePageSize, 10))
      assert.deepStrictEqual(second.summary, {
        before: new Date(CUTOFF).toISOString(),
        pruned: 15,
        keptForState: 0,
        pages: 2,
        executionTimeout: false,
        skippedLocked: 0,
        heldMs: 0,
        heldBy: []
      })
    }).pipe(Effect.provide(MemoryPlatform())))

  it.effect("every batch's folded state is the same after a prune; the prune's own run is intact", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(NOW_MS)
      const events = yield* MemoryEvents
      // ~200 days of history ending at NOW.
      for (const event of randomHistory(42, { start: new Date(NOW_MS - 200 * DAY), steps: 800, stepMinutes: 360 })) {
        if (event.occurredAt.getTime() < NOW_MS) events.push({ ...event, id: events.length + 1 })
      }
      const fold = (stream: string) => {
        const mine = events.filter((e) => e.stream === stream)
        return { history: foldHistory(mine), unfinished: unfinishedRuns(mine).map((r) => r.runId).sort() }
      }
      const streams = streamsOf(events)
      const before = Object.fromEntries(streams.map((s) => [s, fold(s)]))
      const old = events.filter((e) => e.occurredAt.getTime() < CUTOFF).length
      const result = yield* guarded().pipe(Effect.provideService(PrunePageSize, 50))
      assert.strictEqual(result.outcome, "succeeded")
      const summary = result.summary as { pruned: number; keptForState: number }
      assert.strictEqual(summary.pruned + summary.keptForState, old)
      assert.isAbove(summary.pruned, old / 2)
      for (const stream of streams) assert.deepStrictEqual(fold(stream), before[stream], stream)
      assert.isTrue(events.every((e) => e.occurredAt.getTime() >= CUTOFF || e.stream.startsWith("batch:")))
      const own = events.filter((e) => e.runId === result.runId).map((e) => e.type)
      assert.deepStrictEqual([own[0], own.at(-1)], ["RunStarted", "RunFinished"])
      // A second prune finds nothing more to delete.
      const again = yield* guarded().pipe(Effect.provideService(PrunePageSize, 50))
      assert.strictEqual((again.summary as { pruned: number }).pruned, 0)
    }).pipe(Effect.provide(MemoryPlatform())))
})
