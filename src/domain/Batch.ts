/**
 * The batch descriptor: what the scheduler, the run guard, the CLI and the dashboard need to know
 * about a batch, as plain data plus the program itself.
 */
import * as Context from "effect/Context"
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import type { BacklogReading } from "./Backlog.ts"
import type { FenceError } from "./Errors.ts"
import type { RedisStoreName } from "./Health.ts"
import type { MissedRunPolicy } from "./Schedule.ts"
import type { Mode, ShadowProposal } from "./Shadow.ts"

export interface ExclusiveLeaseSpec {
  readonly name: string
  readonly ttl: Duration.Duration
}

export interface Batch<Summary = unknown, E = unknown, R = unknown> {
  /** kebab-case, used in CLI, events (`batch:<name>`), metrics and `SWEEPER_CRON_<NAME>`. */
  readonly name: string
  /** The GitLab worker this batch ports. */
  readonly worker: string
  readonly description: string
  /** Default 5-field cron expression (UTC unless `SWEEPER_TIMEZONE`). */
  readonly cron: string
  /** The run's time budget; the guard's hard timeout is this plus `HARD_TIMEOUT_GRACE`. */
  readonly budget: Duration.Duration
  /** The batch's own exclusive lease, if it must never overlap with itself cluster-wide. */
  readonly lease: Option.Option<ExclusiveLeaseSpec>
  readonly run: Effect.Effect<Summary, E, R>
  /** What the scheduler does about ticks missed while no process was running (default run-latest-if-recent). */
  readonly missedRuns?: MissedRunPolicy
  /**
   * What the batch writes, for the health gate: which signals can hold it and on what.
   * Absent: it writes nothing the gate watches, so nothing holds it.
   */
  readonly writes?: BatchWrites
  /**
   * The summary's counts of repaired items (builds failed, jobs moved, entries deleted): their sum
   * is the run's `repaired` in RunFinished, the one number the console charts for every batch.
   */
  readonly repairedCounts?: ReadonlyArray<string>
  /**
   * What waits for this batch's repair now, read by the batch's own query and judged by the same
   * domain decision its run repairs by (a reader beside the program, `<Program>Backlog.ts`), capped
   * at BACKLOG_CAP. Sampled by the console on a timer, never per request. Absent: nothing waits.
   */
  readonly backlog?: Effect.Effect<BacklogReading, unknown, R>
  /**
   * `act` (absent) repairs; `shadow` runs every run as a dry run that records what it would repair,
   * beside GitLab's own worker (SWEEPER_MODE, SWEEPER_MODE_<BATCH>; set by configuration).
   */
  readonly mode?: Mode
}

export interface BatchWrites {
  /**
   * PostgreSQL tables written (a partitioned table covers its partitions): autovacuum on any of
   * them holds the batch; writing any table at all subjects it to the database-wide signals
   * (replication lag, WAL rate, long transactions).
   */
  readonly tables?: ReadonlyArray<string>
  /** GitLab Redis stores written: each one's used/max memory. */
  readonly redisStores?: ReadonlyArray<RedisStoreName>
  /** Sidekiq queues pushed to: each one's latency. */
  readonly queues?: ReadonlyArray<string>
  /**
   * Also pushes to the queues SWEEPER_CONCURRENCY_LIMITS names (concurrency-limit-resume), and asks
   * the gate for its workers' effective limits: with `throttleLimits`, PostgreSQL and Prometheus
   * signals throttle those limits instead of holding it.
   */
  readonly concurrencyLimitQueues?: boolean
}

/**
 * `abandoned`: the run's process died (kill -9, OOM, power) before it wrote its RunFinished; a later
 * run of the batch closed it on its behalf (src/supervisor/AbandonedRuns.ts).
 */
export type Outcome = "succeeded" | "failed" | "timed_out" | "skipped" | "abandoned"

/** Cooperative budgets get this long past their budget before the guard interrupts the run. */
export const HARD_TIMEOUT_GRACE = Duration.seconds(30)

