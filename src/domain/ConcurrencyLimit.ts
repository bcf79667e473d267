/**
 * GitLab's Sidekiq concurrency limit, as concurrency-limit-resume sees it: the key formats
 * (worker name → Rails `underscore`, wrapped in `{…}` so every key of one worker shares a Redis
 * Cluster slot), the constants of ConcurrencyLimit::ResumeWorker, the capacity arithmetic, and the
 * Schemas for what GitLab writes (deferred list elements, executing-tracker fields, Sidekiq's
 * `<pid>:work` hash) — all untrusted, so all decoded, never hand-parsed.
 */
import * as Duration from "effect/Duration"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import { decodeUtf8 } from "./Bytes.ts"
import { ConcurrencyLimitJobsDead, ConcurrencyLimitJobsResumed } from "./Events.ts"
import { hashTagOf } from "./RedisKey.ts"
import type { Pending, ShadowCandidate, ShadowProposal, Verdict } from "./Shadow.ts"
import { type SidekiqJob, sidekiqJob } from "./Sidekiq.ts"

// ---------------------------------------------------------------------------------------------
// Rails inflections (ActiveSupport::Inflector#underscore / #camelize)
// ---------------------------------------------------------------------------------------------

/** Inflection acronyms (`inflect.acronym "API"`). GitLab registers none that worker names use. */
export interface Inflections {
  readonly acronyms: ReadonlyArray<string>
}

export const NO_ACRONYMS: Inflections = { acronyms: [] }

const escapeRegExp = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")

/** `Releases::CreateEvidenceWorker` → `releases/create_evidence_worker`, exactly as Rails does it. */
export const underscore = (word: string, inflections: Inflections = NO_ACRONYMS): string => {
  if (!/[A-Z-]|::/.test(word)) return word
  let out = word.replaceAll("::", "/")
  if (inflections.acronyms.length > 0) {
    const acronym = inflections.acronyms.map(escapeRegExp).join("|")
    const re = new RegExp(`(?:(?<=([A-Za-z\\d]))|\\b)(${acronym})(?=\\b|[^a-z])`, "g")
    out = out.replace(
      re,
      (_m, before: string | undefined, found: string) => `${before === undefined ? "" : "_"}${found.toLowerCase()}`
    )
  }
  out = out.replace(/(?<=[A-Z])(?=[A-Z][a-z])|(?<=[a-z\d])(?=[A-Z])/g, "_")
  return out.replaceAll("-", "_").toLowerCase()
}

/** Ruby's String#capitalize: first character upper case, the rest lower case. */
const capitalize = (s: string) => s.length === 0 ? s : s[0]!.toUpperCase() + s.slice(1).toLowerCase()

/** `releases/create_evidence_worker` → `Releases::CreateEvidenceWorker` (the inverse of `underscore`). */
export const camelize = (term: string, inflections: Inflections = NO_ACRONYMS): string => {
  const acronyms = new Map(inflections.acronyms.map((a) => [a.toLowerCase(), a]))
  const word = (w: string) => acronyms.get(w) ?? capitalize(w)
  return term
    .replace(/^[a-z\d]*/, word)
    .replace(
      /(?:_|(\/))([a-z\d]*)/gi,
      (_m, slash: string | undefined, w: string) => `${slash === undefined ? "" : "::"}${word(w)}`
    )
}

/**
 * A Sidekiq worker class name as GitLab writes it (`Releases::CreateEvidenceWorker`): every job
 * Sweeper pushes carries its worker as `class`, and Sidekiq constantizes it. A configured worker is
 * checked at start-up; a name found in Redis keys (camelized from their key form, so anyone who can
 * write a key chooses it) is checked before any of its jobs is pushed.
 */
const WORKER_CLASS = /^[A-Z][A-Za-z0-9_]*(::[A-Z][A-Za-z0-9_]*)*$/

export const isWorkerClassName = (worker: string): boolean => WORKER_CLASS.test(worker)

// ---------------------------------------------------------------------------------------------
// Keys (GitLab's formats)
// ---------------------------------------------------------------------------------------------

