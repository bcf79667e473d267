/** The run page's HTML: timings with holds, the error and its cause, repairs linking to their entities, keyset paging links. */
import { assert, describe, it } from "@effect/vitest"
import { runPage } from "../../src/http/Dashboard.ts"
import type { RunDetail } from "../../src/services/RunHistory.ts"

const RUN = "4b36a462-c4ad-4639-832a-3fe3a22ed107"
const at = (iso: string) => new Date(iso)

const failed: RunDetail = {
  runId: RUN,
  batch: "drop-canceling-builds",
  trigger: "schedule",
  node: "sweeper-1",
  dryRun: false,
  startedAt: at("2026-11-24T03:45:00Z"),
  finishedAt: at("2026-11-24T03:46:10Z"),
  durationMs: 70_000,
  outcome: "failed",
  reason: null,
  summary: { dropped: 200, doomed: 0 },
  error: "SqlError: connection lost\n  caused by: ECONNRESET <db>",
  holds: [
    {
      id: 9,
      stream: "batch:drop-canceling-builds",
      type: "RepairHeld",
      data: { signal: "replicationLag" },
      runId: RUN,
      occurredAt: at("2026-11-24T03:45:30Z")
    },
    {
      id: 10,
      stream: "batch:drop-canceling-builds",
      type: "RepairReleased",
      data: { signal: "replicationLag", heldMs: 20_000 },
      runId: RUN,
      occurredAt: at("2026-11-24T03:45:50Z")
    }
  ],
  repairs: 200,
  pipelines: []
}

const repair = (id: number) => ({
  id,
  stream: `build:${id}`,
  type: "BuildDropped",
  data: { id, project_id: 1, runner_id: null, failure_reason: 3 },
  runId: RUN,
  occurredAt: at("2026-11-24T03:45:10Z")
})

describe("run page", () => {
  it("outcome, trigger, node, timings with holds, summary, the error with its cause (escaped), repairs and the next page", () => {
    const html = runPage(failed, { events: [repair(101), repair(102)], next: 102 }, { type: null, after: undefined })
    for (
      const text of [
        "outcome-failed",
        "schedule",
        "sweeper-1",
        "RepairHeld",
        "RepairReleased",
        "replicationLag",
        "dropped</span> 200",
        "caused by: ECONNRESET &lt;db&gt;"
      ]
    ) {
      assert.include(html, text)
    }
    assert.include(html, `<a class="entity" href="/?stream=build%3A101#history">build:101</a>`)
    assert.include(html, `<a rel="next" href="/runs/${RUN}?after=102">Next page</a>`)
    assert.notInclude(html, "First page")
  })

  it("lists the pipelines the run's drops touched (none: no row), and says when there were more", () => {
    assert.notInclude(runPage(failed, { events: [], next: null }, { type: null, after: undefined }), "Pipelines")
    const touched = runPage({ ...failed, pipelines: [500, 502] }, { events: [], next: null }, {
      type: null,
      after: undefined
    })
    assert.include(touched, `<dt>Pipelines</dt><dd data-pipelines="500 502"><code>#500</code> <code>#502</code></dd>`)
    const many = runPage({ ...failed, pipelines: Array.from({ length: 101 }, (_, i) => i + 1) }, {
      events: [],
      next: null
    }, { type: null, after: undefined })
    assert.include(many, "<code>#100</code> <span class=\"muted\">and more</span>")
    assert.notInclude(many, "#101")
  })

  it("a later page filtered by type links back to the first, keeps the filter, and ends without a next link", () => {
    const html = runPage(failed, { events: [repair(150)], next: null }, { type: "BuildDropped", after: 140 })
    assert.include(html, `<a href="/runs/${RUN}?type=BuildDropped">First page</a>`)
    assert.notInclude(html, "rel=\"next\"")
    assert.include(html, "<option selected>BuildDropped</option>")
  })

  it("no repairs of the type: says so", () => {
    const html = runPage({ ...failed, error: null, outcome: "succeeded" }, { events: [], next: null }, {
      type: "BuildDoomed",
      after: undefined
    })
    assert.include(html, "No repairs of type BuildDoomed.")
    assert.notInclude(html, "class=\"cause\"")
  })
})
