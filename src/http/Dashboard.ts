/**
 * The dashboard: server-rendered HTML with a little script, no front-end build.
 *
 * `/` shows every batch as a card (state, schedule in words with the next three fire times, last
 * run and its error cause, buttons) and an entity search (`build:123`, `direct_upload:…`) that
 * lists the entity's event history. `/batches/:name` shows a batch's configuration, its history
 * charts and its last 50 runs. The script and styles are files of their own (console/dashboard.js
 * and .css): the script keeps the API token for the tab, sends the buttons' POSTs, shows the
 * viewer's local time on hover, and swaps in the cards that `/api/stream` sends. Everything
 * interpolated is HTML-escaped.
 */
import type { StoredEvent } from "../domain/Events.ts"
import type { BatchBacklog } from "../services/Backlog.ts"
import {
  type HistoryBucket,
  type RepairPage,
  RUN_PIPELINES_MAX,
  type RunDetail,
  type RunPoint
} from "../services/RunHistory.ts"
import type { LiveRun } from "../supervisor/LiveProgress.ts"
import type { BatchView } from "../views/BatchView.ts"
import type { RunRecord } from "../views/Runs.ts"
import { dryRunLabel, orderedSummary } from "../views/SummaryOrder.ts"
import { formatUtc } from "../views/Time.ts"
import { bucketCharts, BY_BUCKET, historyCharts, type HistoryWindow, WINDOW_WORDS, WINDOWS } from "./Charts.ts"
import { ASSET_VERSION, SCRIPT_PATH, STYLE_PATH } from "./console/assets.ts"

/** A card's batch with what the console adds: its backlog (last sample) and its live run. */
export type CardView = BatchView & {
  readonly backlog?: (BatchBacklog & { readonly sampledAt: Date | null }) | undefined
  readonly live?: LiveRun | null | undefined
}

export const escapeHtml = (text: string) =>
  text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", "\"": "&quot;", "'": "&#39;" })[c]!)

export const e = (value: unknown) =>
  escapeHtml(value === null || value === undefined ? "" : typeof value === "string" ? value : JSON.stringify(value))

/**
 * One date format on every page and in the CLI (views/Time.ts). The script writes the viewer's local
 * time into the tooltip; "ago" times (how fresh a run or a sample is) say "3m ago" with both in the tooltip.
 */

export const time = (iso: string | null, mode: "ago" | "at" = "ago") =>
  iso === null
    ? "<span class=\"muted\">never</span>"
    : `<time datetime="${e(iso)}" data-mode="${mode}" title="${e(formatUtc(iso))}">${e(formatUtc(iso))}</time>`

/** "1 run", "2 runs". */
export const plural = (n: number, one: string, many = `${one}s`) => `${n} ${n === 1 ? one : many}`

const duration = (ms: number | null | undefined) => {
  if (ms === null || ms === undefined) return ""
  if (ms < 1000) return `${Math.round(ms)} ms`
  if (ms < 120_000) return `${(ms / 1000).toFixed(1)} s`
  return `${Math.round(ms / 60_000)} min`
}

const STATE_LABEL: Record<BatchView["state"], string> = {
  idle: "idle",
  running: "running",
  paused: "paused",
  disabled: "disabled",
  breaker_open: "breaker open"
}

const stateBadge = (view: BatchView) => {
  const detail = view.state === "paused"
    ? ` by ${e(view.paused?.by ?? "?")} ${time(view.paused?.at ?? null)}`
    : view.state === "breaker_open"
    ? ` until ${time(view.breaker.until, "at")}`
    : ""
  return `<span class="badge state-${view.state}" data-state="${view.state}">${STATE_LABEL[view.state]}</span>${detail}`
}

const outcomeBadge = (outcome: string | null, dryRun = false) =>
  outcome === null
    ? "<span class=\"muted\">—</span>"
    : `<span class="badge outcome-${e(outcome)}">${e(outcome)}${dryRun ? " (dry run)" : ""}</span>`

/** Summary keys in words where splitting the name would not say it (the rest: `dryRun` → "dry run"). */
const SUMMARY_LABELS: Record<string, string> = {
  skippedNoStore: "skipped, no object store",
  totalDeletedStaleEntries: "deleted",
  totalStaleEntries: "stale",
  enqueuedProjects: "projects enqueued",
  enqueuedNamespaces: "namespaces enqueued",
  resumedJobs: "jobs resumed",
  failedWorkers: "workers failed",
  held: "held by the gate",
  heldMs: "held by the gate for"
}