const PREFIX = "sidekiq:concurrency_limit"

/** Prefix of the deferred lists; SCAN with `${DEFERRED_KEY_PREFIX}*` finds every worker's list. */
export const DEFERRED_KEY_PREFIX = `${PREFIX}:throttled_jobs:`
export const DEFERRED_KEY_PATTERN = `${DEFERRED_KEY_PREFIX}*`

export interface WorkerKeys {
  /** List of deferred jobs: RPUSH at the tail by GitLab's middleware, resumed from the head. */
  readonly deferred: string
  /** Hash `<pid>:tid:<tid>` → start epoch seconds of the jobs running now. */
  readonly executing: string
  /** Resumed jobs not yet started (slots reserved by the move, 60 s TTL). */
  readonly pendingResumed: string
  /** Operator override of the configured limit. */
  readonly currentLimit: string
  /** Unparsable deferred elements, kept for inspection (never dropped). */
  readonly dead: string
  /**
   * Sweeper's in-flight move journal: the jobs taken off the deferred list and not yet
   * known to be in their Sidekiq queue. SharedState store, same `{w}` slot as the deferred list.
   */
  readonly journal: string
}

export const workerKeys = (worker: string): WorkerKeys => {
  const w = underscore(worker)
  return {
    deferred: `${DEFERRED_KEY_PREFIX}{${w}}`,
    executing: `${PREFIX}:{${w}}:executing`,
    pendingResumed: `${PREFIX}:{${w}}:pending_resumed`,
    currentLimit: `${PREFIX}:{${w}}:current_limit`,
    dead: `${PREFIX}:dead:{${w}}`,
    journal: `${PREFIX}:{${w}}:sweeper_moving`
  }
}

/**
 * The "this batch is already in its queue" marker (Queues store). It carries the hash tag of
 * `queue:<queue>` so the push script that sets it and LPUSHes the jobs stays in one cluster slot.
 */
export const resumeBatchMarkerKey = (queueKeyName: string, batch: string) =>
  `sweeper:resume_batch:{${hashTagOf(queueKeyName)}}:${batch}`

/** The key form `w` of a deferred list key found by SCAN (`…:throttled_jobs:{w}` → `w`). */
export const workerKeyFormOf = (deferredKey: string): Option.Option<string> => {
  if (!deferredKey.startsWith(DEFERRED_KEY_PREFIX)) return Option.none()
  const rest = deferredKey.slice(DEFERRED_KEY_PREFIX.length)
  const inner = rest.startsWith("{") && rest.endsWith("}") ? rest.slice(1, -1) : rest
  return inner.length === 0 ? Option.none() : Option.some(inner)
}

const JOURNAL_PREFIX = `${PREFIX}:{`
const JOURNAL_SUFFIX = "}:sweeper_moving"
/** SCAN pattern of the move journals (Redis glob: `{` and `}` are literal). */
export const JOURNAL_KEY_PATTERN = `${JOURNAL_PREFIX}*${JOURNAL_SUFFIX}`

/** The key form `w` of a move journal key found by SCAN. */
export const journalKeyFormOf = (journalKey: string): Option.Option<string> =>
  journalKey.startsWith(JOURNAL_PREFIX) && journalKey.endsWith(JOURNAL_SUFFIX) &&
    journalKey.length > JOURNAL_PREFIX.length + JOURNAL_SUFFIX.length
    ? Option.some(journalKey.slice(JOURNAL_PREFIX.length, -JOURNAL_SUFFIX.length))
    : Option.none()

/** The Sidekiq process work hash a tracker field points at (Sidekiq's `<identity>:work`). */
export const processWorkKey = (pid: string) => `${pid}:work`

// ---------------------------------------------------------------------------------------------
// Constants (ConcurrencyLimit::ResumeWorker and its services)
// ---------------------------------------------------------------------------------------------

/**
 * A pass of a worker with a positive limit that leaves jobs behind runs again this much later:
 * what frees capacity is running jobs finishing, not time, so polling faster would only spin.
 * Limit 0 (unlimited) has no capacity to wait for: its passes run back to back.
 */
