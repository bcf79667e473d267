/**
 * The health sampler's fiber: the one writer of the slots (SamplerSlots.ts). Rounds and fresh lag reads
 * are asked of it through a mailbox; it forks the reads (SamplerReads.ts) and applies what they bring
 * back, one message at a time, then publishes.
 */
import * as Cause from "effect/Cause"
import * as Clock from "effect/Clock"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import type * as Exit from "effect/Exit"
import * as Queue from "effect/Queue"
import type * as Result from "effect/Result"
import type { DatabaseName } from "../../domain/Databases.ts"
import { SignalUnreadable } from "../../services/HealthSignals.ts"
import type { Metrics } from "../../services/Metrics.ts"
import { readRound } from "./SamplerReads.ts"
import {
  applyLag,
  applyRound,
  type LagValue,
  type RoundRead,
  type SamplerState,
  type SignalReaders,
  STALE_AFTER
} from "./SamplerSlots.ts"

/**
 * A read forked by the sampler's fiber starts at once: one that needs no I/O wait (a reading at hand)
 * is back in the mailbox before the fiber takes its next message.
 */
export const IMMEDIATELY = { startImmediately: true } as const

/**
 * The longest a forked read may take before the fiber gives up on it (a reader with no bound of its
 * own, a bug): past it a round counts as failed and a lag read as unreadable, so one stuck read can
 * never stop the rounds after it. The live readers are bounded well under it (READ_TIMEOUT).
 */
export const READ_BOUND = STALE_AFTER

/** What the sampler's fiber is asked, and what the reads it forked tell it back. */
export type Message =
  | { readonly _tag: "Round"; readonly when: (now: number) => boolean; readonly reply: Deferred.Deferred<void> | null }
  | { readonly _tag: "RoundRead"; readonly exit: Exit.Exit<RoundRead, Cause.TimeoutError> }
  | { readonly _tag: "FreshLag"; readonly database: DatabaseName; readonly reply: Deferred.Deferred<void> }
  | {
    readonly _tag: "LagRead"
    readonly database: DatabaseName
    readonly at: number
    readonly lag: Result.Result<LagValue, SignalUnreadable>
  }

/** A unit waiting on a round: `when` says whether it still needs one once the round in flight is in. */
export interface RoundWaiter {
  readonly when: (now: number) => boolean
  readonly reply: Deferred.Deferred<void>
  /** It joined a round that began before it asked. */
  readonly joined: boolean
}

/**
 * The sampler's fiber: the one writer of the slots. Rounds and fresh lag reads are asked of it through
 * its mailbox; it forks the reads (a slow server never keeps it from answering) and applies what they
 * bring back, one message at a time, then publishes. A fresh lag read serves the units that asked
 * before it began; those asking while it is in flight get the next one. A unit that stops waiting
 * (its deadline) leaves the read running for the others.
 */