/** The fencing token of the exclusive lease a run holds; guarded writes check it. */
export interface Fence {
  readonly lease: string
  readonly epoch: number
  /**
   * Fails with LeaseLost when the lease is no longer ours (renewal failed or another holder), and
   * with the RedisError when the lease could not be read: a write on an unknown lease never happens.
   */
  readonly check: Effect.Effect<void, FenceError>
}

/**
 * What a program may know about the run it is part of. The run guard provides it; a program run
 * bare (in a spec) sees the defaults: not a dry run, no fence.
 */
export interface RunInfo {
  readonly runId: string | null
  readonly batch: string | null
  readonly dryRun: boolean
  readonly budget: Option.Option<Duration.Duration>
  /**
   * When the run's work must end (epoch ms), set once when the run starts: every loop, retried
   * attempt and gate wait of the run derives from it, so running loops one after another (workers
   * waiting for a slot) or retrying never buys a fresh budget. Absent in a bare spec: then the
   * first loop sets its own from `budget`.
   */
  readonly deadline?: number | undefined
  readonly fence: Option.Option<Fence>
  /** Where `reportProgress` counts go; the run guard provides one per run (absent in bare specs). */
  readonly progress?: ProgressSink | undefined
  /**
   * `sweeper run --now T`: the instant every threshold is judged at, exactly T. Timestamps the run
   * writes (and event times) still come from the real clock.
   */
  readonly asOf?: Date | undefined
  /**
   * A dry run's would-be targets (streams like `build:123`); the guard lists the first 100. A shadow
   * run also records each one's proposal (rule, outcome, facts read) in its ledger.
   */
  readonly wouldChange?: ((stream: string, proposal?: ShadowProposal) => Effect.Effect<void>) | undefined
}

/** Receives the work a program reports as it goes (see `reportProgress`). */
export interface ProgressSink {
  readonly report: (counts: Readonly<Record<string, unknown>>) => void
}

export const CurrentRun = Context.Reference<RunInfo>("sweeper/domain/Batch/CurrentRun", {
  defaultValue: () => ({ runId: null, batch: null, dryRun: false, budget: Option.none(), fence: Option.none() })
})

/**
 * Reports work just done, as summary fields: `{ dropped: 1 }`, `{ failedJids: [jid] }`. A run the
 * guard retries after a transient error then sums its attempts: the final summary is the last
 * attempt's plus what the failed attempts reported (numbers add, booleans OR, lists concatenate).
 * Report only work that stays done (repairs), not what a retry would see again (e.g. entries read).
 */
export const reportProgress = (counts: Readonly<Record<string, unknown>>): Effect.Effect<void> =>
  Effect.map(CurrentRun, (run) => run.progress?.report(counts))

/** The instant a run's decisions use: `--now`'s T when given, else the clock's now. */
export const decisionTime: Effect.Effect<DateTime.Utc> = Effect.gen(function*() {
  const run = yield* CurrentRun
  return run.asOf === undefined ? yield* DateTime.now : DateTime.fromDateUnsafe(run.asOf)
})

/** Notes, in a dry run, one thing the run would have changed (and, for shadow mode, how). */
export const wouldChange = (stream: string, proposal?: ShadowProposal): Effect.Effect<void> =>
  Effect.gen(function*() {
    const run = yield* CurrentRun
    if (run.wouldChange !== undefined) yield* run.wouldChange(stream, proposal)
  })

/** A safe point: stop here, writing nothing more, if the run's lease was lost or cannot be read. */
export const checkFence: Effect.Effect<void, FenceError> = Effect.gen(function*() {
  const run = yield* CurrentRun
  if (Option.isSome(run.fence)) yield* run.fence.value.check
})

/**
 * The `--now` rule (CLI `run --now`, the API's `now`): a real run never judges thresholds at a
 * future instant — it would repair things that are not stuck yet; only a dry run may look ahead.
 */
export const refusesLookAhead = (asOf: Date | undefined, now: Date, dryRun: boolean): boolean =>
  asOf !== undefined && !dryRun && asOf.getTime() > now.getTime()