export const RESCHEDULE_DELAY = Duration.seconds(1)
/**
 * Limit 0 means unlimited: resume up to this many per pass (one move). GitLab moves 1000 and sleeps
 * 1 s; after an incident the backlog is the recovery time, so Sweeper moves more per pass and does
 * not sleep. 5000 keeps every step of the move one bounded script call: the journal step receives
 * 2 × 5000 arguments and the push step 5000 (Redis allows far more per command), each a loop of
 * 5000 list operations — a few milliseconds of server time, so other clients wait no longer than
 * behind an ordinary large LRANGE.
 */
export const MAX_RESUME_UNLIMITED = 5000
/** An executing tracker older than this is checked against Sidekiq's work hash and maybe removed. */
export const STALE_TRACKER_AGE = Duration.seconds(600)
/** The move (re)sets this TTL on pending_resumed, so a lost decrement frees its slot eventually. */
export const PENDING_RESUMED_TTL = Duration.seconds(60)
/**
 * How long a move journal and its batch marker live. A journal normally lives for milliseconds; it
 * only survives a crash, and the next pass of that worker replays it. The TTL only bounds how long
 * an abandoned journal waits for a Sweeper to come back (a week covers any outage), and the marker
 * outlives the journal that refers to it, so a replay always sees whether its push happened.
 */
export const MOVE_JOURNAL_TTL = Duration.days(7)
/**
 * The dead list is Sweeper's own key, and every key Sweeper creates has a TTL: unparsable elements
 * stay for inspection this long after the last one was added (every addition refreshes it).
 */
export const DEAD_LIST_TTL = Duration.days(30)
/** A run's default budget: inside the one-minute cron period, so the next tick carries on. */
export const RUN_BUDGET = Duration.seconds(55)
/** HSCAN / SCAN page size. */
export const SCAN_COUNT = 100

/**
 * How many deferred jobs may be resumed now: the free capacity for a positive limit, up to
 * MAX_RESUME_UNLIMITED for 0 (unlimited), none for a negative limit (circuit breaker open).
 */
export const resumableCount = (limit: number, current: number): number => {
  if (limit > 0) return Math.max(limit - current, 0)
  if (limit === 0) return MAX_RESUME_UNLIMITED
  return 0
}

// ---------------------------------------------------------------------------------------------
// Untrusted data
// ---------------------------------------------------------------------------------------------

/**
 * One element of the deferred list as GitLab's ConcurrencyLimit::QueueManager writes it:
 * `{args, context, buffered_at}`. `context` (Labkit's `meta.*` keys) and `buffered_at` (float epoch
 * seconds) are absent in elements written by older GitLab versions, so they are optional.
 */
export const DeferredJob = Schema.Struct({
  args: Schema.Array(Schema.Unknown),
  context: Schema.optionalKey(Schema.NullOr(Schema.Record(Schema.String, Schema.Unknown))),
  buffered_at: Schema.optionalKey(Schema.NullOr(Schema.Finite))
})
export type DeferredJob = typeof DeferredJob.Type

const decodeDeferredValue = Schema.decodeUnknownOption(DeferredJob)

/**
 * JSON text to a DeferredJob: JSON.parse (as Schema.fromJsonString does), then the Schema on the
 * parsed value. The same elements decode and the same ones fail; going through fromJsonString cost
 * half again as much CPU per element (measured: 15 vs 10 ms per 5000), and a limit-0 move decodes
 * 5000.
 */
const decodeDeferred = (text: string): Option.Option<DeferredJob> => {
  let parsed: unknown
  try {
    parsed = JSON.parse(text)
  } catch {
    return Option.none()
  }
  return decodeDeferredValue(parsed)
}

/**
 * A raw list element, decoded; None when it is not a deferred job (it goes to the dead list). Bytes
 * that are not valid UTF-8 are not a deferred job either: GitLab writes JSON. Nor is an element that
 * starts with a byte-order mark: JSON has none (RFC 8259 §8.1) and GitLab's `JSON.parse` (Ruby) fails
 * on one, so Sweeper must not resume what GitLab itself could not (`decodeUtf8` keeps the BOM).
 */
