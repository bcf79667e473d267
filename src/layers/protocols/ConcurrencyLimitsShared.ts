/**
 * ConcurrencyLimits, shared by both backends (ConcurrencyLimitsRedis, memory/ConcurrencyLimitsMemory).
 *
 * The backends differ only in the Redis primitives underneath (`ConcurrencyLimitStore`: commands,
 * plus compare-and-act steps that are Lua scripts on Redis — each within one GitLab store and one
 * cluster slot — and one synchronous step each in memory). Everything else — decoding what GitLab
 * wrote (as bytes), building the Sidekiq jobs, the stale-tracker rules, the order of the move's
 * steps and their recovery (docs/architecture.md, "Resume across stores") — is `makeConcurrencyLimits`, here, so
 * both backends read the same keys and write the same bytes.
 */
import * as Arr from "effect/Array"
import * as Clock from "effect/Clock"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Option from "effect/Option"
import * as Random from "effect/Random"
import * as Schema from "effect/Schema"
import type { SqlError } from "effect/sql/SqlError"
import { createHash } from "node:crypto"
import { decodeUtf8 } from "../../domain/Bytes.ts"
import {
  camelize,
  type ConcurrencyLimitSetting,
  DEAD_LIST_TTL,
  DEFERRED_KEY_PATTERN,
  type DeferredJob,
  encodeJournalHeader,
  isWorkerClassName,
  JOURNAL_KEY_PATTERN,
  journalKeyFormOf,
  MAX_RESUME_UNLIMITED,
  MOVE_JOURNAL_TTL,
  moveEvents,
  parseCounter,
  parseDeferred,
  parseJournalHeader,
  parseLimitOverride,
  parseTrackerField,
  parseTrackerStart,
  PENDING_RESUMED_TTL,
  processWorkKey,
  resumeBatchMarkerKey,
  resumedJob,
  runningJobClass,
  SCAN_COUNT,
  STALE_TRACKER_AGE,
  underscore,
  workerKeyFormOf,
  type WorkerKeys,
  workerKeys,
  type WorkerLimit
} from "../../domain/ConcurrencyLimit.ts"
import { isWrongType, type RedisError, refineWrongType, type WrongTypeKey } from "../../domain/Errors.ts"
import { jidFrom, queueKey, QUEUES_SET } from "../../domain/Sidekiq.ts"
import {
  ConcurrencyLimits,
  type KnownDeferredWorkers,
  type MovedJobs,
  type RecordMove,
  type RecoveredMove,
  type ResumeRequest,
  type ResumeResult,
  type SweepStep
} from "../../services/ConcurrencyLimits.ts"
import { EventLog } from "../../services/EventLog.ts"

const recordNothing: RecordMove<never, never> = () => Effect.void

/** Step 1, prepared from the list head as it was read. */
export interface BeginMove {
  readonly keys: WorkerKeys
  /** The head of the deferred list as read (raw bytes); the move happens only if it is still exactly this. */
  readonly expected: ReadonlyArray<Uint8Array>
  /** One per expected element: the Sidekiq job, or null to RPUSH the element to the dead list. */
  readonly payloads: ReadonlyArray<string | null>
  /** The journal's first element (batch id, queue, worker). */
  readonly header: string
  readonly journalTtlSeconds: number
  /** Refreshed on the dead list when elements are added to it. */
  readonly deadTtlSeconds: number
}

/** How step 1 went. */
export type BeginOutcome =
  /** The head was taken: the dead elements are in the dead list, the jobs in the journal. */
  | "moved"
  /** The head is no longer what we read: nothing written. */
  | "changed"
  /** A journal exists (a move to finish first): nothing written. */
  | "busy"

/**
 * The Redis primitives the service is built from, grouped by the GitLab store their keys live in,
 * since on a cluster or split deployment each store is its own server. Every compare-and-act step touches one store
 * and one cluster slot; nothing relies on
 * atomicity across steps (docs/architecture.md, "Resume across stores").
 */
