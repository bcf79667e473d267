/**
 * The dashboard: server-rendered HTML with a little script, no front-end build.
 *
 * `/` shows every batch as a card (state, schedule in words with the next three fire times in UTC
 * and the viewer's local time, last run and its error cause, buttons) and an entity search
 * (`build:123`, `direct_upload:…`) that lists the entity's event history. `/batches/:name` shows
 * a batch's configuration and its last 50 runs. The script asks for the API token once (kept in
 * sessionStorage), sends the buttons' POSTs, converts times to local, and re-renders `<main>`
 * whenever `/api/stream` (SSE) says the batches changed. Everything interpolated is HTML-escaped.
 */
import type { StoredEvent } from "../domain/Events.ts"
import type { BatchBacklog } from "../services/Backlog.ts"
import type { HistoryBucket, RepairPage, RunDetail, RunPoint } from "../services/RunHistory.ts"
import type { BatchView } from "./BatchView.ts"
import { bucketCharts, BY_BUCKET, historyCharts, type HistoryWindow, WINDOWS } from "./Charts.ts"
import type { LiveRun } from "./LiveProgress.ts"
import type { RunRecord } from "./Runs.ts"

/** A card's batch with what the console adds: its backlog (last sample) and its live run. */
export type CardView = BatchView & {
  readonly backlog?: (BatchBacklog & { readonly sampledAt: Date | null }) | undefined
  readonly live?: LiveRun | null | undefined
}

export const escapeHtml = (text: string) =>
  text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", "\"": "&quot;", "'": "&#39;" })[c]!)

const e = (value: unknown) =>
  escapeHtml(value === null || value === undefined ? "" : typeof value === "string" ? value : JSON.stringify(value))

/** A time the script shows as "3m ago" / local time; the UTC ISO text stays in the title. */
const time = (iso: string | null, mode: "ago" | "local" | "utc" = "ago") =>
  iso === null
    ? "<span class=\"muted\">never</span>"
    : `<time datetime="${e(iso)}" data-mode="${mode}" title="${e(iso)}">${
      e(iso.replace("T", " ").replace(/\.\d+Z$/, "Z"))
    }</time>`

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
    ? ` until ${time(view.breaker.until, "local")}`
    : ""
  return `<span class="badge state-${view.state}" data-state="${view.state}">${STATE_LABEL[view.state]}</span>${detail}`
}

const outcomeBadge = (outcome: string | null, dryRun = false) =>
  outcome === null
    ? "<span class=\"muted\">—</span>"
    : `<span class="badge outcome-${e(outcome)}">${e(outcome)}${dryRun ? " (dry run)" : ""}</span>`

