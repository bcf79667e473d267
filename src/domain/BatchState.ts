/**
 * A batch actor's state is a fold of its events (stream `batch:<name>`): rebuilt at start-up, so a
 * restarted process knows its last run, its last outcome, whether it is paused, and which tick it
 * last covered (for the missed-run policy).
 */
import type { Outcome } from "./Batch.ts"
import type { StoredEvent } from "./Events.ts"

export interface LastRun {
  readonly runId: string | null
  readonly outcome: Outcome
  readonly finishedAt: Date
  readonly durationMs: number
  readonly summary: unknown
  /** Why a run did not succeed (`lease held`, `interrupted`, …), when the guard knows. */
  readonly reason?: string | undefined
  /** A failed run's error with its cause chain. */
  readonly error?: string | undefined
}

export interface BatchHistory {
  readonly lastStartedAt: Date | undefined
  /** The newest tick that ran, was skipped or was recorded missed. */
  readonly lastCoveredTick: Date | undefined
  readonly lastRun: LastRun | undefined
  readonly lastSuccessAt: Date | undefined
  readonly consecutiveFailures: number
  readonly paused: boolean
  /** Who paused the batch and when (BatchPaused's `by` and time), while it is paused. */
  readonly pausedBy?: string | undefined
  readonly pausedAt?: Date | undefined
}

export const emptyHistory: BatchHistory = {
  lastStartedAt: undefined,
  lastCoveredTick: undefined,
  lastRun: undefined,
  lastSuccessAt: undefined,
  consecutiveFailures: 0,
  paused: false
}

const later = (a: Date | undefined, b: Date | undefined) =>
  a === undefined ? b : b === undefined ? a : a.getTime() >= b.getTime() ? a : b

const dateField = (value: unknown): Date | undefined =>
  typeof value === "string" && !Number.isNaN(Date.parse(value)) ? new Date(value) : undefined

/** The state after a finished (non-dry) run: the scheduler applies it live, `evolve` from events. */
export const withRun = (state: BatchHistory, run: LastRun): BatchHistory => ({
  ...state,
  lastRun: run,
  lastSuccessAt: run.outcome === "succeeded" ? run.finishedAt : state.lastSuccessAt,
  consecutiveFailures: run.outcome === "failed" || run.outcome === "timed_out"
    ? state.consecutiveFailures + 1
    : run.outcome === "succeeded" ? 0 : state.consecutiveFailures
})

/** Applies one event (oldest first) to the state. */
export const evolve = (state: BatchHistory, event: StoredEvent): BatchHistory => {
  switch (event.type) {
    case "RunStarted":
      return {
        ...state,
        lastStartedAt: event.occurredAt,
        lastCoveredTick: later(state.lastCoveredTick, dateField(event.data.scheduled_at) ?? event.occurredAt)
      }
    case "RunFinished": {
      const outcome = event.data.outcome as Outcome
      if (event.data.dryRun === true) return state
      return withRun(state, {
        runId: event.runId,
        outcome,
        finishedAt: event.occurredAt,
        durationMs: Number(event.data.duration_ms ?? 0),
        summary: event.data.summary,
        reason: typeof event.data.reason === "string" ? event.data.reason : undefined,
        error: typeof event.data.error === "string" ? event.data.error : undefined
      })
    }
    case "TickMissed":
      return { ...state, lastCoveredTick: later(state.lastCoveredTick, dateField(event.data.scheduled_at)) }
    case "BatchPaused":
      return { ...state, paused: true, pausedBy: typeof event.data.by === "string" ? event.data.by : undefined, pausedAt: event.occurredAt }
    case "BatchResumed":
      return { ...state, paused: false, pausedBy: undefined, pausedAt: undefined }
    default:
      return state
  }
}

export const foldHistory = (events: Iterable<StoredEvent>): BatchHistory => {
  let state = emptyHistory
  for (const event of events) state = evolve(state, event)
  return state
}

/** Consecutive failed runs after which the scheduler stops running a batch's ticks for a while. */
export const BREAKER_THRESHOLD = 5
/** The shortest time the breaker stays open; it also stays open for at least three periods. */
export const BREAKER_MIN_COOLDOWN_MS = 5 * 60_000

/**
 * The scheduler's circuit breaker: open while the last BREAKER_THRESHOLD runs failed and the last
 * failure is more recent than the cool-down. After the cool-down one tick runs (half-open): success
 * closes it, failure opens it again.
 */
export const isBreakerOpen = (history: BatchHistory, now: Date, periodMs: number): boolean =>
  breakerOpenUntil(history, now, periodMs) !== undefined

/** When the open breaker lets one tick through again; undefined while it is closed. */
export const breakerOpenUntil = (history: BatchHistory, now: Date, periodMs: number): Date | undefined => {
  if (history.consecutiveFailures < BREAKER_THRESHOLD || history.lastRun === undefined) return undefined
  const cooldown = Math.max(BREAKER_MIN_COOLDOWN_MS, 3 * periodMs)
  const until = history.lastRun.finishedAt.getTime() + cooldown
  return now.getTime() < until ? new Date(until) : undefined
}
