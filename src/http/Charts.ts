/**
 * Server-drawn SVG charts for a batch's history: no library, no CDN, nothing for
 * the browser to fetch. One mark per run (a bar or a dot at the run's finish time), each with a
 * `<title>` so the numbers are one hover away; the same numbers are in the table under the charts
 * for keyboards and screen readers. Pure: runs and the window in, markup out.
 */
import type { HistoryBucket, RunPoint } from "../services/RunHistory.ts"
import { formatUtc } from "../views/Time.ts"

export const WINDOWS = {
  "1h": 3600_000,
  "24h": 24 * 3600_000,
  "7d": 7 * 24 * 3600_000,
  "30d": 30 * 24 * 3600_000
} as const
/**
 * The bucket each window's totals are folded by. 30 days of an every-minute batch is 43 200 runs,
 * more than one mark each can show: that window is charted by bucket, every run counted.
 */
export const BUCKETS: Record<HistoryWindow, number> = {
  "1h": 300_000,
  "24h": 3600_000,
  "7d": 6 * 3600_000,
  "30d": 12 * 3600_000
}
/** Windows charted one mark per bucket rather than per run. */
export const BY_BUCKET: ReadonlySet<HistoryWindow> = new Set(["30d"])
export type HistoryWindow = keyof typeof WINDOWS
export const isWindow = (value: string): value is HistoryWindow => Object.hasOwn(WINDOWS, value)
export const WINDOW_WORDS: Record<HistoryWindow, string> = {
  "1h": "hour",
  "24h": "24 hours",
  "7d": "7 days",
  "30d": "30 days"
}

/** Enough marks in the last hour to read a trend from; fewer, and a day shows more. */
const HOUR_RUNS = 10

/**
 * The window a batch page opens on when none is asked for, from the runs of the last 24 hours: the
 * last hour when it holds enough runs (a batch every few seconds, as in the demo, would otherwise
 * collapse into one bar at the right edge), 24 hours when the day has runs, else a wider window.
 */
export const chooseWindow = (runsInDay: ReadonlyArray<RunPoint>, now: Date): HistoryWindow => {
  if (runsInDay.length === 0) return "7d"
  const hourAgo = now.getTime() - WINDOWS["1h"]
  const inHour = runsInDay.filter((r) => r.finishedAt.getTime() >= hourAgo).length
  return inHour >= HOUR_RUNS || inHour === runsInDay.length ? "1h" : "24h"
}

const WIDTH = 640
const HEIGHT = 150
/** Room for the value labels, which grow (in drawing units) on a narrow screen. */
const LEFT = 124
const BOTTOM = 4
const TOP = 8

const esc = (text: string) =>
  text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", "\"": "&quot;", "'": "&#39;" })[c]!)

export const OUTCOME_COLOURS: Record<string, string> = {
  succeeded: "#2f8f4e",
  failed: "#c0392b",
  timed_out: "#d35400",
  abandoned: "#8e44ad",
  skipped: "#8a94a3"
}

const colour = (outcome: string) => OUTCOME_COLOURS[outcome] ?? "#5b6677"

const formatMs = (ms: number) =>
  ms < 1000 ? `${Math.round(ms)} ms` : ms < 120_000 ? `${(ms / 1000).toFixed(1)} s` : `${(ms / 60_000).toFixed(1)} min`

/** A round axis maximum at or above `max` (1, 2, 5 × 10^n). */
export const niceMax = (max: number) => {
  if (max <= 0) return 1
  const power = 10 ** Math.floor(Math.log10(max))
  for (const step of [1, 2, 5, 10]) if (step * power >= max) return step * power
  return 10 * power
}

const label = (run: RunPoint) =>
  `${formatUtc(run.finishedAt)} · ${run.outcome.replace("_", " ")} · ${run.repairs} repair${
    run.repairs === 1 ? "" : "s"
  } · ${formatMs(run.durationMs)}`

interface ChartInput {
  readonly runs: ReadonlyArray<RunPoint>
  readonly since: Date
  readonly until: Date
}

/**
 * The window's ends under the drawing, in HTML: text inside the SVG scales with it, to about 5 px on
 * a phone, where these dates would also run into each other.
 */
const timeAxis = (input: { readonly since: Date; readonly until: Date }) =>
  `<div class="xaxis"><span>${esc(formatUtc(input.since))}</span><span>${esc(formatUtc(input.until))}</span></div>`

const frame = (kind: string, title: string, yMax: string, body: string, input: ChartInput) =>
  `<figure class="chart" data-chart="${kind}"><figcaption>${esc(title)}</figcaption>
<svg viewBox="0 0 ${WIDTH} ${HEIGHT}" role="img" aria-label="${esc(`${title}: ${input.runs.length} runs`)}">
<line class="axis" x1="${LEFT}" y1="${HEIGHT - BOTTOM}" x2="${WIDTH}" y2="${HEIGHT - BOTTOM}"/>
<line class="axis" x1="${LEFT}" y1="${TOP}" x2="${LEFT}" y2="${HEIGHT - BOTTOM}"/>
<text class="tick" x="${LEFT - 4}" y="${TOP + 8}" text-anchor="end">${esc(yMax)}</text>
<text class="tick" x="${LEFT - 4}" y="${HEIGHT - BOTTOM}" text-anchor="end">0</text>
${body}</svg>${timeAxis(input)}</figure>`