/** A summary key as words: the table above, else its camelCase or snake_case split (`Ms` dropped). */
export const summaryLabel = (key: string) =>
  SUMMARY_LABELS[key] ??
    key.replace(/Ms$/, "").replace(/_/g, " ").replace(/([a-z0-9])([A-Z])/g, "$1 $2").toLowerCase()

const countValue = (key: string, value: unknown) =>
  typeof value === "number" && key.endsWith("Ms")
    ? duration(value)
    : typeof value === "boolean"
    ? (value ? "yes" : "no")
    : e(value)

/**
 * The summary's scalar counts (`dropped 3 · doomed 0`) under human labels, the batch's repairs
 * first (SummaryOrder.ts; a dry run's say `would drop`); the key itself stays in `data-key` for
 * scripts and tests. Nested values are left to the run page.
 */
const counts = (summary: unknown, batch: string, dryRun = false) => {
  if (summary === null || typeof summary !== "object" || Array.isArray(summary)) {
    return summary === null || summary === undefined ? "" : e(summary)
  }
  return Object.entries(orderedSummary(summary, batch) as Record<string, unknown>)
    .filter(([, v]) => typeof v === "number" || typeof v === "boolean")
    .map(([k, v]) =>
      `<span class="count" data-key="${e(k)}" data-value="${e(v)}"><span class="muted">${
        e(dryRunLabel(k, dryRun) ?? summaryLabel(k))
      }</span> ${countValue(k, v)}</span>`
    )
    .join(" ")
}

const buttons = (view: BatchView) =>
  `<div class="actions">
  <button data-action="run" data-batch="${e(view.name)}"${
    view.disabled ? " disabled title=\"disabled by SWEEPER_DISABLED_BATCHES\"" : ""
  }>Run now</button>
  <button data-action="dry-run" data-batch="${e(view.name)}">Dry run</button>
  ${
    view.state === "paused"
      ? `<button data-action="resume" data-batch="${e(view.name)}">Resume</button>`
      : `<button data-action="pause" data-batch="${e(view.name)}"${view.disabled ? " disabled" : ""}>Pause</button>`
  }
</div>`

const backlogLine = (backlog: (BatchBacklog & { readonly sampledAt: Date | null }) | undefined) =>
  backlog === undefined
    ? ""
    // Until the first sample lands (it is taken beside start-up) a zero would claim nothing waits.
    : backlog.sampledAt === null
    ? `<dt>Backlog</dt><dd class="backlog" data-backlog=""><span class="muted">not read yet</span></dd>`
    : `<dt>Backlog</dt><dd class="backlog" data-backlog="${backlog.count}">${
      backlog.error !== null
        ? `<span class="error">unreadable: ${e(backlog.error)}</span>`
        : backlog.count === 0
        ? `<span class="muted">nothing waits</span>`
        : `<span class="muted">${e(backlog.what)}:</span> <strong>${
          backlog.capped ? "more than " : ""
        }${backlog.count}</strong>${
          backlog.oldestAt === null ? "" : `, oldest due ${time(backlog.oldestAt.toISOString())}`
        }`
    }${
      backlog.note === null
        ? ""
        : ` <span class="muted small${backlog.stale ? " stale" : ""}">(${backlog.stale ? "stale: " : ""}${
          e(backlog.note)
        })</span>`
    }${
      backlog.sampledAt === null
        ? ""
        : ` <span class="muted small">(read ${time(backlog.sampledAt.toISOString())})</span>`
    }</dd>`

const progressLine = (live: LiveRun | null | undefined, batch: string) =>
  live === null || live === undefined
    ? ""
    : `<dt>Progress</dt><dd class="progress" data-units="${live.units}"><a href="/runs/${e(live.runId)}">${
      plural(live.units, "unit")
    } done</a> ${counts(live.counts, batch)}</dd>`

