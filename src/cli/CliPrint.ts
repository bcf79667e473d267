/**
 * What the `sweeper` commands print: one line per run or event (or its JSON with `--json`), and
 * the status table, aligned and — on a terminal — cut to its width, so a row never wraps.
 */
import * as Console from "effect/Console"
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import { summaryLabel } from "../http/Dashboard.ts"
import { fullyRecorded } from "../supervisor/RunGuard.ts"
import { dryRunLabel, orderedSummary } from "../views/SummaryOrder.ts"
import { formatUtc } from "../views/Time.ts"
import type { EventView, RunView, View } from "./Operator.ts"

export const printRun = (result: RunView, asJson: boolean) =>
  Effect.gen(function*() {
    if (asJson) {
      yield* Console.log(JSON.stringify({
        batch: result.batch,
        runId: result.runId,
        outcome: result.outcome,
        dryRun: result.dryRun,
        summary: orderedSummary(result.summary, result.batch),
        ...(result.reason === undefined ? {} : { reason: result.reason }),
        ...(result.error === undefined ? {} : { error: result.error }),
        ...(result.targets === undefined ? {} : { targets: result.targets, targetsTotal: result.targetsTotal }),
        ...(result.eventsOwed === undefined ? {} : { eventsOwed: result.eventsOwed }),
        ...(result.runFinished === undefined ? {} : { runFinished: result.runFinished })
      }))
    } else {
      const label = result.dryRun ? `${result.batch} (dry run)` : result.batch
      yield* Console.log(
        `${label} ${result.outcome}${result.reason ? ` (${result.reason})` : ""}: ${
          summaryInWords(result.summary, result.batch, result.dryRun)
        }`
      )
      if (result.error !== undefined) yield* Console.log(`  error: ${result.error}`)
      if (result.targets !== undefined && result.targets.length > 0) {
        yield* Console.log(`  would change ${result.targetsTotal} (first ${result.targets.length} listed):`)
        for (const target of result.targets) yield* Console.log(`    ${target}`)
      }
      if (!fullyRecorded(result)) yield* Console.log(`  not fully recorded: ${notRecorded(result)}`)
    }
    if (result.outcome === "failed" || result.outcome === "timed_out") process.exitCode = 1
    else if (!fullyRecorded(result)) process.exitCode = 4
  })

/**
 * A run's summary as the console says it (SummaryOrder.ts): `dropped 5, doomed 0, batches 1, …`,
 * the batch's repairs first; a dry run's `would drop 5, …`. Lists and records stay JSON.
 */
export const summaryInWords = (summary: unknown, batch: string, dryRun: boolean): string => {
  const ordered = orderedSummary(summary, batch)
  if (ordered === null || typeof ordered !== "object" || Array.isArray(ordered)) return JSON.stringify(ordered)
  return Object.entries(ordered).map(([key, value]) =>
    `${dryRunLabel(key, dryRun) ?? summaryLabel(key)} ${
      typeof value === "object" ? JSON.stringify(value) : key.endsWith("Ms") ? `${value} ms` : String(value)
    }`
  ).join(", ")
}

/** What of a run the ledger does not have yet, in words. */
const notRecorded = (result: RunView) =>
  [
    ...(result.eventsOwed === undefined ? [] : [
      `${result.eventsOwed} repair event(s) not yet in main's ledger (waiting in ci's outbox; the relay retries)`
    ]),
    ...(result.runFinished === "outbox" ? ["RunFinished waits in ci's outbox behind them"] : []),
    ...(result.runFinished === "nowhere" ? ["RunFinished could not be recorded anywhere"] : [])
  ].join("; ")

/** A run's summary inside an event (RunFinished) in the same reading order as everywhere else. */
const withOrderedSummary = (event: EventView): EventView =>
  "summary" in event.data && typeof event.data.batch === "string"
    ? { ...event, data: { ...event.data, summary: orderedSummary(event.data.summary, event.data.batch) } }
    : event

export const printEvent = (shown: EventView, asJson: boolean) => {
  const event = withOrderedSummary(shown)
  return Console.log(
    asJson
      ? JSON.stringify(event)
      : `${formatUtc(event.occurredAt)} ${event.stream} ${event.type} ${JSON.stringify(event.data)}${
        event.runId ? ` run=${event.runId}` : ""
      }`
  )
}

const ago = (iso: string | null, now: number) => {
  if (iso === null) return "never"
  const seconds = Math.max(0, Math.round((now - Date.parse(iso)) / 1000))
  return seconds < 120
    ? `${seconds}s ago`
    : seconds < 7200
    ? `${Math.round(seconds / 60)}m ago`
    : seconds < 172800
    ? `${Math.round(seconds / 3600)}h ago`
    : `${Math.round(seconds / 86400)}d ago`
}

/** The state with its detail: who paused and when, until when the breaker stays open. */
export const stateDetail = (view: View) => {
  switch (view.state) {
    case "paused":
      return `paused${view.paused?.by ? ` by ${view.paused.by}` : ""}${
        view.paused?.at ? ` at ${formatUtc(view.paused.at)}` : ""
      }`
    case "breaker_open":
      return `breaker open until ${view.breaker.until === null ? "?" : formatUtc(view.breaker.until)}`
    case "disabled":
      return "disabled (SWEEPER_DISABLED_BATCHES)"
    default:
      return view.state
  }
}

/** The terminal's width when stdout is one, else no limit: piped output stays whole for grep and awk. */
const terminalWidth = () =>
  process.stdout.isTTY === true && process.stdout.columns > 0 ? process.stdout.columns : Infinity

export const printStatus = (views: ReadonlyArray<View>, json: boolean) =>
  Effect.gen(function*() {
    if (json) return yield* Console.log(JSON.stringify(views))
    const now = DateTime.toEpochMillis(yield* DateTime.now)
    // Which database each batch writes is a column only when there are two (a decomposed GitLab).
    const decomposed = views.some((v) => v.decomposed)
    const rows = [
      [
        "BATCH",
        "STATE",
        ...(decomposed ? ["DATABASE"] : []),
        "SCHEDULE",
        "NEXT TICK",
        "LAST RUN",
        "OUTCOME",
        "FAILURES"
      ],
      ...views.map((v) => [
        v.name,
        stateDetail(v),
        ...(decomposed ? [v.database] : []),
        `${v.cronInWords} (${v.timezone})`,
        v.nextTick === null ? "-" : formatUtc(v.nextTick),
        ago(v.lastRun?.finishedAt ?? null, now),
        v.lastOutcome ?? "-",
        String(v.consecutiveFailures)
      ])
    ]
    const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)))
    const width = terminalWidth()
    for (const row of rows) {
      const line = row.map((cell, i) => cell.padEnd(widths[i]!)).join("  ").trimEnd()
      yield* Console.log(line.length > width ? `${line.slice(0, width - 1)}…` : line)
    }
    for (const v of views) {
      if (v.lastRun?.error) yield* Console.log(`${v.name}: last error: ${v.lastRun.error}`)
      // A RunStarted with no RunFinished: running, or killed (the next run closes it as abandoned).
      if (v.openRun !== null) {
        yield* Console.log(
          `${v.name}: run ${v.openRun.runId} started ${formatUtc(v.openRun.startedAt)} on ${v.openRun.node} ${
            v.openRun.overdue
              ? "never finished: killed; the next run closes it as abandoned"
              : "has not finished: running, or killed"
          }`
        )
      }
    }
    // What the health gate holds, one line each.
    for (const v of views) for (const hold of v.holds ?? []) yield* Console.log(hold)
  })