const xOf = (input: ChartInput) => {
  const span = Math.max(1, input.until.getTime() - input.since.getTime())
  return (at: Date) => LEFT + 2 + ((at.getTime() - input.since.getTime()) / span) * (WIDTH - LEFT - 6)
}

/** At least 2 units wide, so each of a busy hour's marks can still be seen and hovered. */
const barWidth = (n: number) => Math.max(2, Math.min(8, ((WIDTH - LEFT) / Math.max(1, n)) * 0.7))

const bars = (
  kind: string,
  title: string,
  value: (run: RunPoint) => number,
  format: (v: number) => string,
  input: ChartInput
) => {
  const max = niceMax(Math.max(0, ...input.runs.map(value)))
  const x = xOf(input)
  const w = barWidth(input.runs.length)
  const plot = HEIGHT - BOTTOM - TOP
  const marks = input.runs.map((run) => {
    const h = Math.max(1, (value(run) / max) * plot)
    return `<rect class="mark" data-run="${esc(run.runId)}" x="${(x(run.finishedAt) - w / 2).toFixed(1)}" y="${
      (HEIGHT - BOTTOM - h).toFixed(1)
    }" width="${w.toFixed(1)}" height="${h.toFixed(1)}" fill="${colour(run.outcome)}"><title>${
      esc(label(run))
    }</title></rect>`
  }).join("")
  return frame(kind, title, format(max), marks, input)
}

/** Outcomes: one dot per run on the lane of its outcome. */
const outcomes = (input: ChartInput) => {
  const lanes = ["succeeded", "skipped", "failed", "timed_out", "abandoned"]
  const x = xOf(input)
  const plot = HEIGHT - BOTTOM - TOP
  const laneY = (outcome: string) => {
    const i = lanes.indexOf(outcome)
    return TOP + ((i === -1 ? lanes.length - 1 : i) + 0.5) * (plot / lanes.length)
  }
  const names = lanes.map((lane) =>
    `<text class="tick" x="${LEFT - 4}" y="${(laneY(lane) + 3).toFixed(1)}" text-anchor="end">${
      lane.replace("_", " ")
    }</text>`
  ).join("")
  const marks = input.runs.map((run) =>
    `<circle class="mark" data-run="${esc(run.runId)}" cx="${x(run.finishedAt).toFixed(1)}" cy="${
      laneY(run.outcome).toFixed(1)
    }" r="3.5" fill="${colour(run.outcome)}"><title>${esc(label(run))}</title></circle>`
  ).join("")
  return `<figure class="chart" data-chart="outcomes"><figcaption>Outcomes</figcaption>
<svg viewBox="0 0 ${WIDTH} ${HEIGHT}" role="img" aria-label="Outcomes: ${input.runs.length} runs">
<line class="axis" x1="${LEFT}" y1="${HEIGHT - BOTTOM}" x2="${WIDTH}" y2="${HEIGHT - BOTTOM}"/>
${names}
${marks}</svg>${timeAxis(input)}</figure>`
}

/** The three charts of a window: repairs per run, duration per run, outcomes. */
export const historyCharts = (input: ChartInput) =>
  bars("repairs", "Repairs per run", (r) => r.repairs, (v) => String(v), input) +
  bars("duration", "Duration per run", (r) => r.durationMs, formatMs, input) +
  outcomes(input)

const bucketLabel = (b: HistoryBucket) =>
  `${formatUtc(b.start)} · ${b.runs} run${b.runs === 1 ? "" : "s"} (${b.failed} failed${
    b.dryRuns > 0 ? `, ${b.dryRuns} dry` : ""
  }) · ${b.repairs} repair${b.repairs === 1 ? "" : "s"} · slowest ${formatMs(b.durationMsMax)}`

const bucketBars = (
  kind: string,
  title: string,
  value: (b: HistoryBucket) => number,
  format: (v: number) => string,
  input: BucketInput
) => {
  const max = niceMax(Math.max(0, ...input.buckets.map(value)))
  const x = xOf({ ...input, runs: [] })
  const w = Math.max(1, (x(new Date(input.since.getTime() + input.bucketMs)) - x(input.since)) * 0.8)
  const plot = HEIGHT - BOTTOM - TOP
  const marks = input.buckets.map((b) => {
    const h = Math.max(1, (value(b) / max) * plot)
    return `<rect class="mark" data-bucket="${b.start.toISOString()}" x="${x(b.start).toFixed(1)}" y="${
      (HEIGHT - BOTTOM - h).toFixed(1)
    }" width="${w.toFixed(1)}" height="${h.toFixed(1)}" fill="${
      colour(b.failed > 0 ? "failed" : "succeeded")
    }"><title>${esc(bucketLabel(b))}</title></rect>`
  }).join("")
  return frame(kind, title, format(max), marks, { ...input, runs: [] })
}

interface BucketInput {
  readonly buckets: ReadonlyArray<HistoryBucket>
  readonly bucketMs: number
  readonly since: Date
  readonly until: Date
}

/** A long window's charts: repairs (real runs only), slowest run and runs per bucket. */
export const bucketCharts = (input: BucketInput) =>
  bucketBars("repairs", "Repairs per bucket (dry runs left out)", (b) => b.repairs, (v) => String(v), input) +
  bucketBars("duration", "Slowest run per bucket", (b) => b.durationMsMax, formatMs, input) +
  bucketBars("runs", "Runs per bucket", (b) => b.runs, (v) => String(v), input)

export const formatDuration = formatMs