/** A batch's card: the overview draws them all, and the shared stream sends one when it changes. */
export const card = (view: CardView) => {
  const last = view.lastRun
  return `<section class="card" data-batch="${e(view.name)}" data-last-run="${e(last?.runId ?? "")}">
<header><h2><a href="/batches/${encodeURIComponent(view.name)}">${e(view.name)}</a></h2>${stateBadge(view)}${
    view.mode === "shadow"
      ? ` <a class="badge mode-shadow" href="/batches/${encodeURIComponent(view.name)}/shadow">shadow</a>`
      : ""
  }</header>
<p class="muted small">${e(view.description)}</p>
<dl>
  <dt>Schedule</dt><dd>${e(view.cronInWords)} <code>${e(view.cron)}</code> <span class="muted">${
    e(view.timezone)
  }</span></dd>
  ${
    view.decomposed
      ? `<dt>Database</dt><dd class="database" data-database="${view.database}">${view.database}</dd>`
      : ""
  }
  <dt>Next</dt><dd class="ticks">${
    view.nextTicks.length === 0
      ? "<span class=\"muted\">nothing scheduled</span>"
      : view.nextTicks.map((t) => `<div>${time(t, "at")}</div>`).join("")
  }</dd>
  <dt>Last run</dt><dd class="last-run">${
    last === null
      ? "<span class=\"muted\">never run</span>"
      : `${outcomeBadge(last.outcome)} ${time(last.finishedAt)} <span class="muted">in</span> ${
        duration(last.durationMs)
      }${last.reason ? ` <span class="muted">(${e(last.reason)})</span>` : ""}`
  }</dd>
  ${last?.summary ? `<dt>Counts</dt><dd>${counts(last.summary, view.name)}</dd>` : ""}
  ${last?.error ? `<dt>Error</dt><dd class="error">${e(last.error)}</dd>` : ""}
  <dt>Failures</dt><dd>${
    view.consecutiveFailures === 0 ? "0" : `<strong class="bad">${view.consecutiveFailures} in a row</strong>`
  }</dd>
  ${backlogLine(view.backlog)}
  ${progressLine(view.live, view.name)}
</dl>
${buttons(view)}
</section>`
}

const eventRow = (event: StoredEvent) =>
  `<tr><td data-label="When">${
    time(event.occurredAt.toISOString(), "at")
  }</td><td data-label="Event"><code class="type">${
    e(event.type)
  }</code></td><td class="data" data-label="Data"><code>${
    e(event.data)
  }</code></td><td class="small" data-label="Run">${
    event.runId === null
      ? ""
      : `<a href="/runs/${e(event.runId)}" aria-label="run ${e(event.runId)}"><code>${
        e(event.runId.slice(0, 8))
      }</code></a>`
  }</td></tr>`

const searchForm = (stream: string) =>
  `<form class="search" method="get" action="/"><label for="stream">Entity</label>
<input id="stream" name="stream" value="${
    e(stream)
  }" placeholder="build:123, direct_upload:uploads:tmp/x, export_job:7" autocomplete="off">
<button type="submit">Search</button></form>`

const searchResults = (stream: string, events: ReadonlyArray<StoredEvent>) =>
  stream === ""
    ? ""
    : `<section class="history" id="history"><h2>History of <code>${e(stream)}</code></h2>${
      events.length === 0
        ? `<p class="muted">No events for this stream.</p>`
        : `<div class="scroll"><table class="stack"><thead><tr><th>When</th><th>Event</th><th>Data</th><th>Run</th></tr></thead><tbody>${
          [...events].map(eventRow).join("")
        }</tbody></table></div>`
    }</section>`

export const layout = (title: string, body: string, bodyAttributes = "") =>
  `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>${e(title)}</title><link rel="icon" href="/favicon.svg" type="image/svg+xml">
<link rel="stylesheet" href="${STYLE_PATH}?v=${ASSET_VERSION}">
<script src="${SCRIPT_PATH}?v=${ASSET_VERSION}" defer></script>
</head><body${bodyAttributes}>
<div class="top"><h1><a href="/">Sweeper</a></h1><nav><a href="/api/batches">API</a><a href="/metrics">metrics</a><a href="/readyz">readiness</a></nav></div>
<main>${body}</main></body></html>`

export const dashboardPage = (
  views: ReadonlyArray<CardView>,
  search: {
    readonly stream: string
    readonly events: ReadonlyArray<StoredEvent>
    readonly holds?: ReadonlyArray<string>
    /** The databases when GitLab is decomposed (`main: …, ci: …`); absent with one database. */
    readonly databases?: string | undefined
  } = { stream: "", events: [] }
) =>
  layout(
    "Sweeper",
    `${
      search.databases === undefined
        ? ""
        : `<p class="databases muted small" data-databases>GitLab decomposed: ${e(search.databases)}</p>`
    }${searchForm(search.stream)}<div id="flash" role="status"></div>
${
      // Above the cards, so what Search found is what the page shows first, on a phone too.
      searchResults(search.stream, search.events)}<div data-live data-overview>${
      holdsBanner(search.holds ?? [])
    }<div class="grid">${views.map(card).join("\n")}</div>
</div>`
  )

