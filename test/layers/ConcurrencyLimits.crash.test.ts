/**
 * The resume move across stores (docs/architecture.md, "Resume across stores") with the process dying
 * between every two steps — in memory, on one Redis, on three Redis servers (one per store) and on a
 * Redis Cluster. The fault is injected in the store primitives: the mover's fiber is interrupted
 * right before (or right after) its k-th protocol step, and its service instance is thrown away (all
 * in-memory state gone, as with kill -9). A fresh instance then recovers and makes a new pass; the
 * recovery itself is also killed at every step once. Afterwards every deferred job is exactly once
 * in `queue:<q>`, nothing is left in the deferred list or a journal, no jid repeats, unparsable
 * elements are in the dead list byte for byte, and the reserved slots cover every job not started.
 * The move's record (the program's `ConcurrencyLimitJobsResumed`, here a list of recorded jids) is a
 * step too, killed before and after like the others: every job in the queue is recorded at least once.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, Layer, Option, Random } from "effect"
import { SweeperConfig } from "../../src/config/Config.ts"
import { JOURNAL_KEY_PATTERN, workerKeys } from "../../src/domain/ConcurrencyLimit.ts"
import { queueKey, type SidekiqJob } from "../../src/domain/Sidekiq.ts"
import {
  type ConcurrencyLimitStore,
  makeConcurrencyLimits
} from "../../src/layers/protocols/ConcurrencyLimitsShared.ts"
import { ConcurrencyLimits, type MovedJobs, type RecordMove } from "../../src/services/ConcurrencyLimits.ts"
import { ConcurrencyLimitsOn, type Deployment, RawStores } from "../support/concurrencyLimitsRaw.ts"

const W = "Releases::CreateEvidenceWorker"
const Q = "default"
const CONFIG = { [W]: { limit: 0, queue: Q } }
const K = workerKeys(W)

const good = (i: number) =>
  JSON.stringify({
    args: [i, { deep: [1.5, null] }, []],
    context: { "meta.caller_id": `c${i}` },
    buffered_at: 1772366400 + i
  })
/** Unparsable, one of them not even UTF-8 (the 0xFF of). */
const JUNK: ReadonlyArray<Buffer> = [
  Buffer.from("{broken"),
  Buffer.from([0x7b, 0x22, 0x61, 0xff, 0x22, 0x7d]),
  Buffer.from(JSON.stringify({ args: 5 }))
]
const GOOD = 7
/** Good jobs with the junk in between: g0 j0 g1 g2 j1 g3 g4 g5 j2 g6. */
const seedElements = (): ReadonlyArray<
  string | Buffer
> => [good(0), JUNK[0]!, good(1), good(2), JUNK[1]!, good(3), good(4), good(5), JUNK[2]!, good(6)]

/** The protocol's write steps, in the order a move makes them ("record" is the caller's event). */
const STEPS = ["beginMove", "reserve", "registerQueue", "push", "record", "endMove", "forgetMarker"] as const
type Step = (typeof STEPS)[number]

/** The records made (as the event log would keep them): one per recorded move. */
const records: Array<MovedJobs> = []
const record: RecordMove<never, never> = (move) => Effect.sync(() => void records.push(move))

/**
 * The store and the record, killed at their k-th protocol step: interrupted right before the step
 * (`after: false`) or right after it took effect (`after: true`). Steps of a recovery count too. k
 * beyond the last step: never killed.
 */
const killedAt = (store: ConcurrencyLimitStore, k: number, after: boolean) => {
  let step = 0
  const killing = <A, E>(effect: () => Effect.Effect<A, E>) =>
    Effect.suspend(() => {
      step++
      if (step !== k) return effect()
      return after ? Effect.andThen(effect(), Effect.interrupt) : Effect.interrupt
    })
  const wrapped: Record<string, unknown> = { ...store }
  for (const name of STEPS) {
    if (name === "record") continue
    const original = store[name] as (...args: ReadonlyArray<unknown>) => Effect.Effect<unknown, unknown>
    wrapped[name] = (...args: ReadonlyArray<unknown>) => killing(() => original(...args))
  }
  const killedRecord: RecordMove<never, never> = (move) => killing(() => record(move))
  return { store: wrapped as unknown as ConcurrencyLimitStore, record: killedRecord }
}

const seed = Effect.gen(function*() {
  const raw = yield* RawStores
  records.length = 0
  yield* raw.flush
  yield* raw.rpush("sharedState", K.deferred, ...seedElements())
})