export interface ConcurrencyLimitStore {
  // --- SharedState: deferred lists, dead lists, move journals (all keys of a worker in its {w} slot)
  /** SCAN cursor MATCH pattern COUNT count → [next cursor, keys]. */
  scan(
    cursor: string,
    match: string,
    count: number
  ): Effect.Effect<readonly [string, ReadonlyArray<string>], RedisError>
  llen(key: string): Effect.Effect<number, RedisError>
  /** LRANGE as raw bytes: elements are compared and moved byte for byte, never via a decoded copy. */
  lrange(key: string, start: number, stop: number): Effect.Effect<ReadonlyArray<Uint8Array>, RedisError>
  /**
   * Step 1, atomic: if no journal exists and the deferred list still starts with `expected`, pop
   * those elements, RPUSH the unparsable ones to the dead list, and write the journal (header, then
   * the jobs) with its TTL — also when there are no jobs, so the dead elements' record survives a
   * crash too.
   */
  beginMove(move: BeginMove): Effect.Effect<BeginOutcome, RedisError>
  /** Last step, atomic: delete the journal only while its header is still `header` (our batch). */
  endMove(journalKey: string, header: Uint8Array): Effect.Effect<boolean, RedisError>
  /** A journal whose header is unreadable: its elements to the dead list, byte for byte, then delete it (atomic). */
  buryJournal(
    journalKey: string,
    deadKey: string,
    header: Uint8Array,
    deadTtlSeconds: number
  ): Effect.Effect<boolean, RedisError>

  // --- QueuesMetadata: limit override, executing trackers, reserved slots
  get(key: string): Effect.Effect<string | null, RedisError>
  hlen(key: string): Effect.Effect<number, RedisError>
  /** HSCAN as raw bytes: a tracker is removed by its exact field and value, never via a decoded copy. */
  hscan(
    key: string,
    cursor: string,
    count: number
  ): Effect.Effect<readonly [string, ReadonlyArray<readonly [Uint8Array, Uint8Array]>], RedisError>
  /**
   * HDEL the field (exact bytes) only while it still holds `value` (exact bytes): a slot re-used by
   * a new job meanwhile stays.
   */
  hdelIfEquals(key: string, field: Uint8Array, value: Uint8Array): Effect.Effect<boolean, RedisError>
  /** Step 2: INCRBY pending_resumed and reset its TTL (one key, atomic). */
  reserve(key: string, count: number, ttlSeconds: number): Effect.Effect<void, RedisError>

  // --- Queues: Sidekiq's queues and process work hashes
  /**
   * HGET `<pid>:work` `<tid>`: what a Sidekiq thread runs now. Decoded like ioredis does (a byte
   * that is not UTF-8 becomes U+FFFD): only the job's class is read from it, and a stray byte
   * elsewhere in the job must not make a running job look absent.
   */
  processWork(pid: string, tid: string): Effect.Effect<string | null, RedisError>
  /** Step 3: SADD queues <queue> (idempotent). */
  registerQueue(queue: string): Effect.Effect<void, RedisError>
  /**
   * Step 4, atomic in the queue's slot: SET `marker` NX with its TTL and, only if it was not set,
   * LPUSH the jobs to `queue:<queue>` in list order. False when the marker existed: this batch was
   * pushed before, pushing again would duplicate it.
   */
  push(
    queue: string,
    marker: string,
    payloads: ReadonlyArray<string>,
    ttlSeconds: number
  ): Effect.Effect<boolean, RedisError>
  /** Step 6: DEL the marker of a batch whose journal is gone. */
  forgetMarker(marker: string): Effect.Effect<void, RedisError>
}

/** Another mover changed the list head between our read and our move: re-read this often. */
const MOVE_ATTEMPTS = 3
/** However many dead elements lie at the head, one pass reads at most this many beyond `max`. */
const MAX_DEAD_PER_PASS = 1000

/**
 * A head read ahead is used only this soon after its jobs were built: they carry that time as their
 * enqueue time, so a head kept longer (a gate hold, a slow pass) is read and built again.
 */