/** The summary's scalar counts (`dropped 3 · doomed 0`); nested values are left to the batch page. */
const counts = (summary: unknown) => {
  if (summary === null || typeof summary !== "object" || Array.isArray(summary)) {
    return summary === null || summary === undefined ? "" : e(summary)
  }
  return Object.entries(summary as Record<string, unknown>)
    .filter(([, v]) => typeof v === "number" || typeof v === "boolean")
    .map(([k, v]) => `<span class="count"><span class="muted">${e(k)}</span> ${e(v)}</span>`)
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
    : `<dt>Backlog</dt><dd class="backlog" data-backlog="${backlog.count}">${
      backlog.error !== null
        ? `<span class="error">unreadable: ${e(backlog.error)}</span>`
        : backlog.count === 0
        ? `<span class="muted">nothing waits</span>`
        : `<strong>${backlog.capped ? "more than " : ""}${backlog.count}</strong> <span class="muted">${
          e(backlog.what)
        }</span>${backlog.oldestAt === null ? "" : `, oldest due ${time(backlog.oldestAt.toISOString())}`}`
    }${
      backlog.sampledAt === null
        ? ""
        : ` <span class="muted small">(read ${time(backlog.sampledAt.toISOString())})</span>`
    }</dd>`

const progressLine = (live: LiveRun | null | undefined) =>
  live === null || live === undefined
    ? ""
    : `<dt>Progress</dt><dd class="progress" data-units="${live.units}"><a href="/runs/${
      e(live.runId)
    }">${live.units} unit${live.units === 1 ? "" : "s"} done</a> ${counts(live.counts)}</dd>`

const card = (view: CardView) => {
  const last = view.lastRun
  return `<section class="card" data-batch="${e(view.name)}">
<header><h2><a href="/batches/${encodeURIComponent(view.name)}">${e(view.name)}</a></h2>${stateBadge(view)}</header>
<p class="muted small">${e(view.description)}</p>
<dl>
  <dt>Schedule</dt><dd>${e(view.cronInWords)} <code>${e(view.cron)}</code> <span class="muted">${
    e(view.timezone)
  }</span></dd>
  <dt>Next</dt><dd class="ticks">${
    view.nextTicks.length === 0
      ? "<span class=\"muted\">nothing scheduled</span>"
      : view.nextTicks.map((t) => `<div>${time(t, "utc")} <span class="muted">·</span> ${time(t, "local")}</div>`).join(
        ""
      )
  }</dd>
  <dt>Last run</dt><dd class="last-run">${
    last === null
      ? "<span class=\"muted\">never run</span>"
      : `${outcomeBadge(last.outcome)} ${time(last.finishedAt)} <span class="muted">in</span> ${
        duration(last.durationMs)
      }${last.reason ? ` <span class="muted">(${e(last.reason)})</span>` : ""}`
  }</dd>
  ${last?.summary ? `<dt>Counts</dt><dd>${counts(last.summary)}</dd>` : ""}
  ${last?.error ? `<dt>Error</dt><dd class="error">${e(last.error)}</dd>` : ""}
  <dt>Failures</dt><dd>${
    view.consecutiveFailures === 0 ? "0" : `<strong class="bad">${view.consecutiveFailures} in a row</strong>`
  }</dd>
  ${backlogLine(view.backlog)}
  ${progressLine(view.live)}
</dl>
${buttons(view)}
</section>`
}

const eventRow = (event: StoredEvent) =>
  `<tr><td>${time(event.occurredAt.toISOString(), "local")}</td><td><code>${
    e(event.type)
  }</code></td><td class="data"><code>${e(event.data)}</code></td><td class="small">${
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
        : `<div class="scroll"><table><thead><tr><th>When</th><th>Event</th><th>Data</th><th>Run</th></tr></thead><tbody>${
          [...events].map(eventRow).join("")
        }</tbody></table></div>`
    }</section>`

const STYLE = `
*{box-sizing:border-box}body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d2430;background:#f4f6f9}
a{color:#1f5fbf;text-decoration:none}a:hover{text-decoration:underline}
.top{display:flex;flex-wrap:wrap;gap:.5rem 1.5rem;align-items:center;padding:.8rem 1.2rem;background:#1d2430;color:#fff}
.top h1{font-size:1.15rem;margin:0}.top a{color:#cfe0ff}.top nav{display:flex;gap:1rem;flex-wrap:wrap;font-size:.9rem}
main{padding:1rem 1.2rem;max-width:1600px;margin:0 auto}
.search{display:flex;flex-wrap:wrap;gap:.5rem;align-items:center;margin:0 0 1rem}.search input{flex:1 1 16rem;min-width:0;padding:.45rem .6rem;border:1px solid #b8c2d0;border-radius:6px;font:inherit}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,340px),1fr));gap:1rem}
.card{background:#fff;border:1px solid #dde3ea;border-radius:10px;padding:.9rem 1rem;display:flex;flex-direction:column;min-width:0}
.card header{display:flex;flex-wrap:wrap;gap:.4rem .6rem;align-items:baseline;justify-content:space-between}
.card h2{font-size:1.02rem;margin:0;overflow-wrap:anywhere}
dl{display:grid;grid-template-columns:5.5rem 1fr;gap:.25rem .6rem;margin:.6rem 0;flex:1}dt{color:#5b6677}dd{margin:0;min-width:0;overflow-wrap:anywhere}
code{font:12.5px ui-monospace,SFMono-Regular,Menlo,monospace;background:#eef1f5;padding:0 .25rem;border-radius:4px;overflow-wrap:anywhere}
.badge{display:inline-block;padding:.05rem .5rem;border-radius:999px;font-size:.8rem;font-weight:600;background:#e6e9ee;color:#333}
.state-idle{background:#e3f4e8;color:#14632f}.state-running{background:#ddeafe;color:#1747a6}.state-paused{background:#fff1cc;color:#7a5600}
.state-disabled{background:#e6e9ee;color:#555}.state-breaker_open{background:#fde2e1;color:#9b1c1c}
.outcome-succeeded{background:#e3f4e8;color:#14632f}.outcome-failed,.outcome-timed_out,.outcome-abandoned{background:#fde2e1;color:#9b1c1c}.outcome-skipped{background:#eef1f5;color:#555}
.muted{color:#6b7687}.small{font-size:.85rem}.bad{color:#9b1c1c}.error{color:#9b1c1c;font-size:.85rem}
.count{margin-right:.6rem;white-space:nowrap}
.actions{display:flex;flex-wrap:wrap;gap:.4rem}button{font:inherit;padding:.35rem .8rem;border-radius:6px;border:1px solid #b8c2d0;background:#fff;cursor:pointer}
button:hover:not([disabled]){background:#eef3fb}button[disabled]{opacity:.5;cursor:not-allowed}button[data-action=run]{background:#1f5fbf;color:#fff;border-color:#1f5fbf}
.scroll{overflow-x:auto}table{border-collapse:collapse;width:100%;background:#fff}th,td{padding:.35rem .6rem;border-bottom:1px solid #e3e8ee;text-align:left;vertical-align:top}
th{font-size:.8rem;color:#5b6677;font-weight:600}td.data code{white-space:pre-wrap;word-break:break-all}
.history,.config,.runs{margin-top:1.4rem}.history h2,.runs h2,.config h2{font-size:1.05rem}
#flash{min-height:1.2em;margin:.2rem 0 .8rem}#flash.bad{color:#9b1c1c}
a:focus-visible,button:focus-visible,input:focus-visible,select:focus-visible,summary:focus-visible{outline:3px solid #f0a000;outline-offset:2px;border-radius:3px}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,560px),1fr));gap:1rem}
.chart{margin:0;background:#fff;border:1px solid #dde3ea;border-radius:10px;padding:.6rem .8rem}.chart figcaption{font-weight:600;font-size:.9rem;margin-bottom:.3rem}
.chart svg{width:100%;height:auto;display:block}.chart .axis{stroke:#b8c2d0;stroke-width:1}.chart .tick{font-size:12px;fill:#5b6677}.chart .mark:hover{opacity:.7}
.windows{display:flex;gap:.4rem;flex-wrap:wrap;margin:.4rem 0 .8rem}.windows a{padding:.2rem .7rem;border:1px solid #b8c2d0;border-radius:999px;background:#fff}.windows a[aria-current=page]{background:#1d2430;color:#fff;border-color:#1d2430}
.filter{display:flex;flex-wrap:wrap;gap:.5rem;align-items:center;margin:.6rem 0}.filter select{font:inherit;padding:.3rem}
.pager{display:flex;gap:1rem;margin:.6rem 0}.runinfo dl{grid-template-columns:7rem 1fr}
@media (max-width:600px){main{padding:.8rem}dl{grid-template-columns:4.6rem 1fr}.hide-narrow{display:none}}
`

/**
 * The page script: token once per tab, buttons, local times, live re-render over SSE. Times show
 * seconds only when they have some (a seconds cron's next ticks), so minute crons stay short.
 */
const SCRIPT = `
(function(){
  function token(){var t=sessionStorage.getItem("sweeper-token");if(!t){t=window.prompt("API token (SWEEPER_API_TOKEN)");if(t)sessionStorage.setItem("sweeper-token",t)}return t}
  function flash(text,bad){var f=document.getElementById("flash");if(f){f.textContent=text;f.className=bad?"bad":""}}
  function ago(ms){var s=Math.max(0,Math.round(ms/1000));return s<120?s+"s ago":s<7200?Math.round(s/60)+"m ago":s<172800?Math.round(s/3600)+"h ago":Math.round(s/86400)+"d ago"}
  function localize(root){root.querySelectorAll("time[datetime]").forEach(function(el){var d=new Date(el.getAttribute("datetime"));var m=el.getAttribute("data-mode");
    if(m==="ago")el.textContent=ago(Date.now()-d.getTime());else{var s=d.getUTCSeconds()!==0;if(m==="local")el.textContent=d.toLocaleString([], {dateStyle:"medium",timeStyle:s?"medium":"short"})+" local";else el.textContent=d.toISOString().slice(0,s?19:16).replace("T"," ")+" UTC"}})}
  async function act(button){var batch=button.getAttribute("data-batch"),action=button.getAttribute("data-action");var t=token();if(!t){flash("No token given; nothing done.",true);return}
    var path="/api/batches/"+encodeURIComponent(batch)+"/"+(action==="dry-run"?"run":action);var body=action==="dry-run"?JSON.stringify({dryRun:true}):action==="run"?"{}":undefined;
    button.disabled=true;flash((action==="dry-run"?"Dry run of ":action==="run"?"Running ":action==="pause"?"Pausing ":"Resuming ")+batch+"…");
    try{var r=await fetch(path,{method:"POST",headers:{"authorization":"Bearer "+t,"content-type":"application/json","x-sweeper-actor":"dashboard"},body:body});var j=await r.json();
      if(!r.ok){if(r.status===401)sessionStorage.removeItem("sweeper-token");flash(batch+": "+(j.error?j.error.message:r.status),true)}
      else if(j.outcome){flash(batch+" "+j.outcome+(j.dryRun?" (dry run"+(j.targetsTotal!==undefined?", would change "+j.targetsTotal+(j.targets&&j.targets.length?": "+j.targets.slice(0,10).join(", ")+(j.targetsTotal>10?", …":""):""):"")+")":"")+(j.error?": "+j.error:""),j.outcome==="failed"||j.outcome==="timed_out")}
      else flash(batch+" "+(action==="pause"?"paused":"resumed"))}
    catch(err){flash(String(err),true)}finally{button.disabled=false;refresh()}}
  async function refresh(){try{var r=await fetch(location.href,{headers:{accept:"text/html"}});var doc=new DOMParser().parseFromString(await r.text(),"text/html");var next=doc.querySelector("main [data-live]"),cur=document.querySelector("main [data-live]");
    if(next&&cur){cur.replaceWith(next);localize(next)}}catch(err){}}
  document.addEventListener("click",function(ev){var b=ev.target.closest("button[data-action]");if(b){ev.preventDefault();act(b)}});
  localize(document);setInterval(function(){localize(document)},15000);
  if(window.EventSource){var first=true;var es=new EventSource("/api/stream");es.addEventListener("batches",function(){if(first){first=false;return}refresh()})}
})();
`

const layout = (title: string, body: string) =>
  `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>${e(title)}</title><link rel="icon" href="/favicon.svg" type="image/svg+xml"><style>${STYLE}</style></head><body>
<div class="top"><h1><a href="/">Sweeper</a></h1><nav><a href="/api/batches">API</a><a href="/metrics">metrics</a><a href="/readyz">readiness</a></nav></div>
<main>${body}</main><script>${SCRIPT}</script></body></html>`

export const dashboardPage = (
  views: ReadonlyArray<CardView>,
  search: {
    readonly stream: string
    readonly events: ReadonlyArray<StoredEvent>
    readonly holds?: ReadonlyArray<string>
  } = { stream: "", events: [] }
) =>
  layout(
    "Sweeper",
    `${searchForm(search.stream)}<div id="flash" role="status"></div>
<div data-live>${holdsBanner(search.holds ?? [])}<div class="grid">${views.map(card).join("\n")}</div>
${searchResults(search.stream, search.events)}</div>`
  )

/** The health gate's holds (SPEC §9), one line each: what holds which batch, since when. */
const holdsBanner = (holds: ReadonlyArray<string>) =>
  holds.length === 0
    ? ""
    : `<section class="card holds" id="holds" role="status"><h2>Held by the health gate</h2><ul>${
      holds.map((h) => `<li>${e(h)}</li>`).join("")
    }</ul></section>`

const runRow = (run: RunRecord) =>
  `<tr data-run="${e(run.runId)}"><td>${
    run.runId === null
      ? time(run.startedAt ?? run.finishedAt, "local")
      : `<a class="run-link" href="/runs/${e(run.runId)}">${time(run.startedAt ?? run.finishedAt, "local")}</a>`
  }</td><td>${e(run.trigger ?? "")}</td><td class="hide-narrow">${e(run.node ?? "")}</td><td>${
    duration(run.durationMs)
  }</td>
<td>${outcomeBadge(run.outcome, run.dryRun)}${
    run.reason ? ` <span class="muted small">${e(run.reason)}</span>` : ""
  }</td><td>${counts(run.summary)}${
    run.dryRun && run.targets !== null && run.targets.length > 0
      ? `<div class="small muted">would change ${e(run.targetsTotal)}: ${
        run.targets.slice(0, 20).map((t) =>
          `<a href="/?stream=${encodeURIComponent(t)}#history"><code>${e(t)}</code></a>`
        ).join(" ")
      }</div>`
      : ""
  }</td>
<td class="error">${e(run.error ?? "")}</td></tr>`

const windowLinks = (name: string, current: HistoryWindow) =>
  `<nav class="windows" aria-label="History window">${
    (Object.keys(WINDOWS) as Array<HistoryWindow>).map((w) =>
      `<a href="/batches/${encodeURIComponent(name)}?window=${w}#history"${
        w === current ? " aria-current=\"page\"" : ""
      }>${w === "24h" ? "24 hours" : w === "7d" ? "7 days" : "30 days"}</a>`
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
      ? `<p class="muted">No finished runs in the last ${history.window}.</p>`
      : `<p class="muted small">${history.totals.runs} run${
        history.totals.runs === 1 ? "" : "s"
      } finished in the last ${history.window}: ${history.totals.repairs} repairs${
        history.totals.dryRuns > 0 ? ` (${history.totals.dryRuns} dry runs, left out)` : ""
      }. Hover a mark for its numbers.</p>`
  }
<div class="charts">${BY_BUCKET.has(history.window) ? bucketCharts(history) : historyCharts(history)}</div>
${
    history.runs.length === 0 ?
      "" :
      `<details><summary>Numbers behind the charts</summary><div class="scroll"><table><thead><tr><th>Finished</th><th>Outcome</th><th>Repairs</th><th>Duration</th></tr></thead><tbody>${
        [...history.runs].reverse().map((r) =>
          `<tr><td><a href="/runs/${e(r.runId)}">${time(r.finishedAt.toISOString(), "local")}</a></td><td>${
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
<dt>Missed runs</dt><dd>${e(view.config.missedRuns)}</dd>
<dt>Overlap</dt><dd>one run at a time per process; ticks during a run coalesce</dd>
</dl></section>${backlogDetail(view.backlog)}</div>
${historySection(view.name, history)}
<section class="runs"><h2>Last ${runs.length} runs</h2><div class="scroll"><table><thead><tr><th>Started</th><th>Trigger</th><th class="hide-narrow">Node</th><th>Duration</th><th>Outcome</th><th>Summary</th><th>Error</th></tr></thead>
<tbody>${
      runs.length === 0 ? "<tr><td colspan=\"7\" class=\"muted\">No runs yet.</td></tr>" : runs.map(runRow).join("\n")
    }</tbody></table></div></section></div>`
  )

/** The repair event types a run page can filter by (every stream but `batch:…`). */
export const REPAIR_TYPES = [
  "BuildDropped",
  "BuildDoomed",
  "ExportJobFailed",
  "StaleDirectUploadDeleted",
  "RebalanceRescheduled",
  "ConcurrencyLimitJobsResumed",
  "ConcurrencyLimitJobsDead",
  "EventsPruned"
] as const

const repairRow = (event: StoredEvent) =>
  `<tr data-event="${event.id}"><td>${time(event.occurredAt.toISOString(), "local")}</td><td><code>${
    e(event.type)
  }</code></td>
<td><a class="entity" href="/?stream=${encodeURIComponent(event.stream)}#history">${
    e(event.stream)
  }</a></td><td class="data"><code>${e(event.data)}</code></td></tr>`

const runQuery = (runId: string, params: { readonly type: string | null; readonly after?: number | undefined }) => {
  const q = new URLSearchParams()
  if (params.type !== null) q.set("type", params.type)
  if (params.after !== undefined) q.set("after", String(params.after))
  const text = q.toString()
  return `/runs/${encodeURIComponent(runId)}${text === "" ? "" : `?${text}`}`
}

/** A run: outcome, trigger, node, timings, summary, error, holds, and its repairs paged by keyset. */
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
<dt>Started</dt><dd>${time(run.startedAt?.toISOString() ?? null, "local")}</dd>
<dt>Holds</dt><dd>${
      run.holds.length === 0
        ? "<span class=\"muted\">none</span>"
        : run.holds.map((h) =>
          `<div>${time(h.occurredAt.toISOString(), "local")} <code>${e(h.type)}</code> ${e(h.data.signal ?? "")}</div>`
        ).join("")
    }</dd>
<dt>Finished</dt><dd>${
      run.finishedAt === null
        ? "<span class=\"muted\">not yet</span>"
        : `${time(run.finishedAt.toISOString(), "local")} <span class="muted">in</span> ${duration(run.durationMs)}`
    }</dd>
${run.reason === null ? "" : `<dt>Reason</dt><dd>${e(run.reason)}</dd>`}
<dt>Summary</dt><dd>${counts(run.summary) || "<span class=\"muted\">—</span>"}</dd>
${run.error === null ? "" : `<dt>Error</dt><dd class="error"><pre class="cause">${e(run.error)}</pre></dd>`}
<dt>Repairs</dt><dd data-repairs="${run.repairs}">${run.repairs}</dd>
</dl></section>
<section class="runs" id="repairs"><h2>Repairs</h2>
<form class="filter" method="get" action="/runs/${e(run.runId)}"><label for="type">Type</label>
<select id="type" name="type"><option value="">all</option>${
      REPAIR_TYPES.map((t) => `<option${filter.type === t ? " selected" : ""}>${t}</option>`).join("")
    }</select>
<button type="submit">Filter</button></form>
<div class="scroll"><table><thead><tr><th>When</th><th>Event</th><th>Entity</th><th>Data</th></tr></thead>
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