/** The invariants after recovery and a full pass. */
const checkExactlyOnce = Effect.gen(function*() {
  const raw = yield* RawStores
  const queued = (yield* raw.list("queues", queueKey(Q))).map((bytes) =>
    JSON.parse(bytes.toString("utf8")) as SidekiqJob
  ).toReversed()
  const ids = queued.map((job) => job.args[0] as number)
  assert.deepStrictEqual(
    ids.toSorted((a, b) => a - b),
    Array.from({ length: GOOD }, (_, i) => i),
    "every job exactly once in the queue"
  )
  for (const job of queued) {
    assert.deepStrictEqual(job.args, JSON.parse(good(job.args[0] as number)).args)
    assert.strictEqual(job.class, W)
    assert.strictEqual(job.concurrency_limit_resume, true)
  }
  assert.strictEqual(new Set(queued.map((job) => job.jid)).size, queued.length, "no duplicate jids")
  const recorded = new Set(records.flatMap((move) => move.jids))
  for (const job of queued) {
    assert.isTrue(recorded.has(job.jid), `job ${job.args[0]} (${job.jid}) is in the queue but was never recorded`)
  }
  assert.isTrue(
    [...recorded].every((jid) => queued.some((job) => job.jid === jid)),
    "a record names only jobs in the queue"
  )
  assert.deepStrictEqual(yield* raw.list("sharedState", K.deferred), [], "deferred list empty")
  assert.isFalse(yield* raw.exists("sharedState", K.journal), "no journal left")
  const dead = yield* raw.list("sharedState", K.dead)
  assert.deepStrictEqual(
    dead.map((b) => b.toString("hex")),
    JUNK.map((b) => b.toString("hex")),
    "junk in the dead list, byte for byte, once"
  )
  assert.isAbove(yield* raw.pttl("sharedState", K.dead), 0, "the dead list (Sweeper's key) has a TTL")
  // Each move's dead count is recorded at least once (a move recorded twice counts twice).
  assert.isAtLeast(records.reduce((sum, move) => sum + move.dead, 0), JUNK.length, "every dead element recorded")
  const pending = Number((yield* raw.get("queuesMetadata", K.pendingResumed)) ?? "0")
  assert.isAtLeast(pending, queued.length, "slots reserved for every resumed job not yet started")
  // Markers: whatever is left has a TTL (a recovery leaves its marker to expire).
  for (const [key, ttl] of yield* raw.keysWithTtl("queues", "sweeper:resume_batch:*")) assert.isAbove(ttl, 0, key)
})

const fresh = (store: ConcurrencyLimitStore) => makeConcurrencyLimits(store, CONFIG)

/** Recovery then a pass that takes everything, by a process that knows nothing of the dead one. */
const recoverAndDrain = (store: ConcurrencyLimitStore) =>
  Effect.gen(function*() {
    const limits = fresh(store)
    yield* limits.recoverMove(W, record)
    yield* limits.resume({ worker: W, queue: Q, max: 100, dryRun: false }, record)
  })

