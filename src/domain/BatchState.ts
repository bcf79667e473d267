/**
 * A batch actor's state is a fold of its events (stream `batch:<name>`): rebuilt at start-up, so a
 * restarted process knows its last run, its last outcome, whether it is paused, and which tick it
 * last covered (for the missed-run policy).
 */
import type { Outcome } from "./Batch.ts"
import type { StoredEvent } from "./Events.ts"
import { redact } from "./Redaction.ts"

/** A non-dry run with a RunStarted and, so far, no RunFinished: running, or killed. */
export interface OpenRun {
  readonly runId: string
  readonly startedAt: Date
  readonly node: string
}

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
  /** The newest run that started and has not finished (running, or killed and not yet closed). */
  readonly openRun: OpenRun | undefined
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
  paused: false,
  openRun: undefined
}

const later = (a: Date | undefined, b: Date | undefined) =>
  a === undefined ? b : b === undefined ? a : a.getTime() >= b.getTime() ? a : b

const dateField = (value: unknown): Date | undefined =>
  typeof value === "string" && !Number.isNaN(Date.parse(value)) ? new Date(value) : undefined

/**
 * Outcomes the circuit breaker counts as failures. `abandoned` is one: a batch whose process keeps
 * dying mid-run (OOM on its data, a crash the run guard cannot catch) must trip the breaker like
 * one that keeps failing; a deploy kills a run now and then, never five in a row.
 */
export const isFailure = (outcome: Outcome): boolean =>
  outcome === "failed" || outcome === "timed_out" || outcome === "abandoned"

/** The state after a finished (non-dry) run: the scheduler applies it live, `evolve` from events. */
export const withRun = (state: BatchHistory, run: LastRun): BatchHistory => ({
  ...state,
  lastRun: run,
  lastSuccessAt: run.outcome === "succeeded" ? run.finishedAt : state.lastSuccessAt,
  consecutiveFailures: isFailure(run.outcome)
    ? state.consecutiveFailures + 1
    : run.outcome === "succeeded"
    ? 0
    : state.consecutiveFailures,
  openRun: state.openRun !== undefined && state.openRun.runId === run.runId ? undefined : state.openRun
})

/** Applies one event (oldest first) to the state. */
export const evolve = (state: BatchHistory, event: StoredEvent): BatchHistory => {
  switch (event.type) {
    case "RunStarted": {
      const runId = typeof event.data.run_id === "string" ? event.data.run_id : event.runId
      return {
        ...state,
        lastStartedAt: event.occurredAt,
        lastCoveredTick: later(state.lastCoveredTick, dateField(event.data.scheduled_at) ?? event.occurredAt),
        openRun: event.data.dryRun === true || runId === null
          ? state.openRun
          : { runId, startedAt: event.occurredAt, node: String(event.data.node ?? "") }
      }
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
        // Redacted as read too: a ledger written before a form was known keeps what it was given.
        error: typeof event.data.error === "string" ? redact(event.data.error) : undefined
      })
    }
    case "TickMissed":
      return { ...state, lastCoveredTick: later(state.lastCoveredTick, dateField(event.data.scheduled_at)) }
    case "BatchPaused":
      return {
        ...state,
        paused: true,
        pausedBy: typeof event.data.by === "string" ? event.data.by : undefined,
        pausedAt: event.occurredAt
      }
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

/** A started run as recorded, for deciding whether it was abandoned. */
export interface StartedRun {
  readonly runId: string
  readonly startedAt: Date
  readonly dryRun: boolean
  readonly budgetMs: number | undefined
  readonly leaseEpoch: number | undefined
}

/** RunStarted events among `events` (any order) whose run has no RunFinished among them. */
export const unfinishedRuns = (events: Iterable<StoredEvent>): ReadonlyArray<StartedRun> => {
  const started = new Map<string, StartedRun>()
  const finished = new Set<string>()
  for (const event of events) {
    if (event.type === "RunStarted") {
      const runId = typeof event.data.run_id === "string" ? event.data.run_id : event.runId
      if (runId === null) continue
      started.set(runId, {
        runId,
        startedAt: event.occurredAt,
        dryRun: event.data.dryRun === true,
        budgetMs: typeof event.data.budget_ms === "number" ? event.data.budget_ms : undefined,
        leaseEpoch: typeof event.data.lease_epoch === "number" ? event.data.lease_epoch : undefined
      })
    } else if (event.type === "RunFinished" && event.runId !== null) {
      finished.add(event.runId)
    }
  }
  return [...started.values()].filter((run) => !finished.has(run.runId))
}

/**
 * Why an unfinished run can no longer be running, or undefined while it still might be.
 *
 * - Lease superseded: the run held the batch's exclusive lease at epoch E and the caller now holds
 *   it at a newer epoch. The old holder's lease expired or was released, and fencing refuses any
 *   write it might still attempt, so it cannot do more work. No clock is involved.
 * - Budget elapsed: the run guard interrupts every run at budget + HARD_TIMEOUT_GRACE and then
 *   writes its RunFinished, so a run still open `slackMs` after that has lost its process. The
 *   slack covers clock skew between replicas (occurred_at comes from each writer's clock). This is
 *   the only rule for batches without a lease and for dry runs (which take no lease).
 *
 * A frozen (SIGSTOPped) process that wakes up later may still write its own RunFinished after the
 * `abandoned` one; the fold then shows the later outcome, which is the truth.
 */
export const abandonedBecause = (
  run: StartedRun,
  now: Date,
  options: {
    readonly leaseEpoch: number | undefined
    readonly defaultBudgetMs: number
    readonly graceMs: number
    readonly slackMs: number
  }
): string | undefined => {
  if (run.leaseEpoch !== undefined && options.leaseEpoch !== undefined && options.leaseEpoch > run.leaseEpoch) {
    return `its exclusive lease (epoch ${run.leaseEpoch}) was taken over at epoch ${options.leaseEpoch}`
  }
  const deadline = run.startedAt.getTime() + (run.budgetMs ?? options.defaultBudgetMs) + options.graceMs +
    options.slackMs
  if (now.getTime() > deadline) return "its budget + grace has passed"
  return undefined
}
