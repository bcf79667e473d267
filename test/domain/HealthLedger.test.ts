/**
 * The holds the event log leaves open (domain/HealthLedger.ts): a RepairHeld is closed by its own
 * run's RepairReleased, not another run's; a run's RunFinished says when its unreleased hold ended.
 */
import { assert, describe, it } from "@effect/vitest"
import { heldUntilEnd, type LedgerEvent, leftOpen } from "../../src/domain/HealthLedger.ts"

const event = (type: string, runId: string | null, at: number, data: Record<string, unknown> = {}): LedgerEvent => ({
  type,
  runId,
  occurredAt: new Date(at),
  data: { batch: "b", ...data }
})

describe("holds left open in the event log", () => {
  it("a run's RepairReleased closes its own hold on the signal, not another run's", () => {
    const open = leftOpen([
      event("RepairHeld", "r1", 1_000, { signal: "walRate" }),
      event("RepairHeld", "r2", 2_000, { signal: "walRate" }),
      event("RepairReleased", "r2", 3_000, { signal: "walRate", heldMs: 1_000 })
    ])
    assert.deepStrictEqual(open.map((h) => [h.runId, h.signal, h.since, h.finishedAt]), [[
      "r1",
      "walRate",
      1_000,
      null
    ]])
  })

  it("a run's RunFinished says when its unreleased holds ended; held time runs to it, not to now", () => {
    const [hold] = leftOpen([
      event("RepairHeld", "r1", 1_000, { signal: "replicationLag", value: 9e6 }),
      event("RunFinished", "r1", 61_000)
    ])
    assert.strictEqual(hold!.finishedAt, 61_000)
    assert.strictEqual(hold!.held.value, 9e6)
    assert.strictEqual(heldUntilEnd(hold!, 3_600_000), 60_000)
  })

  it("a hold whose run has not finished is held until now", () => {
    const [hold] = leftOpen([
      event("RepairHeld", "r1", 1_000, { signal: "walRate" }),
      event("RunFinished", "r2", 5_000)
    ])
    assert.strictEqual(hold!.finishedAt, null)
    assert.strictEqual(heldUntilEnd(hold!, 11_000), 10_000)
  })

  it("a hold released in the log is not left open", () => {
    assert.deepStrictEqual(
      leftOpen([
        event("RepairHeld", "r1", 1_000, { signal: "walRate" }),
        event("RepairReleased", "r1", 2_000, { signal: "walRate" }),
        event("RunFinished", "r1", 3_000)
      ]),
      []
    )
  })
})