const crashSuite = (deployment: Deployment) =>
  layer(
    ConcurrencyLimitsOn(deployment).pipe(Layer.provideMerge(SweeperConfig.layerWith({ concurrencyLimits: CONFIG }))),
    {
      excludeTestServices: true,
      timeout: "60 seconds"
    }
  )(`resume move killed at every step (${deployment})`, (it) => {
    it.effect("killed before or after each step of a move, then recovered: every job exactly once", () =>
      Effect.gen(function*() {
        const raw = yield* RawStores
        for (let k = 1; k <= STEPS.length + 1; k++) {
          for (const after of [false, true]) {
            yield* seed
            // First pass takes 4 jobs (and the junk among them), killed at step k.
            const killed = killedAt(raw.store, k, after)
            const exit = yield* Effect.exit(
              fresh(killed.store).resume({ worker: W, queue: Q, max: 4, dryRun: false }, killed.record)
            )
            if (k <= STEPS.length - (after ? 1 : 0)) assert.isTrue(Exit.isFailure(exit), `killed at ${STEPS[k - 1]}`)
            yield* recoverAndDrain(raw.store)
            yield* checkExactlyOnce.pipe(
              Effect.tapCause(() => Effect.logError(`killed ${after ? "after" : "before"} step ${k}`))
            )
          }
        }
      }).pipe(Random.withSeed("crash-every-step")))

    it.effect("the recovery itself killed at each of its steps, then recovered again: every job exactly once", () =>
      Effect.gen(function*() {
        const raw = yield* RawStores
        // Killed at each step of the move after the journal exists (before reserve … before
        // endMove), then the recovery killed after each of its steps (reserve … record, endMove).
        for (let k = 2; k <= 6; k++) {
          for (let j = 1; j <= 5; j++) {
            yield* seed
            const move = killedAt(raw.store, k, false)
            yield* Effect.exit(fresh(move.store).resume({ worker: W, queue: Q, max: 4, dryRun: false }, move.record))
            assert.isTrue(yield* raw.exists("sharedState", K.journal), "a journal is left")
            const recovery = killedAt(raw.store, j, true)
            const exit = yield* Effect.exit(fresh(recovery.store).recoverMove(W, recovery.record))
            assert.isTrue(Exit.isFailure(exit))
            yield* recoverAndDrain(raw.store)
            yield* checkExactlyOnce.pipe(
              Effect.tapCause(() => Effect.logError(`move killed at ${k}, recovery after ${j}`))
            )
          }
        }
      }).pipe(Random.withSeed("crash-in-recovery")))

    it.effect("a mover frozen mid-move (lease lost), recovered by another, then waking up: no job twice", () =>
      Effect.gen(function*() {
        const raw = yield* RawStores
        for (const frozenBefore of ["reserve", "push", "endMove"] satisfies ReadonlyArray<Step>) {
          yield* seed
          const frozen = yield* Deferred.make<void>()
          const wake = yield* Deferred.make<void>()
          const freezing: ConcurrencyLimitStore = {
            ...raw.store,
            [frozenBefore]: (...args: ReadonlyArray<never>) =>
              Effect.andThen(
                Effect.andThen(Deferred.succeed(frozen, undefined), Deferred.await(wake)),
                (raw.store[frozenBefore] as (...a: ReadonlyArray<never>) => Effect.Effect<unknown, never>)(...args)
              )
          }
          const sleeper = yield* Effect.forkChild(
            fresh(freezing).resume({ worker: W, queue: Q, max: 4, dryRun: false }, record)
          )
          yield* Deferred.await(frozen)
          // Another process takes over the worker: recovers the journal and drains the list.
          yield* recoverAndDrain(raw.store)
          yield* Deferred.succeed(wake, undefined)
          yield* Fiber.join(sleeper)
          yield* checkExactlyOnce
        }
      }).pipe(Random.withSeed("frozen-mover")))

    it.effect("a move of unparsable elements only, killed at each step: they reach the dead list once and are recorded", () =>
      Effect.gen(function*() {
        const raw = yield* RawStores
        // BEGIN, record, END: no reserve, SADD or push for a move without jobs.
        for (let k = 1; k <= 4; k++) {
          for (const after of [false, true]) {
            records.length = 0
            yield* raw.flush
            yield* raw.rpush("sharedState", K.deferred, ...JUNK)
            const killed = killedAt(raw.store, k, after)
            yield* Effect.exit(
              fresh(killed.store).resume({ worker: W, queue: Q, max: 4, dryRun: false }, killed.record)
            )
            yield* recoverAndDrain(raw.store)
            const where = `killed ${after ? "after" : "before"} step ${k}`
            assert.deepStrictEqual(
              (yield* raw.list("sharedState", K.dead)).map((b) => b.toString("hex")),
              JUNK.map((b) => b.toString("hex")),
              where
            )
            assert.deepStrictEqual(yield* raw.list("sharedState", K.deferred), [], where)
            assert.isFalse(yield* raw.exists("sharedState", K.journal), where)
            assert.deepStrictEqual(yield* raw.list("queues", queueKey(Q)), [], where)
            assert.isAtLeast(
              records.reduce((sum, move) => sum + move.dead, 0),
              JUNK.length,
              `${where}: the dead elements were recorded`
            )
          }
        }
      }).pipe(Random.withSeed("dead-only")))

    it.effect("a journal whose worker has nothing deferred any more is still found and finished", () =>
      Effect.gen(function*() {
        const raw = yield* RawStores
        yield* raw.flush
        yield* raw.rpush("sharedState", K.deferred, good(0), good(1))
        yield* Effect.exit(
          fresh(killedAt(raw.store, 2, false).store).resume({ worker: W, queue: Q, max: 10, dryRun: false })
        )
        assert.deepStrictEqual(yield* raw.list("sharedState", K.deferred), [])
        const journals = yield* raw.keysWithTtl("sharedState", JOURNAL_KEY_PATTERN)
        assert.deepStrictEqual(journals.map(([key]) => key), [K.journal])
        assert.isAbove(journals[0]![1], 0, "the journal has a TTL")
        // A worker nobody configured: discovery must come from the journal alone.
        const limits = makeConcurrencyLimits(raw.store, {})
        assert.deepStrictEqual(yield* limits.workersWithDeferredJobs, [W])
        const recovered = yield* limits.recoverMove(W)
        assert.isTrue(Option.isSome(recovered))
        assert.lengthOf(Option.getOrThrow(recovered).jids, 2)
        const queued = yield* raw.list("queues", queueKey(Q))
        assert.lengthOf(queued, 2)
        assert.isFalse(yield* raw.exists("sharedState", K.journal))
      }).pipe(Random.withSeed("journal-only")))

    it.effect("an unreadable journal is moved to the dead list byte for byte, never dropped or pushed", () =>
      Effect.gen(function*() {
        const raw = yield* RawStores
        const limits = yield* ConcurrencyLimits
        yield* raw.flush
        const garbage = [Buffer.from([0xff, 0x00, 0x41]), Buffer.from("not a job")]
        yield* raw.rpush("sharedState", K.journal, ...garbage)
        assert.isTrue(Option.isNone(yield* limits.recoverMove(W)))
        assert.isFalse(yield* raw.exists("sharedState", K.journal))
        assert.deepStrictEqual(
          (yield* raw.list("sharedState", K.dead)).map((b) => b.toString("hex")),
          garbage.map((b) => b.toString("hex"))
        )
        assert.deepStrictEqual(yield* raw.list("queues", queueKey(Q)), [])
      }))
  })

describe("ConcurrencyLimits: resume across stores survives a crash at every step", () => {
  for (const deployment of ["memory", "single", "split", "cluster"] satisfies ReadonlyArray<Deployment>) {
    crashSuite(deployment)
  }
})