export const parseDeferred = (raw: string | Uint8Array): Option.Option<DeferredJob> =>
  typeof raw === "string" ? decodeDeferred(raw) : Option.flatMap(decodeUtf8(raw), decodeDeferred)

/**
 * The first line of a move journal: which batch, to which queue, and how many unparsable elements
 * the move put on the dead list (so a recovery can record them; absent in journals that predate it: 0).
 */
export const MoveJournalHeader = Schema.Struct({
  sweeper_move: Schema.Literal(1),
  batch: Schema.String.check(Schema.isPattern(/^[0-9a-f]{24}$/)),
  queue: Schema.String.check(Schema.isMinLength(1)),
  worker: Schema.String,
  dead: Schema.optionalKey(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)))
})
export type MoveJournalHeader = typeof MoveJournalHeader.Type

export const encodeJournalHeader = (header: MoveJournalHeader): string => JSON.stringify(header)

export const parseJournalHeader = (raw: Uint8Array): Option.Option<MoveJournalHeader> =>
  Option.flatMap(decodeUtf8(raw), Schema.decodeUnknownOption(Schema.fromJsonString(MoveJournalHeader)))

/** The keys a resumed job owns; a stored context cannot overwrite them. */
const RESERVED_JOB_KEYS = new Set([
  "class",
  "args",
  "jid",
  "queue",
  "retry",
  "created_at",
  "enqueued_at",
  "concurrency_limit_resume",
  "concurrency_limit_buffered_at"
])

/**
 * The Sidekiq job that resumes a deferred one: its stored args, its stored
 * context merged in as top-level keys (as Labkit's client middleware does when GitLab re-enqueues
 * under `with_raw_context`), and the `concurrency_limit_resume` marker the middleware checks so the
 * job is not deferred again.
 */
export const resumedJob = (options: {
  readonly worker: string
  readonly queue: string
  readonly deferred: DeferredJob
  readonly jid: string
  readonly nowMillis: number
}): SidekiqJob => {
  const context = Object.entries(options.deferred.context ?? {}).filter(([key]) => !RESERVED_JOB_KEYS.has(key))
  return sidekiqJob({
    workerClass: options.worker,
    args: options.deferred.args,
    queue: options.queue,
    jid: options.jid,
    nowMillis: options.nowMillis,
    extra: {
      ...Object.fromEntries(context),
      concurrency_limit_resume: true,
      concurrency_limit_buffered_at: options.deferred.buffered_at ?? null
    }
  })
}

/** Executing-tracker field `<pid>:tid:<tid>`; the pid is Sidekiq's process identity (may hold `:`). */
export const TrackerField = Schema.String.check(Schema.isPattern(/^.+:tid:[^:]+$/))

export interface TrackerOwner {
  readonly pid: string
  readonly tid: string
}

export const parseTrackerField = (field: string): Option.Option<TrackerOwner> =>
  Option.map(Schema.decodeUnknownOption(TrackerField)(field), (valid) => {
    const at = valid.lastIndexOf(":tid:")
    return { pid: valid.slice(0, at), tid: valid.slice(at + ":tid:".length) }
  })

/** A tracker's start time (epoch seconds). */
export const parseTrackerStart = Schema.decodeUnknownOption(Schema.FiniteFromString)

const JobClass = Schema.Struct({ class: Schema.String })

/**
 * A value of Sidekiq's `<pid>:work` hash: `{queue, payload, run_at}` where payload is the job (a
 * JSON string since Sidekiq 7, an object before).
 */
export const ProcessWork = Schema.fromJsonString(Schema.Struct({
  payload: Schema.Union([Schema.fromJsonString(JobClass), JobClass])
}))

/** The class of the job a Sidekiq thread is running, from its work hash value. */
export const runningJobClass = (workValue: string): Option.Option<string> =>
  Option.map(Schema.decodeUnknownOption(ProcessWork)(workValue), (work) => work.payload.class)

/** A worker's configured limit and queue (`SWEEPER_CONCURRENCY_LIMITS`). */
export interface ConcurrencyLimitSetting {
  readonly limit: number
  readonly queue: string
}

