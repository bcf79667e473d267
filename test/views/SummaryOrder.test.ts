/**
 * One reading order for a run's summary wherever it is shown: the batch's repairs first, as it
 * declares them, then its other counts by name, the health gate's last; a dry run's repairs say what
 * it would do. PostgreSQL's jsonb hands summaries back in its own key order (shorter keys first).
 */
import { assert, describe, it } from "@effect/vitest"
import { summaryInWords } from "../../src/cli/CliPrint.ts"
import { card } from "../../src/http/Dashboard.ts"
import { orderedSummary, summaryKeyOrder } from "../../src/views/SummaryOrder.ts"

/** drop-canceling-builds' summary as jsonb returns it. */
const fromJsonb = { doomed: 0, heldMs: 0, batches: 1, dropped: 5 }

describe("summary reading order", () => {
  it("repairs as the batch declares them, then the rest by name, the health gate last", () => {
    assert.deepStrictEqual(Object.keys(orderedSummary(fromJsonb, "drop-canceling-builds") as object), [
      "dropped",
      "doomed",
      "batches",
      "heldMs"
    ])
    assert.deepStrictEqual(summaryKeyOrder(["heldBy", "zeta", "alpha", "pruned"], ["pruned"]), [
      "pruned",
      "alpha",
      "zeta",
      "heldBy"
    ])
    // A batch nobody registered (an old event): by name, the gate last.
    assert.deepStrictEqual(Object.keys(orderedSummary({ b: 1, heldMs: 0, a: 2 }, "gone") as object), [
      "a",
      "b",
      "heldMs"
    ])
  })

  it("the CLI leads with the main count; a dry run's counts say what it would do", () => {
    assert.strictEqual(
      summaryInWords(fromJsonb, "drop-canceling-builds", false),
      "dropped 5, doomed 0, batches 1, held by the gate for 0 ms"
    )
    assert.strictEqual(
      summaryInWords(fromJsonb, "drop-canceling-builds", true),
      "would drop 5, would doom 0, batches 1, held by the gate for 0 ms"
    )
  })

  it("the console's card leads with the main count too", () => {
    const html = card(
      {
        name: "drop-canceling-builds",
        description: "",
        cron: "*/30 * * * *",
        cronInWords: "every 30 minutes",
        timezone: "UTC",
        state: "idle",
        nextTicks: [],
        lastRun: {
          runId: "r1",
          outcome: "succeeded",
          finishedAt: "2026-11-25T17:56:41.000Z",
          durationMs: 60,
          summary: fromJsonb,
          reason: null,
          error: null
        },
        consecutiveFailures: 0
      } as unknown as Parameters<typeof card>[0]
    )
    const keys = [...html.matchAll(/data-key="(\w+)"/g)].map((match) => match[1])
    assert.deepStrictEqual(keys, ["dropped", "doomed", "batches", "heldMs"])
  })
})
