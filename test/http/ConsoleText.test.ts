/**
 * The console's words and numbers: one date format, summary keys as words with durations for the
 * `…Ms` ones, right plurals, and the history window a batch page opens on chosen from its runs (the
 * last hour for a batch running every few seconds, as in the demo, so its marks do not collapse
 * into one bar at the edge of a day).
 */
import { assert, describe, it } from "@effect/vitest"
import { chooseWindow } from "../../src/http/Charts.ts"
import { card, plural, summaryLabel } from "../../src/http/Dashboard.ts"
import type { RunPoint } from "../../src/services/RunHistory.ts"
import { formatUtc } from "../../src/views/Time.ts"

const now = new Date("2026-11-25T18:00:00Z")
const finishedAgo = (ms: number): RunPoint => ({
  runId: `run-${ms}`,
  startedAt: null,
  finishedAt: new Date(now.getTime() - ms),
  durationMs: 10,
  outcome: "succeeded",
  repairs: 1,
  dryRun: false
})

describe("console text", () => {
  it("one date format, always with seconds and UTC, so ticks of minute and seconds crons line up", () => {
    assert.strictEqual(formatUtc("2026-11-25T17:56:00.000Z"), "2026-11-25 17:56:00 UTC")
    assert.strictEqual(formatUtc("2026-11-25T17:56:41.123Z"), "2026-11-25 17:56:41 UTC")
  })

  it("summary keys as words; durations for the Ms ones; plurals", () => {
    assert.strictEqual(summaryLabel("skippedNoStore"), "skipped, no object store")
    assert.strictEqual(summaryLabel("heldMs"), "held by the gate for")
    assert.strictEqual(summaryLabel("failed_workers"), "failed workers")
    assert.strictEqual(summaryLabel("invalidEntries"), "invalid entries")
    assert.strictEqual(plural(1, "run"), "1 run")
    assert.strictEqual(plural(0, "repair"), "0 repairs")
  })

  it("a card shows labels, keeps the raw key for scripts, formats held time", () => {
    const view = {
      name: "delete-stale-direct-uploads",
      worker: "w",
      description: "d",
      cron: "*/5 * * * * *",
      cronInWords: "every 5 seconds",
      timezone: "UTC",
      state: "idle",
      disabled: false,
      paused: null,
      breaker: { open: false, until: null },
      nextTick: null,
      nextTicks: [],
      lastRun: {
        runId: "r1",
        outcome: "succeeded",
        finishedAt: "2026-11-25T17:56:41.000Z",
        durationMs: 60,
        summary: { skippedNoStore: 2, heldMs: 1500, totalDeletedStaleEntries: 4 },
        reason: null,
        error: null
      },
      lastOutcome: "succeeded",
      openRun: null,
      lastSuccessAt: null,
      consecutiveFailures: 0,
      config: { budget: "25m", lease: null, missedRuns: "run-latest-if-recent" }
    } as unknown as Parameters<typeof card>[0]
    const html = card(view)
    assert.notInclude(html, ">skippedNoStore<")
    assert.include(html, "skipped, no object store</span> 2")
    assert.include(html, "held by the gate for</span> 1.5 s")
    assert.include(html, "data-key=\"skippedNoStore\" data-value=\"2\"")
    assert.include(html, "data-last-run=\"r1\"")

    // Before the first backlog sample the card does not claim that nothing waits.
    const unread = { batch: view.name, what: "w", count: 0, capped: false, oldestAt: null, parts: [] }
    const before = card({
      ...view,
      backlog: { ...unread, stale: false, note: null, error: null, sampledAt: null }
    })
    assert.notInclude(before, "nothing waits")
    assert.include(before, "not read yet")
    assert.include(before, "data-backlog=\"\"")
    const after = card({
      ...view,
      backlog: { ...unread, stale: false, note: null, error: null, sampledAt: new Date(now) }
    })
    assert.include(after, "nothing waits")
    assert.include(after, "data-backlog=\"0\"")
  })

  it("the window a batch page opens on comes from its runs", () => {
    const everyFiveSeconds = Array.from({ length: 40 }, (_, i) => finishedAgo(i * 5_000))
    assert.strictEqual(chooseWindow(everyFiveSeconds, now), "1h")
    const justStarted = [finishedAgo(2_000), finishedAgo(7_000)]
    assert.strictEqual(chooseWindow(justStarted, now), "1h")
    const hourly = Array.from({ length: 24 }, (_, i) => finishedAgo(i * 3600_000 + 60_000))
    assert.strictEqual(chooseWindow(hourly, now), "24h")
    assert.strictEqual(chooseWindow([], now), "7d")
  })
})