/** Limit and queue of a worker, with where the limit came from. */
export interface WorkerLimit {
  readonly limit: number
  readonly queue: string
  readonly source: "redis" | "config"
}

/**
 * A negative limit is GitLab's circuit breaker: the pass resumes nothing while it is open. (A worker
 * with no limit at all, configured or in Redis, is skipped too: its jobs wait for GitLab's own worker.)
 */
export const breakerOpen = (limit: number): boolean => limit < 0

/** Whether a pass resumes any of this worker's deferred jobs, capacity allowing: the backlog's rule too. */
export const resumesDeferred = (setting: Option.Option<WorkerLimit>): boolean =>
  Option.isSome(setting) && !breakerOpen(setting.value.limit)

/** A `current_limit` override value. */
export const parseLimitOverride = Schema.decodeUnknownOption(Schema.NumberFromString.check(Schema.isInt()))

/** A pending_resumed counter value (missing, garbage or negative → 0). */
export const parseCounter = (value: string | null): number =>
  value === null
    ? 0
    : Option.match(Schema.decodeUnknownOption(Schema.NumberFromString.check(Schema.isInt()))(value), {
      onNone: () => 0,
      onSome: (n) => Math.max(n, 0)
    })

/**
 * One pass per worker cluster-wide. Renewed before every pass (1 s apart, or back to back for
 * limit 0) and every TTL/3 in between, through a gate hold too, so a short TTL suffices.
 */
export const workerLeaseName = (worker: string) => `sweeper/concurrency_limit_resume/${underscore(worker)}`
export const WORKER_LEASE_TTL = Duration.seconds(15)
/**
 * Per-worker passes run concurrently, but no more than this many at once (hundreds of throttled
 * workers must not mean hundreds of Redis loops).
 */
export const MAX_CONCURRENT_WORKER_PASSES = 16

export interface WorkerResumeSummary {
  readonly worker: string
  /** The limit at the first pass. */
  readonly limit: number
  /** Deferred jobs at the first pass. */
  readonly queueSize: number
  /** Running plus resumed-not-started at the first pass (after stale trackers were removed). */
  readonly current: number
  /** Jobs resumed over all passes of this run. */
  readonly resumed: number
  /** The limit the first pass used: `limit`, unless the health gate throttled it. */
  readonly effectiveLimit: number
}

/** A worker whose pass hit a key of the wrong type: skipped, reported, never retried. */
export interface WorkerKeyFailure {
  readonly worker: string
  readonly key: string
  readonly error: string
}

/** What one pass over one worker found and did. */
export interface PassResult {
  readonly limit: number
  readonly effectiveLimit: number
  readonly queueSize: number
  readonly current: number
  readonly resumed: number
  /** Deferred jobs left after the pass. */
  readonly remaining: number
}

/**
 * After a pass: stop (the list is empty, or the breaker is open; a dry run makes one pass, the
 * repair loop's `passes` says so), the next pass at once (limit 0 while the last pass
 * made progress: nothing to wait for), or after RESCHEDULE_DELAY (a positive limit: capacity frees
 * as jobs finish, not with time; and a pass that moved nothing, so a contended list never turns
 * into a busy loop).
 */
export const nextPass = (last: PassResult): "stop" | "now" | "wait" =>
  last.remaining === 0 || breakerOpen(last.limit)
    ? "stop"
    : last.limit === 0 && (last.resumed > 0 || last.remaining < last.queueSize)
    ? "now"
    : "wait"

/** A worker's summary: the first pass's figures, the jobs resumed over all of them. */
export const workerSummary = (
  worker: string,
  results: readonly [PassResult, ...Array<PassResult>]
): WorkerResumeSummary => {
  const { limit, queueSize, current, effectiveLimit } = results[0]
  return {
    worker,
    limit,
    queueSize,
    current,
    resumed: results.reduce((sum, result) => sum + result.resumed, 0),
    effectiveLimit
  }
}

/**
 * A move's events: Resumed with the limit of the pass that writes it (null: a recovered move of a
 * worker with no limit now), Dead for the unparsable elements the move put on the dead list.
 */
