/**
 * What a prune may delete (domain/Retention.ts): everything older than the cutoff except the events
 * batch state is folded from. The property: over random multi-month histories and any cutoff, every
 * batch's `foldHistory` and `unfinishedRuns` are the same after the prune as before it.
 */
import { assert, describe, it } from "@effect/vitest"
import { DateTime, Duration } from "effect"
import { foldHistory, unfinishedRuns } from "../../src/domain/BatchState.ts"
import type { StoredEvent } from "../../src/domain/Events.ts"
import { keptForState, prunable, pruneCutoff } from "../../src/domain/Retention.ts"
import { randomHistory, type SeedEvent } from "../support/eventHistory.ts"

const stored = (events: ReadonlyArray<SeedEvent>): ReadonlyArray<StoredEvent> =>
  events.map((e, i) => ({ ...e, id: i + 1 }))

const streams = (events: ReadonlyArray<StoredEvent>) =>
  [...new Set(events.map((e) => e.stream))].filter((s) => s.startsWith("batch:"))

const stateOf = (events: ReadonlyArray<StoredEvent>, stream: string) => {
  const mine = events.filter((e) => e.stream === stream)
  return {
    history: foldHistory(mine),
    unfinished: unfinishedRuns(mine).map((run) => run.runId).sort()
  }
}

const prune = (events: ReadonlyArray<StoredEvent>, before: Date) => {
  const gone = new Set(prunable(events, before).map((e) => e.id))
  return events.filter((e) => !gone.has(e.id))
}

const START = new Date("2026-01-01T00:00:00Z")

describe("pruning keeps every batch's folded state", () => {
  it("over 300 random histories (about 200 days each) and cutoffs across them", () => {
    let deleted = 0
    let total = 0
    for (let seed = 1; seed <= 300; seed++) {
      const events = stored(randomHistory(seed, { start: START, steps: 400, stepMinutes: 720 }))
      const end = Math.max(...events.map((e) => e.occurredAt.getTime()))
      for (const fraction of [0.1, 0.5, 0.9, 1.01]) {
        const before = new Date(START.getTime() + (end - START.getTime()) * fraction)
        const after = prune(events, before)
        for (const stream of streams(events)) {
          assert.deepStrictEqual(
            stateOf(after, stream),
            stateOf(events, stream),
            `seed ${seed}, cutoff ${before.toISOString()}, ${stream}`
          )
        }
        // Nothing at or after the cutoff goes.
        for (const event of events) {
          if (event.occurredAt.getTime() >= before.getTime()) {
            assert.isTrue(after.includes(event), `seed ${seed}: event ${event.id} is not older than the cutoff`)
          }
        }
        deleted += events.length - after.length
        total += events.length
      }
    }
    // The rule keeps little: most old events do go (a rule that kept everything would pass above).
    assert.isAbove(deleted / total, 0.35)
  })

  it("everything older than the cutoff that no state depends on goes: repair streams by age alone", () => {
    const events = stored(randomHistory(7, { start: START, steps: 400, stepMinutes: 720 }))
    const before = new Date(START.getTime() + 100 * 86_400_000)
    const gone = new Set(prunable(events, before).map((e) => e.id))
    for (const event of events) {
      if (!event.stream.startsWith("batch:")) {
        assert.strictEqual(gone.has(event.id), event.occurredAt < before, `event ${event.id}`)
      }
    }
  })
})

describe("keptForState", () => {
  const event = (
    id: number,
    type: string,
    data: Record<string, unknown>,
    runId: string | null = null,
    day = id
  ): StoredEvent => ({
    id,
    stream: "batch:b",
    type,
    data,
    runId,
    occurredAt: new Date(START.getTime() + day * 86_400_000)
  })
  const run = (id: number, runId: string, outcome: string, extra: Record<string, unknown> = {}) => [
    event(id, "RunStarted", { run_id: runId, scheduled_at: null, node: "n", dryRun: false, ...extra }, runId),
    event(id + 1, "RunFinished", { outcome, summary: null, duration_ms: 1, dryRun: false, ...extra }, runId)
  ]

  it("a pause from long ago stays while the batch is paused; the older pause and resume go", () => {
    const events = [
      event(1, "BatchPaused", { by: "a" }),
      event(2, "BatchResumed", { by: "a" }),
      event(3, "BatchPaused", { by: "b" }),
      ...run(10, "r1", "succeeded")
    ]
    assert.deepStrictEqual([...keptForState(events)].sort((a, b) => a - b), [2, 3, 10, 11])
    assert.isTrue(foldHistory(prune(events, new Date("2027-01-01T00:00:00Z"))).paused)
  })

  it("the last success and every failure since stay (consecutiveFailures, the breaker); older runs go", () => {
    const events = [
      ...run(1, "r1", "failed"),
      ...run(3, "r2", "succeeded"),
      ...run(5, "r3", "failed"),
      ...run(7, "r4", "skipped"),
      ...run(9, "r5", "timed_out")
    ]
    const kept = [...keptForState(events)].sort((a, b) => a - b)
    // r2's success, r3's failure, r5 (start: newest; finish: newest and a failure); r4's skip goes.
    assert.deepStrictEqual(kept, [4, 6, 9, 10])
    const after = prune(events, new Date("2027-01-01T00:00:00Z"))
    assert.strictEqual(foldHistory(after).consecutiveFailures, 2)
    assert.deepStrictEqual(foldHistory(after), foldHistory(events))
  })

  it("a run killed before its RunFinished stays open (abandoned-run detection still finds it)", () => {
    const events = [
      event(
        1,
        "RunStarted",
        { run_id: "killed", scheduled_at: null, node: "n", dryRun: false, budget_ms: 1000 },
        "killed"
      ),
      ...run(2, "r2", "succeeded")
    ]
    const after = prune(events, new Date("2027-01-01T00:00:00Z"))
    assert.deepStrictEqual(unfinishedRuns(after).map((r) => r.runId), ["killed"])
  })

  it("a tick recorded missed late (older tick, newer event) does not lower lastCoveredTick", () => {
    const events = [
      event(1, "TickMissed", { scheduled_at: "2026-03-01T00:00:00.000Z", reason: "downtime" }),
      event(2, "TickMissed", { scheduled_at: "2026-02-01T00:00:00.000Z", reason: "downtime" })
    ]
    assert.deepStrictEqual([...keptForState(events)], [1])
    const after = prune(events, new Date("2027-01-01T00:00:00Z"))
    assert.deepStrictEqual(foldHistory(after).lastCoveredTick, new Date("2026-03-01T00:00:00.000Z"))
  })
})

describe("pruneCutoff", () => {
  const now = DateTime.makeUnsafe("2026-06-01T00:00:00Z")
  it("is now − retention (events strictly older go)", () => {
    assert.deepStrictEqual(pruneCutoff(now, now, Duration.days(90)), new Date("2026-03-03T00:00:00Z"))
  })
  it("a decision time in the past moves it back; one in the future never moves it into the retention period", () => {
    assert.deepStrictEqual(
      pruneCutoff(DateTime.makeUnsafe("2026-05-01T00:00:00Z"), now, Duration.days(1)),
      new Date("2026-04-30T00:00:00Z")
    )
    assert.deepStrictEqual(
      pruneCutoff(DateTime.makeUnsafe("2027-01-01T00:00:00Z"), now, Duration.days(1)),
      new Date("2026-05-31T00:00:00Z")
    )
  })
})