/** The health gate's holds, one line each: what holds which batch, since when. */
export const holdsBanner = (holds: ReadonlyArray<string>) =>
  holds.length === 0
    ? ""
    : `<section class="card holds" id="holds" role="status"><h2>Held by the health gate</h2><ul>${
      holds.map((h) => `<li>${e(h)}</li>`).join("")
    }</ul></section>`

const runRow = (run: RunRecord) =>
  `<tr data-run="${e(run.runId)}"><td data-label="Started">${
    run.runId === null
      ? time(run.startedAt ?? run.finishedAt, "at")
      : `<a class="run-link" href="/runs/${e(run.runId)}">${time(run.startedAt ?? run.finishedAt, "at")}</a>`
  }</td><td data-label="Trigger">${e(run.trigger ?? "")}</td><td class="hide-narrow" data-label="Node">${
    e(run.node ?? "")
  }</td><td data-label="Duration">${duration(run.durationMs)}</td>
<td data-label="Outcome">${outcomeBadge(run.outcome, run.dryRun)}${
    run.reason ? ` <span class="muted small">${e(run.reason)}</span>` : ""
  }</td><td class="summary" data-label="Summary">${counts(run.summary, run.batch, run.dryRun)}${
    run.dryRun && run.targets !== null && run.targets.length > 0
      ? `<div class="small muted">would change ${e(run.targetsTotal)}: ${
        run.targets.slice(0, 20).map((t) =>
          `<a href="/?stream=${encodeURIComponent(t)}#history"><code>${e(t)}</code></a>`
        ).join(" ")
      }</div>`
      : ""
  }</td>
<td class="error" data-label="Error">${e(run.error ?? "")}</td></tr>`

const windowLinks = (name: string, current: HistoryWindow) =>
  `<nav class="windows" aria-label="History window">${
    (Object.keys(WINDOWS) as Array<HistoryWindow>).map((w) =>
      `<a href="/batches/${encodeURIComponent(name)}?window=${w}#history"${
        w === current ? " aria-current=\"page\"" : ""
      }>${WINDOW_WORDS[w]}</a>`
    ).join("")
  }</nav>`

export interface HistoryView {
  readonly window: HistoryWindow
  readonly since: Date
  readonly until: Date
  readonly runs: ReadonlyArray<RunPoint>
  readonly bucketMs: number
  readonly buckets: ReadonlyArray<HistoryBucket>
  /** Every run of the window (the runs list stops at the newest 2 000); dry runs' repairs left out. */
  readonly totals: { readonly runs: number; readonly dryRuns: number; readonly repairs: number }
}

/** The charts, then the same numbers as a table a keyboard or screen reader can read. */
const historySection = (name: string, history: HistoryView) =>
  `<section class="history" id="history" aria-labelledby="history-title"><h2 id="history-title">History</h2>
${windowLinks(name, history.window)}
${
    history.runs.length === 0
      ? `<p class="muted">No finished runs in the last ${WINDOW_WORDS[history.window]}.</p>`
      : `<p class="muted small">${plural(history.totals.runs, "run")} finished in the last ${
        WINDOW_WORDS[history.window]
      }: ${plural(history.totals.repairs, "repair")}${
        history.totals.dryRuns > 0 ? ` (${plural(history.totals.dryRuns, "dry run")}, left out)` : ""
      }. Hover a mark for its numbers.</p>`
  }
<div class="charts">${BY_BUCKET.has(history.window) ? bucketCharts(history) : historyCharts(history)}</div>
${
    history.runs.length === 0 ?
      "" :
      `<details><summary>Numbers behind the charts</summary><div class="scroll"><table><thead><tr><th>Finished</th><th>Outcome</th><th>Repairs</th><th>Duration</th></tr></thead><tbody>${
        [...history.runs].reverse().map((r) =>
          `<tr><td><a href="/runs/${e(r.runId)}">${time(r.finishedAt.toISOString(), "at")}</a></td><td>${
            outcomeBadge(r.outcome)
          }</td><td>${r.repairs}</td><td>${duration(r.durationMs)}</td></tr>`
        ).join("")
      }</tbody></table></div></details>`
  }
</section>`