export const moveEvents = (
  worker: string,
  limit: number | null,
  move: { readonly queue: string; readonly jids: ReadonlyArray<string>; readonly dead: number }
) => [
  ...(move.jids.length > 0
    ? [new ConcurrencyLimitJobsResumed({ worker, queue: move.queue, count: move.jids.length, limit, jids: move.jids })]
    : []),
  ...(move.dead > 0 ? [new ConcurrencyLimitJobsDead({ worker, count: move.dead })] : [])
]

/** Time a worker's passes were held by the health gate, summed into the run's summary. */
interface HeldTime {
  readonly heldMs: number
  readonly heldBy: ReadonlyArray<string>
}

/** How one worker's passes in a run ended. */
export type WorkerOutcome =
  /** Another process holds the worker's lease: it runs this worker's passes. */
  | { readonly _tag: "LeaseHeld"; readonly worker: string }
  /** The health gate held the first pass until the budget ended. */
  | { readonly _tag: "Held"; readonly worker: string; readonly held: HeldTime }
  /** No limit configured nor set in Redis, or a name from Redis that is no class name. */
  | { readonly _tag: "UnknownWorker"; readonly worker: string }
  /** The run's deadline came before the worker's first pass (it waited for a slot): the next tick. */
  | { readonly _tag: "NotReached"; readonly worker: string }
  | { readonly _tag: "Processed"; readonly summary: WorkerResumeSummary; readonly held: HeldTime }

/** A worker's outcome from its passes (none: unknown worker, or held before the first). */
export const workerOutcome = (
  worker: string,
  run: HeldTime & { readonly results: ReadonlyArray<PassResult>; readonly stop: string }
): WorkerOutcome => {
  const { results: [first, ...rest], stop, heldMs, heldBy } = run
  if (first === undefined) {
    return stop === "held"
      ? { _tag: "Held", worker, held: { heldMs, heldBy } }
      : stop === "budget"
      ? { _tag: "NotReached", worker }
      : { _tag: "UnknownWorker", worker }
  }
  return { _tag: "Processed", summary: workerSummary(worker, [first, ...rest]), held: { heldMs, heldBy } }
}

/** How many jobs a move (a recovered one, say) put on their queue; none when there was no move. */
export const jobsMoved = (move: Option.Option<{ readonly jids: ReadonlyArray<string> }>): number =>
  Option.match(move, { onNone: () => 0, onSome: ({ jids }) => jids.length })

/** The run's closing log line's fields. */
export const runLogFields = (summary: ResumeRunSummary, skipped: number) => ({
  workers: summary.workers.length,
  skipped,
  failed_workers: summary.failedWorkers.length,
  resumed_jobs: summary.resumedJobs
})

/**
 * The run's summary, short of the held time: the workers processed, the jobs resumed, the workers
 * skipped for a wrong-type key.
 */
export interface ResumeRunSummary {
  readonly workers: ReadonlyArray<WorkerResumeSummary>
  readonly resumedJobs: number
  /** Workers skipped because one of their keys holds the wrong type (the others ran normally). */
  readonly failedWorkers: ReadonlyArray<WorkerKeyFailure>
}

/** The batch's summary: the run's, plus the time the health gate held its passes and the signals that held them. */
export interface ConcurrencyLimitResumeSummary extends ResumeRunSummary, HeldTime {}

/** The run's totals from every worker's outcome; `skipped` are the workers neither processed nor failed. */
export const runTotals = (
  workers: number,
  outcomes: ReadonlyArray<WorkerOutcome>,
  failed: ReadonlyArray<{ readonly of: string; readonly key: string; readonly error: string }>
) => {
  const summaries = outcomes.flatMap((outcome) => outcome._tag === "Processed" ? [outcome.summary] : [])
  const failedWorkers = failed.map(({ of, key, error }) => ({ worker: of, key, error }))
  const summary: ResumeRunSummary = {
    workers: summaries,
    resumedJobs: summaries.reduce((sum, worker) => sum + worker.resumed, 0),
    failedWorkers
  }
  return {
    summary,
    skipped: workers - summaries.length - failedWorkers.length,
    held: outcomes.flatMap((outcome) => "held" in outcome ? [outcome.held] : [])
  }
}