const AHEAD_MAX_AGE_MILLIS = 1000

/** The head a move is made of: the elements as read, and what each becomes. */
interface PreparedHead {
  /** The head as read (raw bytes); the move happens only if the list still starts with exactly this. */
  readonly expected: ReadonlyArray<Uint8Array>
  /** One per element: the Sidekiq job, or null for an unparsable element (to the dead list). */
  readonly payloads: ReadonlyArray<string | null>
  readonly jids: ReadonlyArray<string>
  readonly dead: ReadonlyArray<Uint8Array>
  /** When the jobs were built (their enqueue time). */
  readonly builtAt: number
}

/**
 * The next head of a worker's list, read and built while the previous move ran. Its fiber holds the
 * head until the next move takes it, and ends, dropping it, with the fiber of the passes that forked
 * it: no head outlives the passes that could use it.
 */
interface Ahead {
  readonly queue: string
  readonly max: number
  readonly head: Deferred.Deferred<PreparedHead, RedisError | WrongTypeKey>
  readonly fiber: Fiber.Fiber<never, never>
}

/** A deferred element's identity for shadow mode: SHA-256 of its exact bytes, 16 hex digits. */
export const deferredDigest = (element: Uint8Array): string =>
  createHash("sha256").update(element).digest("hex").slice(0, 16)