const backlogDetail = (backlog: BatchBacklog | undefined) =>
  backlog === undefined || backlog.parts.length <= 1
    ? ""
    : `<section class="card config"><h2>Backlog by part</h2><dl>${
      backlog.parts.map((p) =>
        `<dt>${e(p.label)}</dt><dd>${p.capped ? "more than " : ""}${p.count}${
          p.oldestAt === null ? "" : `, oldest due ${time(p.oldestAt.toISOString())}`
        }</dd>`
      ).join("")
    }</dl></section>`

/** A batch page's history charts and runs table: what a batch page re-reads when its batch ran. */
export const batchHistory = (name: string, runs: ReadonlyArray<RunRecord>, history: HistoryView) =>
  `${historySection(name, history)}
<section class="runs"><h2>${
    runs.length === 1 ? "The last run" : `Last ${runs.length} runs`
  }</h2><div class="scroll"><table class="stack"><thead><tr><th>Started</th><th>Trigger</th><th class="hide-narrow">Node</th><th>Duration</th><th>Outcome</th><th>Summary</th><th>Error</th></tr></thead>
<tbody>${
    runs.length === 0 ? "<tr><td colspan=\"7\" class=\"muted\">No runs yet.</td></tr>" : runs.map(runRow).join("\n")
  }</tbody></table></div></section>`

export const batchPage = (view: CardView, runs: ReadonlyArray<RunRecord>, history: HistoryView) =>
  layout(
    `${view.name} · Sweeper`,
    `<p><a href="/">← all batches</a></p><div id="flash" role="status"></div>
<div data-live><div class="grid">${card(view)}
<section class="card config"><h2>Configuration</h2><dl>
<dt>Worker</dt><dd><code>${e(view.worker)}</code></dd>
<dt>Cron</dt><dd><code>${e(view.cron)}</code> ${e(view.timezone)} (${e(view.cronInWords)})</dd>
<dt>Budget</dt><dd>${e(view.config.budget)}</dd>
<dt>Lease</dt><dd>${
      view.config.lease === null
        ? "<span class=\"muted\">none (may overlap across nodes)</span>"
        : `<code>${e(view.config.lease.name)}</code> TTL ${e(view.config.lease.ttl)}`
    }</dd>
<dt>Missed runs</dt><dd>${e(view.config.missedRuns)}</dd>${
      view.mode === "shadow"
        ? `<dt>Mode</dt><dd data-mode="shadow">shadow: proposes beside GitLab's worker, writes nothing of GitLab's — <a href="/batches/${
          encodeURIComponent(view.name)
        }/shadow">agreement with GitLab</a></dd>`
        : ""
    }
<dt>Overlap</dt><dd>one run at a time per process; ticks during a run coalesce</dd>
</dl></section>${backlogDetail(view.backlog)}</div>
${batchHistory(view.name, runs, history)}</div>`,
    " data-batch-page"
  )

/** The repair event types a run page can filter by (every stream but `batch:…`). */
export const REPAIR_TYPES = [
  "BuildDropped",
  "BuildDoomed",
  "ExportJobFailed",
  "StaleDirectUploadDeleted",
  "StaleDirectUploadEntryRemoved",
  "RebalanceRescheduled",
  "ConcurrencyLimitJobsResumed",
  "ConcurrencyLimitJobsDead",
  "EventsPruned"
] as const

const repairRow = (event: StoredEvent) =>
  `<tr data-event="${event.id}"><td data-label="When">${
    time(event.occurredAt.toISOString(), "at")
  }</td><td data-label="Event"><code class="type">${e(event.type)}</code></td>
<td data-label="Entity"><a class="entity" href="/?stream=${encodeURIComponent(event.stream)}#history">${
    e(event.stream)
  }</a></td><td class="data" data-label="Data"><code>${e(event.data)}</code></td></tr>`

const runQuery = (runId: string, params: { readonly type: string | null; readonly after?: number | undefined }) => {
  const q = new URLSearchParams()
  if (params.type !== null) q.set("type", params.type)
  if (params.after !== undefined) q.set("after", String(params.after))
  const text = q.toString()
  return `/runs/${encodeURIComponent(runId)}${text === "" ? "" : `?${text}`}`
}

/** A run: outcome, trigger, node, timings, summary, error, holds, and its repairs paged by keyset. */
/**
 * The pipelines a run's drops touched: GitLab recomputes each (the PipelineProcessWorker the drop
 * pushed), so these are the pipelines an operator may want to look at after the run.
 */
const pipelinesRow = (pipelines: ReadonlyArray<number>) =>
  pipelines.length === 0 ?
    "" :
    `<dt>Pipelines</dt><dd data-pipelines="${e(pipelines.slice(0, RUN_PIPELINES_MAX).join(" "))}">${
      pipelines.slice(0, RUN_PIPELINES_MAX).map((id) => `<code>#${id}</code>`).join(" ")
    }${pipelines.length > RUN_PIPELINES_MAX ? ` <span class="muted">and more</span>` : ""}</dd>`

export const runPage = (
  run: RunDetail,
  page: RepairPage,
  filter: { readonly type: string | null; readonly after: number | undefined }
) =>
  layout(
    `Run ${run.runId.slice(0, 8)} · ${run.batch} · Sweeper`,
    `<p><a href="/batches/${encodeURIComponent(run.batch)}">← ${e(run.batch)}</a></p>