// ---------------------------------------------------------------------------------------------
// Shadow mode (docs/from-gitlab-workers.md): what a proposal is, and its verdict

/** A dry run's view of the deferred head it would move: digests of exact element bytes. */
export interface DeferredPreview {
  /** The first and the last element the move would take. */
  readonly first: string
  readonly last: string
  /** The element right after them (the first the move would leave); null when the move empties the list. */
  readonly next: string | null
}

/** A worker's deferred list now, as far as its proposal needs it. */
export interface DeferredReading {
  /** Digests of the list's first elements (the proposal's count and one more, at most). */
  readonly head: ReadonlyArray<string>
  /** LLEN now. */
  readonly length: number
  /** The worker's limit now (the Redis override, else configuration); null when it has none. */
  readonly limit: number | null
}

/** ConcurrencyLimit::ResumeWorker's BATCH_SIZE: what one of its passes moves for an unlimited worker. */
export const GITLAB_RESUME_BATCH = 1000
/** ResumeWorker reschedules a worker's pass this much later while jobs remain. */
export const GITLAB_RESUME_RESCHEDULE = Duration.seconds(1)

/** One worker's proposal: the jobs a pass would move (how many, and which: the head's digests). */
export const resumeProposal = (
  read: { readonly limit: number; readonly current: number; readonly queueSize: number },
  queue: string,
  jids: ReadonlyArray<string>,
  dead: ReadonlyArray<unknown>,
  preview: DeferredPreview
): ShadowProposal => ({
  rule: read.limit === 0 ? "unlimited" : "free capacity",
  outcome: { resumed: jids.length, dead: dead.length, queue },
  facts: {
    limit: read.limit,
    current: read.current,
    queue_size: read.queueSize,
    taken: jids.length + dead.length,
    ...preview
  }
})

/**
 * The same way: every job Sweeper would move has left the head, FIFO (GitLab's passes resumed them;
 * further ones after them too, as Sweeper's next passes would). Another way: only some of them left
 * (GitLab resumed a different number). Still at the head once GitLab's window is over: sweeperOnly.
 * Ignored: the limit changed (override set or cleared, breaker opened), jobs were put back ahead of
 * them, or more left the list than ResumeWorker can move in the time since (a pass at most every
 * second, `limit` jobs each, 1000 when unlimited): cleared by something else.
 */
export const resumeVerdict = (
  candidate: Pick<ShadowCandidate, "facts" | "dueAt" | "proposedAt">,
  now: Date,
  reading: DeferredReading
): Verdict | Pending => {
  const facts = candidate.facts
  const limit = Number(facts.limit)
  if (reading.limit !== limit) return "ignored"
  const at = (digest: unknown) => typeof digest === "string" ? reading.head.indexOf(digest) : -1
  const first = at(facts.first)
  if (first === 0) return now.getTime() < candidate.dueAt.getTime() ? "waiting" : "sweeperOnly"
  if (first > 0) return "ignored"
  if (at(facts.last) >= 0) return "mismatched"
  const gone = Number(facts.queue_size) - reading.length
  const passes = Math.floor(
    (now.getTime() - candidate.proposedAt.getTime()) / Duration.toMillis(GITLAB_RESUME_RESCHEDULE)
  ) + 1
  return gone > (limit > 0 ? limit : GITLAB_RESUME_BATCH) * passes ? "ignored" : "matched"
}

const ResumedJob = Schema.Struct({ class: Schema.String, concurrency_limit_resume: Schema.Literal(true) })
const decodeResumed = Schema.decodeUnknownOption(Schema.fromJsonString(ResumedJob))

/** The worker of a job in a Sidekiq queue that a concurrency-limit resume pushed; None for any other job. */
export const resumedJobWorker = (raw: Uint8Array): Option.Option<string> =>
  Option.map(Option.flatMap(decodeUtf8(raw), decodeResumed), (job) => job.class)
