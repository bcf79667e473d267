/** Server-drawn history charts and the card's live lines: one mark per run, numbers in each title. */
import { assert, describe, it } from "@effect/vitest"
import { bucketCharts, historyCharts, niceMax } from "../../src/http/Charts.ts"
import type { RunPoint } from "../../src/services/RunHistory.ts"

const since = new Date("2026-11-23T12:00:00Z")
const until = new Date("2026-11-24T12:00:00Z")
const run = (i: number, outcome = "succeeded"): RunPoint => ({
  runId: `00000000-0000-0000-0000-${String(i).padStart(12, "0")}`,
  startedAt: null,
  finishedAt: new Date(since.getTime() + i * 3600_000),
  durationMs: 1000 * i,
  outcome,
  repairs: i * 10,
  dryRun: false
})

describe("history charts", () => {
  it("one mark per run in each chart, its numbers in a <title>, coloured by outcome", () => {
    const runs = [run(1), run(2, "failed"), run(3), run(23, "timed_out")]
    const svg = historyCharts({ runs, since, until })
    for (const chart of ["repairs", "duration", "outcomes"]) {
      const section = svg.split(`data-chart="${chart}"`)[1]!.split("</figure>")[0]!
      assert.strictEqual(section.match(/class="mark"/g)?.length, 4, chart)
    }
    assert.include(svg, "<title>2026-11-23 14:00:00 UTC · failed · 20 repairs · 2.0 s</title>")
    assert.include(svg, "#c0392b")
    assert.notInclude(svg, "NaN")
  })

  it("no runs: empty charts, no marks, no NaN", () => {
    const svg = historyCharts({ runs: [], since, until })
    assert.notInclude(svg, "class=\"mark\"")
    assert.notInclude(svg, "NaN")
  })

  it("a long window by bucket: one bar per bucket, every run and dry run counted in its title", () => {
    const bucket = (hour: number, runs: number, repairs: number, dryRuns = 0) => ({
      start: new Date(since.getTime() + hour * 3600_000),
      runs,
      dryRuns,
      succeeded: runs - dryRuns,
      failed: 0,
      repairs,
      durationMsMax: 2000,
      durationMsTotal: 2000 * runs
    })
    const svg = bucketCharts({
      buckets: [bucket(0, 720, 5000), bucket(12, 721, 7, 1)],
      bucketMs: 12 * 3600_000,
      since,
      until
    })
    for (const chart of ["repairs", "duration", "runs"]) {
      const section = svg.split(`data-chart="${chart}"`)[1]!.split("</figure>")[0]!
      assert.strictEqual(section.match(/class="mark"/g)?.length, 2, chart)
    }
    assert.include(svg, "<title>2026-11-23 12:00:00 UTC · 720 runs (0 failed) · 5000 repairs · slowest 2.0 s</title>")
    assert.include(svg, "721 runs (0 failed, 1 dry) · 7 repairs")
    assert.notInclude(svg, "NaN")
  })

  it("round axis maxima", () => {
    assert.deepStrictEqual([0, 1, 3, 7, 10, 11, 480, 10_000].map(niceMax), [1, 1, 5, 10, 10, 20, 500, 10_000])
  })
})