<div data-run-page="${e(run.runId)}"><section class="card runinfo"><header><h2>Run <code>${e(run.runId)}</code></h2>${
      run.outcome === null
        ? `<span class="badge state-running">running or unfinished</span>`
        : outcomeBadge(run.outcome, run.dryRun)
    }</header>
<dl>
<dt>Batch</dt><dd><a href="/batches/${encodeURIComponent(run.batch)}">${e(run.batch)}</a></dd>
<dt>Trigger</dt><dd>${e(run.trigger ?? "—")}</dd>
<dt>Node</dt><dd>${e(run.node ?? "—")}</dd>
<dt>Started</dt><dd>${time(run.startedAt?.toISOString() ?? null, "at")}</dd>
<dt>Holds</dt><dd>${
      run.holds.length === 0
        ? "<span class=\"muted\">none</span>"
        : run.holds.map((h) =>
          `<div>${time(h.occurredAt.toISOString(), "at")} <code>${e(h.type)}</code> ${e(h.data.signal ?? "")}</div>`
        ).join("")
    }</dd>
<dt>Finished</dt><dd>${
      run.finishedAt === null
        ? "<span class=\"muted\">not yet</span>"
        : `${time(run.finishedAt.toISOString(), "at")} <span class="muted">in</span> ${duration(run.durationMs)}`
    }</dd>
${run.reason === null ? "" : `<dt>Reason</dt><dd>${e(run.reason)}</dd>`}
<dt>Summary</dt><dd>${counts(run.summary, run.batch, run.dryRun) || "<span class=\"muted\">—</span>"}</dd>
${run.error === null ? "" : `<dt>Error</dt><dd class="error"><pre class="cause">${e(run.error)}</pre></dd>`}
<dt>Repairs</dt><dd data-repairs="${run.repairs}">${run.repairs}</dd>
${pipelinesRow(run.pipelines)}
</dl></section>
<section class="runs" id="repairs"><h2>Repairs</h2>
<form class="filter" method="get" action="/runs/${e(run.runId)}"><label for="type">Type</label>
<select id="type" name="type"><option value="">all</option>${
      REPAIR_TYPES.map((t) => `<option${filter.type === t ? " selected" : ""}>${t}</option>`).join("")
    }</select>
<button type="submit">Filter</button></form>
<div class="scroll"><table class="stack"><thead><tr><th>When</th><th>Event</th><th>Entity</th><th>Data</th></tr></thead>
<tbody>${
      page.events.length === 0
        ? `<tr><td colspan="4" class="muted">No repairs${filter.type === null ? "" : ` of type ${e(filter.type)}`}${
          filter.after === undefined ? "" : " after this point"
        }.</td></tr>`
        : page.events.map(repairRow).join("\n")
    }</tbody></table></div>
<nav class="pager" aria-label="Repair pages">${
      filter.after === undefined ? "" : `<a href="${e(runQuery(run.runId, { type: filter.type }))}">First page</a>`
    }${
      page.next === null
        ? ""
        : `<a rel="next" href="${e(runQuery(run.runId, { type: filter.type, after: page.next }))}">Next page</a>`
    }</nav>
</section></div>`
  )

/** A broom on the console's dark blue: served as /favicon.svg and /favicon.ico (browsers ask for it). */
export const FAVICON =
  `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32"><rect width="32" height="32" rx="6" fill="#1d2430"/><path d="M20 4l-6 14" stroke="#cfe0ff" stroke-width="3" stroke-linecap="round"/><path d="M8 18h12l-2 10H6z" fill="#f0a000"/></svg>`
