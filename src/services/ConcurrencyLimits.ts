/**
 * GitLab's Sidekiq concurrency limit state (SPEC §5): which workers have deferred jobs, their limits,
 * how many of their jobs run now, and the move that resumes deferred jobs into their Sidekiq queue.
 *
 * The backends differ only in the Redis primitives underneath (`ConcurrencyLimitStore`: commands,
 * plus two compare-and-act steps that are Lua scripts on Redis and one synchronous step in memory).
 * Everything else — decoding what GitLab wrote, building the Sidekiq jobs, the stale-tracker rules —
 * is `makeConcurrencyLimits`, shared, so both backends read the same keys and write the same bytes.
 */
import { Clock, Context, Duration, Effect, Option, Random } from "effect"
import {
  camelize,
  DEFERRED_KEY_PATTERN,
  parseCounter,
  parseDeferred,
  parseLimitOverride,
  parseTrackerField,
  parseTrackerStart,
  PENDING_RESUMED_TTL,
  processWorkKey,
  resumedJob,
  runningJobClass,
  SCAN_COUNT,
  STALE_TRACKER_AGE,
  underscore,
  workerKeyFormOf,
  type WorkerKeys,
  workerKeys,
  type WorkerLimit
} from "../domain/ConcurrencyLimit.ts"
import type { RedisError } from "../domain/Errors.ts"

export interface ConcurrencyLimitSetting {
  readonly limit: number
  readonly queue: string
}

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
  /** Unparsable elements moved to the dead list, as they were. */
  readonly dead: ReadonlyArray<string>
}

export class ConcurrencyLimits extends Context.Service<ConcurrencyLimits, {
  /** Configured workers plus those whose deferred list SCAN finds, keeping those with jobs deferred. */
  readonly workersWithDeferredJobs: Effect.Effect<ReadonlyArray<string>, RedisError>
  /** The Redis `current_limit` override, else the configured limit; None for an unknown worker. */
  limitOf(worker: string): Effect.Effect<Option.Option<WorkerLimit>, RedisError>
  /** LLEN of the deferred list. */
  queueSize(worker: string): Effect.Effect<number, RedisError>
  /** HLEN(executing) + pending_resumed. */
  currentConcurrency(worker: string): Effect.Effect<number, RedisError>
  /**
   * Removes executing trackers older than STALE_TRACKER_AGE whose Sidekiq thread (`<pid>:work`)
   * runs no job of this worker, or whose field is malformed. Returns how many were removed.
   */
  cleanupStaleTrackers(worker: string): Effect.Effect<number, RedisError>
  /**
   * Moves up to `max` jobs from the head of the deferred list to the worker's Sidekiq queue in one
   * atomic step (FIFO; jobs appended meanwhile stay), unparsable elements to the dead list.
   */
  resume(request: ResumeRequest): Effect.Effect<ResumeResult, RedisError>
}>()("sweeper/services/ConcurrencyLimits") {}

/** One atomic move, prepared from the list head as it was read. */
export interface PreparedMove {
  readonly keys: WorkerKeys
  readonly queue: string
  /** The head of the deferred list as read; the move happens only if it is still exactly this. */
  readonly expected: ReadonlyArray<string>
  /** One per expected element: the Sidekiq job to LPUSH, or null to RPUSH the element to the dead list. */
  readonly payloads: ReadonlyArray<string | null>
  readonly pendingResumedTtlSeconds: number
}

