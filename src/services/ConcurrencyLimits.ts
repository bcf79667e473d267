/**
 * GitLab's Sidekiq concurrency limit state: which workers have deferred jobs, their limits,
 * how many of their jobs run now, and the move that resumes deferred jobs into their Sidekiq queue.
 *
 * The contract only. Both backends are built by `makeConcurrencyLimits`
 * (layers/ConcurrencyLimitsShared.ts) over their own Redis primitives, so they read the same keys
 * and write the same bytes; the pure rules (key forms, the job shape, what counts as stale) are in
 * domain/ConcurrencyLimit.ts.
 */
import * as Context from "effect/Context"
import type * as Duration from "effect/Duration"
import type * as Effect from "effect/Effect"
import type * as Option from "effect/Option"
import type { SqlError } from "effect/sql/SqlError"
import type { ConcurrencyLimitSetting, DeferredJob, DeferredPreview, WorkerLimit } from "../domain/ConcurrencyLimit.ts"
import type { RedisError, WrongTypeKey } from "../domain/Errors.ts"
import type { EventLog } from "./EventLog.ts"

export type { ConcurrencyLimitSetting, WorkerLimit }

export interface ResumeRequest {
  /** The worker class, e.g. `Releases::CreateEvidenceWorker`. */
  readonly worker: string
  /** The Sidekiq queue its jobs go to. */
  readonly queue: string
  /** Resume at most this many jobs (unparsable elements moved to the dead list do not count). */
  readonly max: number
  /** Read and decide, write nothing. */
  readonly dryRun: boolean
}

export interface ResumeResult {
  /** Jids of the resumed jobs, in the order they were buffered (the order Sidekiq will run them). */
  readonly jids: ReadonlyArray<string>
  /** Unparsable elements moved to the dead list, byte for byte as they were. */
  readonly dead: ReadonlyArray<Uint8Array>
  /** A dry run's: which elements the move would take (digests, `deferredDigests`'), for shadow mode. */
  readonly preview?: DeferredPreview | undefined
}

/** What one move did: its jobs, in their queue now (exactly once), and its dead elements. */
export interface MovedJobs {
  readonly queue: string
  /** The moved jobs, first buffered first (none if the move took only unparsable elements). */
  readonly jids: ReadonlyArray<string>
  /** How many unparsable elements the move put on the dead list. */
  readonly dead: number
}

/** A move journal left by a process that died mid-move, finished by this one. */
export type RecoveredMove = MovedJobs

/**
 * Records a move (the caller's event). Called once the move's jobs are in their queue and before
 * its journal is ended, so a crash before the record leaves the journal, whose recovery records the
 * move (again, if the crash came after the record): a move can be recorded twice, never not at all.
 */
export type RecordMove<E, R> = (move: MovedJobs) => Effect.Effect<void, E, R>

/** The workers known to have deferred jobs, as far as discovery has got without a whole-keyspace scan. */
export interface KnownDeferredWorkers {
  /**
   * Configured workers, those the last complete discovery found (a finished sweep, or a run's own
   * `workersWithDeferredJobs`), and those the sweep under way has found so far; sorted.
   */
  readonly workers: ReadonlyArray<string>
  /** When the last complete discovery started (what it found is as of then); null when none has completed yet. */
  readonly completeAt: Date | null
  /** Keys the sweep under way has been handed so far (SCAN COUNT hints summed): its progress. */
  readonly sweptKeys: number
}

/** How far one call may advance the incremental sweep: SCAN calls and COUNT hint, at most once per `every`. */
export interface SweepStep {
  readonly calls: number
  readonly count: number
  readonly every: Duration.Duration
}

export class ConcurrencyLimits extends Context.Service<ConcurrencyLimits, {
  /**
   * Configured workers plus those whose deferred list or move journal SCAN finds, keeping those
   * with jobs deferred or a move to finish (and those whose deferred key holds the wrong type, so
   * their pass reports it).
   */
  readonly workersWithDeferredJobs: Effect.Effect<ReadonlyArray<string>, RedisError>
  /**
   * The workers with deferred jobs kept known without scanning the whole keyspace at once: each call
   * advances one SCAN cursor, carried across calls, by at most `step` (none when the last advance is
   * under `step.every` old); a finished sweep, or a run's `workersWithDeferredJobs`, replaces the set.
   */
  knownDeferredWorkers(step: SweepStep): Effect.Effect<KnownDeferredWorkers, RedisError>
  /** The head of the deferred list (its oldest job) as parsed; None when empty or unparsable. */
  oldestDeferred(worker: string): Effect.Effect<Option.Option<DeferredJob>, RedisError | WrongTypeKey>
  /** The Redis `current_limit` override, else the configured limit; None for an unknown worker. */
  limitOf(worker: string): Effect.Effect<Option.Option<WorkerLimit>, RedisError | WrongTypeKey>
  /**
   * Digests (SHA-256 of the exact bytes, 16 hex digits) of the first `count` deferred elements: shadow
   * mode's bounded look at whether the jobs it proposed left the head.
   */
  deferredDigests(worker: string, count: number): Effect.Effect<ReadonlyArray<string>, RedisError | WrongTypeKey>
  /** LLEN of the deferred list. */
  queueSize(worker: string): Effect.Effect<number, RedisError | WrongTypeKey>
  /** HLEN(executing) + pending_resumed. */
  currentConcurrency(worker: string): Effect.Effect<number, RedisError | WrongTypeKey>
  /**
   * Removes executing trackers older than STALE_TRACKER_AGE whose Sidekiq thread (`<pid>:work`)
   * runs no job of this worker, or whose field is malformed. Returns how many were removed.
   */
  cleanupStaleTrackers(worker: string): Effect.Effect<number, RedisError | WrongTypeKey>
  /**
   * The `record` a pass gives `recoverMove` and `resume`: appends each move's events (domain
   * `moveEvents`: Resumed with the limit of `setting`, null for a worker with none now; Dead for its
   * unparsable elements) to the event log — called between the push and the journal's END (docs/operations.md,
   * "Failure handling"), so a move's events may be appended twice, never not at all.
   */
  recordMoves(worker: string, setting: Option.Option<WorkerLimit>): RecordMove<SqlError, EventLog>
  /**
   * Finishes a move a dead process left half done (its journal): the jobs reach their queue exactly
   * once, their slots are reserved, `record` is called, the journal goes. None when there was
   * nothing to finish.
   */
  recoverMove<E = never, R = never>(
    worker: string,
    record?: RecordMove<E, R>
  ): Effect.Effect<Option.Option<RecoveredMove>, RedisError | WrongTypeKey | E, R>
  /**
   * Moves up to `max` jobs from the head of the deferred list to the worker's Sidekiq queue (FIFO;
   * jobs appended meanwhile stay) by the journaled protocol of docs/architecture.md, "Resume across stores":
   * nothing lost or duplicated wherever the process dies. Unparsable elements go to the dead list.
   * `record` is called for each move once its jobs are pushed, before its journal is ended — for
   * this move and for a dead process's move it finishes first.
   */
  resume<E = never, R = never>(
    request: ResumeRequest,
    record?: RecordMove<E, R>
  ): Effect.Effect<ResumeResult, RedisError | WrongTypeKey | E, R>
}>()("sweeper/services/ConcurrencyLimits") {}