export const startSampling = (state: SamplerState, readers: SignalReaders) =>
  Effect.gen(function*() {
    const mailbox = yield* Queue.unbounded<Message>()
    const lagDatabases = new Set(
      [...state.slots.values()].flatMap((slot) =>
        slot.rule.source._tag === "ReplicationLag" && slot.database !== undefined ? [slot.database] : []
      )
    )
    // The fiber's own bookkeeping: the round being read (null: none) and each database's lag read.
    let round: Array<RoundWaiter> | null = null
    const lagReads = new Map<
      DatabaseName,
      { readonly waiting: Array<Deferred.Deferred<void>>; next: Array<Deferred.Deferred<void>> }
    >()
    const unreadable = (reason: string) => new SignalUnreadable({ source: "pg_stat_replication", reason })
    const done = (replies: ReadonlyArray<Deferred.Deferred<void>>) =>
      Effect.forEach(replies, (reply) => Deferred.succeed(reply, undefined), { discard: true })

    const startRound = (waiters: Array<RoundWaiter>) =>
      Effect.suspend(() => {
        round = waiters
        return Effect.asVoid(
          Effect.forkChild(IMMEDIATELY)(
            Effect.flatMap(
              Effect.exit(Effect.timeout(readRound(state, readers), READ_BOUND)),
              (exit) => Queue.offer(mailbox, { _tag: "RoundRead", exit })
            )
          )
        )
      })
    const startLag = (database: DatabaseName, waiting: Array<Deferred.Deferred<void>>) =>
      Effect.suspend(() => {
        lagReads.set(database, { waiting, next: [] })
        return Effect.asVoid(
          Effect.forkChild(IMMEDIATELY)(Effect.gen(function*() {
            const at = yield* Clock.currentTimeMillis
            const lag = yield* Effect.result(
              readers.signalsOf(database).replicationLag.pipe(
                Effect.timeoutOrElse({ duration: READ_BOUND, orElse: () => Effect.fail(unreadable("no answer")) }),
                // A reader that dies is a reading that could not be taken, not a sampler that stops.
                Effect.catchDefect((defect) => Effect.fail(unreadable(String(defect))))
              )
            )
            yield* Queue.offer(mailbox, { _tag: "LagRead", database, at, lag })
          }))
        )
      })

    const handle = (message: Message): Effect.Effect<void, never, Metrics> => {
      switch (message._tag) {
        case "Round": {
          const waiter = message.reply === null ? [] : [{ when: message.when, reply: message.reply, joined: true }]
          if (round !== null) return Effect.sync(() => void round?.push(...waiter))
          return Effect.flatMap(Clock.currentTimeMillis, (now) =>
            message.when(now)
              ? startRound(waiter.map((w) => ({ ...w, joined: false })))
              : done(waiter.map((w) => w.reply)))
        }
        case "RoundRead": {
          const waiters = round ?? []
          round = null
          return Effect.gen(function*() {
            if (message.exit._tag === "Success") yield* applyRound(state, message.exit.value)
            else yield* Effect.logError("Health sampler round failed; the next one is on schedule", message.exit.cause)
            // Who joined a round begun before it asked and still finds the readings stale gets one more.
            const now = yield* Clock.currentTimeMillis
            const again = waiters.filter((w) => w.joined && w.when(now)).map((w) => ({ ...w, joined: false }))
            yield* done(waiters.filter((w) => !again.some((a) => a.reply === w.reply)).map((w) => w.reply))
            if (again.length > 0) yield* startRound(again)
          })
        }
        case "FreshLag": {
          if (!lagDatabases.has(message.database)) return Deferred.succeed(message.reply, undefined)
          const inFlight = lagReads.get(message.database)
          if (inFlight !== undefined) return Effect.sync(() => void inFlight.next.push(message.reply))
          return startLag(message.database, [message.reply])
        }
        case "LagRead": {
          const reads = lagReads.get(message.database)
          lagReads.delete(message.database)
          return Effect.gen(function*() {
            yield* applyLag(state, message.database, message.at, message.lag)
            yield* done(reads?.waiting ?? [])
            if (reads !== undefined && reads.next.length > 0) yield* startLag(message.database, reads.next)
          })
        }
      }
    }

    // One message at a time, for as long as the sampler lives; one whose handling dies (a bug) is logged.
    yield* Queue.take(mailbox).pipe(
      Effect.flatMap((message) =>
        handle(message).pipe(
          Effect.catchCause((cause) =>
            Cause.hasInterruptsOnly(cause)
              ? Effect.failCause(cause)
              : Effect.logError("Health sampler message failed", Cause.pretty(cause))
          )
        )
      ),
      Effect.forever,
      Effect.forkScoped
    )

    const ask = (make: (reply: Deferred.Deferred<void>) => Message) =>
      Effect.gen(function*() {
        const reply = yield* Deferred.make<void>()
        yield* Queue.offer(mailbox, make(reply))
        yield* Deferred.await(reply)
      })
    return {
      /** A round if `when` says one is due (a schedule tick): nothing waits for it. */
      tick: (when: (now: number) => boolean) =>
        Effect.asVoid(Queue.offer(mailbox, { _tag: "Round", when, reply: null })),
      /** A round if `when` says one is due, returning once its readings are published. */
      round: (when: (now: number) => boolean) => ask((reply) => ({ _tag: "Round", when, reply })),
      /** The database's replication lag read after this call, returning once it is published. */
      freshLag: (database: DatabaseName) => ask((reply) => ({ _tag: "FreshLag", database, reply }))
    }
  })