/** The Redis primitives the service is built from. */
export interface ConcurrencyLimitStore {
  /** SCAN cursor MATCH pattern COUNT count → [next cursor, keys]. */
  scan(cursor: string, match: string, count: number): Effect.Effect<readonly [string, ReadonlyArray<string>], RedisError>
  get(key: string): Effect.Effect<string | null, RedisError>
  llen(key: string): Effect.Effect<number, RedisError>
  lrange(key: string, start: number, stop: number): Effect.Effect<ReadonlyArray<string>, RedisError>
  hlen(key: string): Effect.Effect<number, RedisError>
  hscan(key: string, cursor: string, count: number): Effect.Effect<readonly [string, ReadonlyArray<readonly [string, string]>], RedisError>
  hget(key: string, field: string): Effect.Effect<string | null, RedisError>
  /** HDEL the field only while it still holds `value` (a slot re-used by a new job meanwhile stays). */
  hdelIfEquals(key: string, field: string, value: string): Effect.Effect<boolean, RedisError>
  /**
   * Atomically: if the deferred list still starts with `expected`, pop those elements, LPUSH the jobs
   * to `queue:<queue>` one by one in list order (Sidekiq BRPOPs from the right, so the first buffered
   * runs first), RPUSH the unparsable ones to the dead list, SADD `queues`, INCRBY pending_resumed
   * and reset its TTL. False (nothing written) when the head changed.
   */
  move(move: PreparedMove): Effect.Effect<boolean, RedisError>
}

/** Another mover changed the list head between our read and our move: re-read this often. */
const MOVE_ATTEMPTS = 3
/** However many dead elements lie at the head, one pass reads at most this many beyond `max`. */
const MAX_DEAD_PER_PASS = 1000

/** 24 lowercase hex characters from effect's Random (seedable in tests, like every other input). */
const nextJid: Effect.Effect<string> = Effect.gen(function*() {
  let jid = ""
  for (let i = 0; i < 6; i++) jid += Math.floor((yield* Random.next) * 0x10000).toString(16).padStart(4, "0")
  return jid
})

