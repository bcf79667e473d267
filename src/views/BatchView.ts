/**
 * One batch as an operator sees it, shared by `sweeper status`, `GET /api/batches` and the
 * dashboard so the three never disagree: its schedule in words with the next fire times, its
 * state (idle / running / paused by whom / disabled / breaker open until when), its last run with
 * the error's cause, its configuration (budget, lease, missed-run policy), and the database it
 * writes (GitLab's main or ci, which differ only in a decomposed GitLab).
 */
import * as Cron from "effect/Cron"
import * as Duration from "effect/Duration"
import * as Option from "effect/Option"
import { HARD_TIMEOUT_GRACE } from "../domain/Batch.ts"
import type { BatchHistory } from "../domain/BatchState.ts"
import { breakerOpenUntil } from "../domain/BatchState.ts"
import { databaseOfWrites } from "../domain/Databases.ts"
import { DEFAULT_MISSED_RUN_POLICY } from "../domain/Schedule.ts"
import type { RegisteredBatch } from "../programs/index.ts"
import type { BatchSnapshot } from "../supervisor/Scheduler.ts"

export type BatchState = "idle" | "running" | "paused" | "disabled" | "breaker_open"

export interface BatchInput {
  readonly batch: RegisteredBatch
  readonly cronText: string
  readonly cron: Cron.Cron
  readonly timezone: string
  readonly running: boolean
  readonly disabled: boolean
  readonly history: BatchHistory
  /** GitLab's ci tables are in a database of their own (CiDatabase.decomposed); default: one database. */
  readonly decomposed?: boolean | undefined
}

const NEXT_TICKS = 3

const pad = (n: number) => String(n).padStart(2, "0")
const every = (n: number, unit: string) => n === 1 ? `every ${unit}` : `every ${n} ${unit}s`

/**
 * The common cron shapes in words (`*\/6 * * * *` → "every 6 minutes"); anything else is shown as
 * the expression itself, next to the fire times that make it concrete.
 */
export const cronInWords = (expression: string): string => {
  const fields = expression.trim().split(/\s+/)
  const [second, minute, hour, dom, month, dow] = fields.length === 6 ? fields : ["0", ...fields]
  const rest = [dom, month, dow].every((f) => f === "*")
  if (!rest || minute === undefined || hour === undefined || second === undefined) return expression
  const step = (field: string) => /^\*\/(\d+)$/.exec(field)?.[1]
  if (fields.length === 6 && minute === "*" && hour === "*") {
    if (second === "*") return "every second"
    const n = step(second)
    if (n !== undefined) return every(Number(n), "second")
    return expression
  }
  if (second !== "0") return expression
  if (hour === "*") {
    if (minute === "*") return "every minute"
    const n = step(minute)
    if (n !== undefined) return every(Number(n), "minute")
    if (/^\d+$/.test(minute)) return `hourly at :${pad(Number(minute))}`
    return expression
  }
  const h = step(hour)
  if (h !== undefined && /^\d+$/.test(minute)) return `${every(Number(h), "hour")} at :${pad(Number(minute))}`
  if (/^\d+$/.test(hour) && /^\d+$/.test(minute)) return `daily at ${pad(Number(hour))}:${pad(Number(minute))}`
  return expression
}

export const nextFireTimes = (cron: Cron.Cron, after: Date, count = NEXT_TICKS): Array<Date> => {
  const times: Array<Date> = []
  let at = after
  for (let i = 0; i < count; i++) {
    at = Cron.next(cron, at)
    times.push(at)
  }
  return times
}

const iso = (date: Date | undefined) => date?.toISOString() ?? null

export const batchView = (input: BatchInput, now: Date) => {
  const { batch, history } = input
  const upcoming = nextFireTimes(input.cron, now)
  const periodMs = upcoming.length >= 2 ? upcoming[1]!.getTime() - upcoming[0]!.getTime() : 60_000
  const breakerUntil = breakerOpenUntil(history, now, periodMs)
  const state: BatchState = input.disabled
    ? "disabled"
    : input.running
    ? "running"
    : history.paused
    ? "paused"
    : breakerUntil !== undefined
    ? "breaker_open"
    : "idle"
  // A paused or disabled batch has no next tick: nothing will fire.
  const scheduled = !input.disabled && !history.paused
  const last = history.lastRun
  return {
    name: batch.name,
    worker: batch.worker,
    description: batch.description,
    // Shadow: the batch proposes beside GitLab's worker and writes nothing of GitLab's.
    mode: batch.mode ?? "act",
    cron: input.cronText,
    cronInWords: cronInWords(input.cronText),
    timezone: input.timezone,
    state,
    disabled: input.disabled,
    paused: history.paused ? { by: history.pausedBy ?? null, at: iso(history.pausedAt) } : null,
    breaker: { open: breakerUntil !== undefined, until: iso(breakerUntil) },
    nextTick: scheduled ? iso(upcoming[0]) : null,
    nextTicks: scheduled ? upcoming.map((d) => d.toISOString()) : [],
    lastRun: last === undefined ? null : {
      runId: last.runId,
      outcome: last.outcome,
      finishedAt: last.finishedAt.toISOString(),
      durationMs: last.durationMs,
      summary: last.summary,
      reason: last.reason ?? null,
      error: last.error ?? null
    },
    lastOutcome: last?.outcome ?? null,
    // A run with a RunStarted and no RunFinished: running, or killed before it could finish (the
    // next run closes it as abandoned). Overdue once its budget + grace has passed: certainly dead.
    openRun: history.openRun === undefined ? null : {
      runId: history.openRun.runId,
      startedAt: history.openRun.startedAt.toISOString(),
      node: history.openRun.node,
      overdue: now.getTime() - history.openRun.startedAt.getTime() >
        Duration.toMillis(Duration.sum(batch.budget, HARD_TIMEOUT_GRACE))
    },
    lastSuccessAt: iso(history.lastSuccessAt),
    consecutiveFailures: history.consecutiveFailures,
    // With one database every batch writes it, and it is main's: "ci" only says something decomposed.
    database: databaseOfWrites(batch.writes, input.decomposed === true),
    decomposed: input.decomposed === true,
    config: {
      budget: Duration.format(batch.budget),
      lease: Option.match(batch.lease, {
        onNone: () => null,
        onSome: (lease) => ({ name: lease.name, ttl: Duration.format(lease.ttl) })
      }),
      missedRuns: batch.missedRuns ?? DEFAULT_MISSED_RUN_POLICY
    }
  }
}

export type BatchView = ReturnType<typeof batchView>

/** A scheduler snapshot's view now: what /metrics, the API and the console start from. */
export const snapshotView = (snapshot: BatchSnapshot, now: Date, decomposed = false): BatchView =>
  batchView({
    decomposed,
    batch: snapshot.batch,
    cronText: snapshot.cron,
    cron: snapshot.cronSchedule,
    timezone: snapshot.timezone,
    running: snapshot.status === "running",
    disabled: snapshot.status === "disabled",
    history: snapshot.history
  }, now)