export const makeConcurrencyLimits = (
  store: ConcurrencyLimitStore,
  configured: Readonly<Record<string, ConcurrencyLimitSetting>>
): ConcurrencyLimits["Service"] => {
  /** A key form found by SCAN back to a worker name: the configured worker it belongs to, else camelize. */
  const byKeyForm = new Map(Object.keys(configured).map((worker) => [underscore(worker), worker]))
  const workerOfKeyForm = (w: string) => byKeyForm.get(w) ?? camelize(w)
  /**
   * A key form camelizes into whatever a writer of Redis chose (`kernel.exec` → `Kernel.exec`), and
   * a pushed job's `class` is what Sidekiq constantizes: a discovered name gets the class-name check
   * a configured worker gets, and one that fails it is never a worker here — no limit, no recovered
   * move, nothing pushed.
   */
  const warnNotAClass = (worker: string, key: string) =>
    Effect.logWarning("Skipped a worker found in Redis whose name is not a class name").pipe(
      Effect.annotateLogs({ worker, key })
    )
  /** A command on `key`, its WRONGTYPE failure named after the key (permanent, isolated by the caller). */
  const onKey = <A>(key: string, effect: Effect.Effect<A, RedisError>) => Effect.mapError(effect, refineWrongType(key))

  const scanKeyForms = Effect.fnUntraced(function*(pattern: string, keyFormOf: (key: string) => Option.Option<string>) {
    const found: Array<string> = []
    let cursor = "0"
    do {
      const [next, keys] = yield* store.scan(cursor, pattern, SCAN_COUNT)
      cursor = next
      for (const key of keys) {
        const worker = Option.map(keyFormOf(key), workerOfKeyForm)
        if (Option.isNone(worker)) continue
        if (isWorkerClassName(worker.value)) found.push(worker.value)
        else yield* warnNotAClass(worker.value, key)
      }
    } while (cursor !== "0")
    return found
  })

  /**
   * The incremental discovery's state, for this service's life: the last complete worker set (and
   * when), and the sweep under way — its cursor, what it found, when it last advanced.
   */
  let known: { readonly workers: ReadonlySet<string>; readonly at: number } | null = null
  let sweep = { cursor: "0", found: new Set<string>(), keys: 0, startedAt: 0, steppedAt: Number.NEGATIVE_INFINITY }
  // The backlog's sweep leaves them out quietly: the run's discovery warns about each.
  const workerOfKey = (key: string) =>
    Option.filter(Option.map(workerKeyFormOf(key), workerOfKeyForm), isWorkerClassName)

  const knownDeferredWorkers = Effect.fn("ConcurrencyLimits.knownDeferredWorkers")(function*(step: SweepStep) {
    const now = yield* Clock.currentTimeMillis
    if (now - sweep.steppedAt >= Duration.toMillis(step.every)) {
      sweep.steppedAt = now
      if (sweep.cursor === "0") sweep.startedAt = now
      for (let call = 0; call < step.calls; call++) {
        const [next, keys] = yield* store.scan(sweep.cursor, DEFERRED_KEY_PATTERN, step.count)
        for (const key of keys) Option.map(workerOfKey(key), (worker) => sweep.found.add(worker))
        sweep.keys += step.count
        sweep.cursor = next
        if (next === "0") {
          // As of its start: a worker that began deferring behind the cursor waits for the next sweep.
          known = { workers: sweep.found, at: sweep.startedAt }
          sweep = { cursor: "0", found: new Set(), keys: 0, startedAt: now, steppedAt: now }
          break
        }
      }
    }
    const workers = new Set([...Object.keys(configured), ...(known?.workers ?? []), ...sweep.found])
    return {
      workers: [...workers].sort(),
      completeAt: known === null ? null : new Date(known.at),
      sweptKeys: sweep.keys
    } satisfies KnownDeferredWorkers
  })

  const deferredDigests = (worker: string, count: number) => {
    const key = workerKeys(worker).deferred
    return count <= 0
      ? Effect.succeed([])
      : Effect.map(onKey(key, store.lrange(key, 0, count - 1)), (elements) => elements.map(deferredDigest))
  }

  const oldestDeferred = (worker: string) => {
    const key = workerKeys(worker).deferred
    return Effect.map(onKey(key, store.lrange(key, 0, 0)), (head) => Option.flatMap(Arr.head(head), parseDeferred))
  }

  const workersWithDeferredJobs = Effect.gen(function*() {
    const startedAt = yield* Clock.currentTimeMillis
    const candidates = new Set(Object.keys(configured))
    const discovered = yield* scanKeyForms(DEFERRED_KEY_PATTERN, workerKeyFormOf)
    // A journal is left only by a mover that died; its worker may have nothing deferred any more.
    const journaled = yield* scanKeyForms(JOURNAL_KEY_PATTERN, journalKeyFormOf)
    for (const worker of discovered.sort()) candidates.add(worker)
    const found: Array<string> = []
    for (const worker of candidates) {
      if (journaled.includes(worker)) {
        found.push(worker)
        continue
      }
      const size = yield* store.llen(workerKeys(worker).deferred).pipe(
        // A deferred key of the wrong type: keep the worker, so its own pass reports the key (and
        // only that worker is affected), rather than failing discovery for every worker.
        Effect.catchIf(isWrongType, () => Effect.succeed(1))
      )
      if (size > 0) found.push(worker)
    }
    for (const worker of journaled) if (!found.includes(worker)) found.push(worker)
    // The run's whole scan is a complete discovery: the backlog's sweep need not repeat it.
    known = { workers: new Set(discovered), at: startedAt }
    return found
  }).pipe(Effect.withSpan("ConcurrencyLimits.workersWithDeferredJobs"))

  const limitOf = Effect.fn("ConcurrencyLimits.limitOf")(function*(worker: string) {
    if (!isWorkerClassName(worker)) return Option.none<WorkerLimit>()
    const setting = configured[worker]
    const key = workerKeys(worker).currentLimit
    const raw = yield* onKey(key, store.get(key))
    const override = raw === null ? Option.none() : parseLimitOverride(raw)
    if (raw !== null && Option.isNone(override)) {
      yield* Effect.logWarning("Ignoring unparsable concurrency limit override").pipe(
        Effect.annotateLogs({ worker, key, value: raw.slice(0, 100) })
      )
    }
    if (Option.isSome(override)) {
      return Option.some<WorkerLimit>({ limit: override.value, queue: setting?.queue ?? "default", source: "redis" })
    }
    return setting === undefined
      ? Option.none<WorkerLimit>()
      : Option.some<WorkerLimit>({ limit: setting.limit, queue: setting.queue, source: "config" })
  })

  const queueSize = (worker: string) => {
    const key = workerKeys(worker).deferred
    return onKey(key, store.llen(key))
  }

  const currentConcurrency = Effect.fn("ConcurrencyLimits.currentConcurrency")(function*(worker: string) {
    const keys = workerKeys(worker)
    const executing = yield* onKey(keys.executing, store.hlen(keys.executing))
    return executing + parseCounter(yield* onKey(keys.pendingResumed, store.get(keys.pendingResumed)))
  })

  /**
   * Stale ⇔ older than STALE_TRACKER_AGE (strictly; an unreadable start counts as old) and not
   * backed by a running job. Field and value are decoded strictly: bytes that are not UTF-8 are an
   * unreadable start, or a malformed field (no Sidekiq thread to ask), never a lossy look-alike.
   */
  const isStale = Effect.fnUntraced(
    function*(worker: string, field: Uint8Array, value: Uint8Array, cutoffSeconds: number) {
      const started = Option.flatMap(decodeUtf8(value), parseTrackerStart)
      if (Option.isSome(started) && started.value >= cutoffSeconds) return false
      const owner = Option.flatMap(decodeUtf8(field), parseTrackerField)
      if (Option.isNone(owner)) return true
      const work = yield* onKey(processWorkKey(owner.value.pid), store.processWork(owner.value.pid, owner.value.tid))
      if (work === null) return true
      return Option.getOrUndefined(runningJobClass(work)) !== worker
    }
  )

  const cleanupStaleTrackers = Effect.fn("ConcurrencyLimits.cleanupStaleTrackers")(function*(worker: string) {
    const key = workerKeys(worker).executing
    const cutoffSeconds = (yield* Clock.currentTimeMillis) / 1000 - Duration.toSeconds(STALE_TRACKER_AGE)
    let removed = 0
    let cursor = "0"
    do {
      const [next, entries] = yield* onKey(key, store.hscan(key, cursor, SCAN_COUNT))
      cursor = next
      for (const [field, value] of entries) {
        if (!(yield* isStale(worker, field, value, cutoffSeconds))) continue
        if (yield* onKey(key, store.hdelIfEquals(key, field, value))) removed++
      }
    } while (cursor !== "0")
    if (removed > 0) {
      yield* Effect.logInfo("Removed stale concurrency trackers").pipe(Effect.annotateLogs({ worker, removed }))
    }
    return removed
  })

  /**
   * Steps 2–5 (and 6 for our own batch) of the protocol, shared by a fresh move and a recovery: each
   * is idempotent or safe to repeat, so whichever step a crash interrupted, running them all again
   * ends in the same state — the jobs once in their queue, the journal gone. The move is recorded
   * between the push and the END: while the journal exists the record can be repeated (by a
   * recovery), once it is gone the record has been made.
   */
  const finishMove = <E, R>(
    keys: WorkerKeys,
    header: Uint8Array,
    batch: string,
    move: MovedJobs,
    payloads: ReadonlyArray<string>,
    forget: boolean,
    record: RecordMove<E, R>
  ) =>
    Effect.gen(function*() {
      const { queue } = move
      const ttl = Duration.toSeconds(MOVE_JOURNAL_TTL)
      const marker = resumeBatchMarkerKey(queueKey(queue), batch)
      // A move of unparsable elements only has nothing to push: its journal is there for the record.
      if (payloads.length > 0) {
        // Slots first: a crash after this over-counts (fewer resumes for at most the 60 s TTL), never
        // under-counts (which could let the limit be exceeded). A replay adds them again: same bias.
        yield* onKey(
          keys.pendingResumed,
          store.reserve(keys.pendingResumed, payloads.length, Duration.toSeconds(PENDING_RESUMED_TTL))
        )
        yield* onKey(QUEUES_SET, store.registerQueue(queue))
        yield* onKey(queueKey(queue), store.push(queue, marker, payloads, ttl))
      }
      yield* record(move)
      yield* onKey(keys.journal, store.endMove(keys.journal, header))
      // A recovery keeps the marker (until its TTL): the process it recovers for may only be frozen,
      // not dead, and must find "already pushed" if it wakes up and pushes.
      if (forget && payloads.length > 0) yield* onKey(marker, store.forgetMarker(marker))
    })

  const jidOf = (payload: string): string => {
    const parsed = Schema.decodeUnknownOption(Schema.fromJsonString(Schema.Struct({ jid: Schema.String })))(payload)
    return Option.match(parsed, { onNone: () => "", onSome: (job) => job.jid })
  }

  const recoverMove = <E = never, R = never>(worker: string, record: RecordMove<E, R> = recordNothing) =>
    Effect.gen(function*() {
      if (!isWorkerClassName(worker)) return Option.none<RecoveredMove>()
      const keys = workerKeys(worker)
      const journal = yield* onKey(keys.journal, store.lrange(keys.journal, 0, -1))
      if (journal.length === 0) return Option.none<RecoveredMove>()
      const header = parseJournalHeader(journal[0]!)
      const payloads = journal.slice(1).map(decodeUtf8)
      if (Option.isNone(header) || payloads.some(Option.isNone)) {
        // Not a journal this code wrote (or damaged): keep every element, byte for byte, for a human.
        yield* onKey(
          keys.journal,
          store.buryJournal(keys.journal, keys.dead, journal[0]!, Duration.toSeconds(DEAD_LIST_TTL))
        )
        yield* Effect.logError("Unreadable concurrency limit move journal moved to the dead list").pipe(
          Effect.annotateLogs({ worker, journal: keys.journal, dead_list: keys.dead, elements: journal.length })
        )
        return Option.none<RecoveredMove>()
      }
      const jobs = payloads.map((payload) => Option.getOrThrow(payload))
      const { batch, queue } = header.value
      const move: MovedJobs = { queue, jids: jobs.map(jidOf), dead: header.value.dead ?? 0 }
      yield* finishMove(keys, journal[0]!, batch, move, jobs, false, record)
      yield* Effect.logWarning("Finished a concurrency limit move left by a process that died mid-move").pipe(
        Effect.annotateLogs({ worker, queue, batch, jobs: jobs.length })
      )
      return Option.some<RecoveredMove>(move)
    }).pipe(Effect.withSpan("ConcurrencyLimits.recoverMove"))

  /**
   * The list head holding up to `max` parseable elements (plus the unparsable ones among them), each
   * with its decoding (kept, so the move decodes every element once). Read ahead (`from` > 0) it
   * starts `from` elements in, past a move under way; further pages wait until that move has `settled`
   * (taken its elements off the head), and are then read from the head as it is.
   */
  const readHead = Effect.fnUntraced(
    function*(key: string, max: number, from = 0, settled: Effect.Effect<void> = Effect.void) {
      const elements: Array<Uint8Array> = []
      const decoded: Array<Option.Option<DeferredJob>> = []
      let parseable = 0
      let offset = from
      while (parseable < max && elements.length < max + MAX_DEAD_PER_PASS) {
        const want = Math.min(max - parseable, max + MAX_DEAD_PER_PASS - elements.length)
        const start = offset + elements.length
        const page = yield* onKey(key, store.lrange(key, start, start + want - 1))
        for (const element of page) {
          const deferred = parseDeferred(element)
          elements.push(element)
          decoded.push(deferred)
          if (Option.isSome(deferred)) parseable++
        }
        if (page.length < want) break
        if (offset > 0) {
          yield* settled
          offset = 0
        }
      }
      return { elements, decoded }
    }
  )

  /** The head read (as `readHead`), its jobs built: a jid from Random each, stamped now. */
  const prepareHead = Effect.fnUntraced(
    function*(worker: string, queue: string, max: number, from = 0, settled: Effect.Effect<void> = Effect.void) {
      const { decoded, elements: expected } = yield* readHead(workerKeys(worker).deferred, max, from, settled)
      const builtAt = yield* Clock.currentTimeMillis
      const random = yield* Random.Random
      const jids: Array<string> = []
      const dead: Array<Uint8Array> = []
      const payloads: Array<string | null> = []
      for (let i = 0; i < expected.length; i++) {
        const deferred = decoded[i]!
        if (Option.isNone(deferred)) {
          dead.push(expected[i]!)
          payloads.push(null)
          continue
        }
        const jid = jidFrom(random)
        jids.push(jid)
        payloads.push(JSON.stringify(resumedJob({ worker, queue, deferred: deferred.value, jid, nowMillis: builtAt })))
      }
      return { expected, payloads, jids, dead, builtAt } satisfies PreparedHead
    }
  )

  /**
   * Per worker, the head its last move read ahead. Taken (and removed) synchronously by the worker's
   * next move; one pass per worker runs at a time (its lease), and a head taken by another mover is
   * still only a guess that BEGIN_MOVE checks.
   */
  const aheads = new Map<string, Ahead>()

  /**
   * While a move of `head` runs, the head after it: its first page read before BEGIN_MOVE is sent
   * (same connection, so Redis answers it from the list before the move), decoded and built while
   * the move's scripts run. Only for moves of MAX_RESUME_UNLIMITED that found that many (limit 0:
   * the worker's next pass follows at once); a positive limit's next pass comes a second later, with
   * a max of its own.
   */
  const readAhead = Effect.fnUntraced(function*(worker: string, queue: string, max: number, head: PreparedHead) {
    if (max !== MAX_RESUME_UNLIMITED || head.jids.length < max) {
      return Option.none<{ readonly ahead: Ahead; readonly settled: Deferred.Deferred<void> }>()
    }
    const settled = yield* Deferred.make<void>()
    const next = yield* Deferred.make<PreparedHead, RedisError | WrongTypeKey>()
    const prepare = prepareHead(worker, queue, max, head.expected.length, Deferred.await(settled))
    const fiber = yield* Deferred.into(prepare, next).pipe(
      Effect.andThen(Effect.never),
      Effect.ensuring(Effect.sync(() => {
        if (aheads.get(worker)?.head === next) aheads.delete(worker)
      })),
      Effect.forkChild({ startImmediately: true })
    )
    return Option.some({ ahead: { queue, max, head: next, fiber } satisfies Ahead, settled })
  })

  /** The head read ahead for this move, if it is for this queue and max, fresh, and not empty. */
  const takeAhead = Effect.fnUntraced(function*(worker: string, queue: string, max: number) {
    const ahead = aheads.get(worker)
    if (ahead === undefined) return Option.none<PreparedHead>()
    aheads.delete(worker)
    // A head read for another queue or max (the limit changed between passes) is dropped unread.
    const exit = ahead.queue === queue && ahead.max === max
      ? yield* Effect.exit(Deferred.await(ahead.head))
      : undefined
    yield* Fiber.interrupt(ahead.fiber)
    const now = yield* Clock.currentTimeMillis
    // A failed read ahead is only a missed head: the move reads it again, and meets the error itself.
    if (exit === undefined || exit._tag === "Failure") return Option.none<PreparedHead>()
    const head = exit.value
    return head.expected.length > 0 && now - head.builtAt <= AHEAD_MAX_AGE_MILLIS
      ? Option.some(head)
      : Option.none<PreparedHead>()
  })

  const nothing: ResumeResult = { jids: [], dead: [] }

  const resume = <E = never, R = never>(request: ResumeRequest, record: RecordMove<E, R> = recordNothing) =>
    Effect.gen(function*() {
      const { worker, queue, max, dryRun } = request
      const keys = workerKeys(worker)
      if (max <= 0) return nothing
      // Dry run: one fresh read, nothing read ahead (it writes nothing, and makes one pass).
      let ahead = dryRun ? Option.none<PreparedHead>() : yield* takeAhead(worker, queue, max)
      for (let attempt = 1; attempt <= MOVE_ATTEMPTS; attempt++) {
        // A head read ahead is a guess like any read: BEGIN_MOVE compares it, a stale one answers "changed".
        const head = Option.isSome(ahead) ? ahead.value : yield* prepareHead(worker, queue, max)
        ahead = Option.none()
        const { dead, expected, jids, payloads } = head
        if (expected.length === 0) return nothing
        if (dryRun) {
          // Which elements it would take, and the first it would leave, for shadow mode's proposal.
          const [after] = yield* onKey(keys.deferred, store.lrange(keys.deferred, expected.length, expected.length))
          const preview = {
            first: deferredDigest(expected[0]!),
            last: deferredDigest(expected[expected.length - 1]!),
            next: after === undefined ? null : deferredDigest(after)
          }
          return { jids, dead, preview } satisfies ResumeResult
        }
        const batch = jidFrom(yield* Random.Random)
        const header = encodeJournalHeader({ sweeper_move: 1, batch, queue, worker, dead: dead.length })
        const next = yield* readAhead(worker, queue, max, head)
        const dropNext = Option.match(next, {
          onNone: () => Effect.void,
          onSome: (n) => Fiber.interrupt(n.ahead.fiber)
        })
        const outcome = yield* onKey(
          keys.deferred,
          store.beginMove({
            keys,
            expected,
            payloads,
            header,
            journalTtlSeconds: Duration.toSeconds(MOVE_JOURNAL_TTL),
            deadTtlSeconds: Duration.toSeconds(DEAD_LIST_TTL)
          })
        ).pipe(Effect.onError(() => dropNext))
        if (outcome === "moved") {
          if (Option.isSome(next)) {
            aheads.set(worker, next.value.ahead)
            yield* Deferred.succeed(next.value.settled, undefined)
          }
          const jobs = payloads.filter((payload) => payload !== null)
          yield* finishMove(
            keys,
            new TextEncoder().encode(header),
            batch,
            { queue, jids, dead: dead.length },
            jobs,
            true,
            record
          )
          // A preview only (bytes that are not UTF-8 show as U+FFFD); the dead list keeps them exact.
          const sample = dead.length > 0 ? Buffer.from(dead[0]!.subarray(0, 200)).toString("utf8") : ""
          if (dead.length > 0) {
            yield* Effect.logWarning("Moved unparsable deferred jobs to the dead list").pipe(
              Effect.annotateLogs({ worker, count: dead.length, dead_list: keys.dead, sample })
            )
          }
          return { jids, dead } satisfies ResumeResult
        }
        // Read past a move that did not happen: the head after it is not the next one.
        yield* dropNext
        if (outcome === "busy") {
          // Only after a crash (one pass per worker runs at a time): finish that move, then ours.
          yield* recoverMove(worker, record)
          continue
        }
        yield* Effect.logInfo("Deferred list changed under the move; re-reading").pipe(
          Effect.annotateLogs({ worker, attempt })
        )
      }
      yield* Effect.logWarning("Deferred list kept changing under the move; leaving it for the next pass").pipe(
        Effect.annotateLogs({ worker, attempts: MOVE_ATTEMPTS })
      )
      return nothing
    }).pipe(Effect.withSpan("ConcurrencyLimits.resume"))

  const recordMoves = (worker: string, setting: Option.Option<WorkerLimit>): RecordMove<SqlError, EventLog> => {
    const limit = Option.match(setting, { onNone: () => null, onSome: (found) => found.limit })
    return (move) =>
      Effect.gen(function*() {
        yield* (yield* EventLog).appendAll(moveEvents(worker, limit, move))
      })
  }

  return ConcurrencyLimits.of({
    workersWithDeferredJobs,
    knownDeferredWorkers,
    oldestDeferred,
    limitOf,
    deferredDigests,
    queueSize,
    currentConcurrency,
    cleanupStaleTrackers,
    recordMoves,
    recoverMove,
    resume
  })
}