export const makeConcurrencyLimits = (
  store: ConcurrencyLimitStore,
  configured: Readonly<Record<string, ConcurrencyLimitSetting>>
): ConcurrencyLimits["Service"] => {
  /** A key form found by SCAN back to a worker name: the configured worker it belongs to, else camelize. */
  const byKeyForm = new Map(Object.keys(configured).map((worker) => [underscore(worker), worker]))

  const workersWithDeferredJobs = Effect.gen(function*() {
    const candidates = new Set(Object.keys(configured))
    const discovered: Array<string> = []
    let cursor = "0"
    do {
      const [next, keys] = yield* store.scan(cursor, DEFERRED_KEY_PATTERN, SCAN_COUNT)
      cursor = next
      for (const key of keys) {
        const w = workerKeyFormOf(key)
        if (Option.isSome(w)) discovered.push(byKeyForm.get(w.value) ?? camelize(w.value))
      }
    } while (cursor !== "0")
    for (const worker of discovered.sort()) candidates.add(worker)
    const found: Array<string> = []
    for (const worker of candidates) {
      if ((yield* store.llen(workerKeys(worker).deferred)) > 0) found.push(worker)
    }
    return found
  }).pipe(Effect.withSpan("ConcurrencyLimits.workersWithDeferredJobs"))

  const limitOf = Effect.fn("ConcurrencyLimits.limitOf")(function*(worker: string) {
    const setting = configured[worker]
    const raw = yield* store.get(workerKeys(worker).currentLimit)
    const override = raw === null ? Option.none() : parseLimitOverride(raw)
    if (raw !== null && Option.isNone(override)) {
      yield* Effect.logWarning("Ignoring unparsable concurrency limit override").pipe(
        Effect.annotateLogs({ worker, key: workerKeys(worker).currentLimit, value: raw.slice(0, 100) })
      )
    }
    if (Option.isSome(override)) {
      return Option.some<WorkerLimit>({ limit: override.value, queue: setting?.queue ?? "default", source: "redis" })
    }
    return setting === undefined
      ? Option.none<WorkerLimit>()
      : Option.some<WorkerLimit>({ limit: setting.limit, queue: setting.queue, source: "config" })
  })

  const queueSize = (worker: string) => store.llen(workerKeys(worker).deferred)

  const currentConcurrency = Effect.fn("ConcurrencyLimits.currentConcurrency")(function*(worker: string) {
    const keys = workerKeys(worker)
    const executing = yield* store.hlen(keys.executing)
    return executing + parseCounter(yield* store.get(keys.pendingResumed))
  })

  /** Stale ⇔ older than STALE_TRACKER_AGE (strictly; an unreadable start counts as old) and not backed by a running job. */
  const isStale = Effect.fnUntraced(function*(worker: string, field: string, value: string, cutoffSeconds: number) {
    const started = parseTrackerStart(value)
    if (Option.isSome(started) && started.value >= cutoffSeconds) return false
    const owner = parseTrackerField(field)
    if (Option.isNone(owner)) return true
    const work = yield* store.hget(processWorkKey(owner.value.pid), owner.value.tid)
    if (work === null) return true
    return Option.getOrUndefined(runningJobClass(work)) !== worker
  })

  const cleanupStaleTrackers = Effect.fn("ConcurrencyLimits.cleanupStaleTrackers")(function*(worker: string) {
    const key = workerKeys(worker).executing
    const cutoffSeconds = (yield* Clock.currentTimeMillis) / 1000 - Duration.toSeconds(STALE_TRACKER_AGE)
    let removed = 0
    let cursor = "0"
    do {
      const [next, entries] = yield* store.hscan(key, cursor, SCAN_COUNT)
      cursor = next
      for (const [field, value] of entries) {
        if (!(yield* isStale(worker, field, value, cutoffSeconds))) continue
        if (yield* store.hdelIfEquals(key, field, value)) removed++
      }
    } while (cursor !== "0")
    if (removed > 0) {
      yield* Effect.logInfo("Removed stale concurrency trackers").pipe(Effect.annotateLogs({ worker, removed }))
    }
    return removed
  })

  /** The list head holding up to `max` parseable elements (plus the unparsable ones among them). */
  const readHead = Effect.fnUntraced(function*(key: string, max: number) {
    const elements: Array<string> = []
    let parseable = 0
    while (parseable < max && elements.length < max + MAX_DEAD_PER_PASS) {
      const want = Math.min(max - parseable, max + MAX_DEAD_PER_PASS - elements.length)
      const page = yield* store.lrange(key, elements.length, elements.length + want - 1)
      for (const element of page) {
        elements.push(element)
        if (Option.isSome(parseDeferred(element))) parseable++
      }
      if (page.length < want) break
    }
    return elements
  })

  const resume = Effect.fn("ConcurrencyLimits.resume")(function*(request: ResumeRequest) {
    const { worker, queue, max, dryRun } = request
    const keys = workerKeys(worker)
    if (max <= 0) return { jids: [], dead: [] } satisfies ResumeResult
    for (let attempt = 1; attempt <= MOVE_ATTEMPTS; attempt++) {
      const expected = yield* readHead(keys.deferred, max)
      if (expected.length === 0) return { jids: [], dead: [] } satisfies ResumeResult
      const nowMillis = yield* Clock.currentTimeMillis
      const jids: Array<string> = []
      const dead: Array<string> = []
      const payloads: Array<string | null> = []
      for (const element of expected) {
        const deferred = parseDeferred(element)
        if (Option.isNone(deferred)) {
          dead.push(element)
          payloads.push(null)
          continue
        }
        const jid = yield* nextJid
        jids.push(jid)
        payloads.push(JSON.stringify(resumedJob({ worker, queue, deferred: deferred.value, jid, nowMillis })))
      }
      if (dryRun) return { jids, dead } satisfies ResumeResult
      const moved = yield* store.move({
        keys,
        queue,
        expected,
        payloads,
        pendingResumedTtlSeconds: Duration.toSeconds(PENDING_RESUMED_TTL)
      })
      if (moved) return { jids, dead } satisfies ResumeResult
      yield* Effect.logInfo("Deferred list changed under the move; re-reading").pipe(Effect.annotateLogs({ worker, attempt }))
    }
    yield* Effect.logWarning("Deferred list kept changing under the move; leaving it for the next pass").pipe(
      Effect.annotateLogs({ worker, attempts: MOVE_ATTEMPTS })
    )
    return { jids: [], dead: [] } satisfies ResumeResult
  })

  return ConcurrencyLimits.of({
    workersWithDeferredJobs,
    limitOf,
    queueSize,
    currentConcurrency,
    cleanupStaleTrackers,
    resume
  })
}
