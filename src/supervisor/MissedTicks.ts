/**
 * Ticks that will not run: each is recorded once cluster-wide as a TickMissed event, counted and
 * logged. While the database is down the events wait in the actor's memory (bounded) and are
 * written, oldest first, once it answers again, before the batch's next run.
 */
import * as Cause from "effect/Cause"
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import * as Ref from "effect/Ref"
import { TickMissed } from "../domain/Events.ts"
import { periodAt, tickClaimTtl } from "../domain/Schedule.ts"
import { EventLog } from "../services/EventLog.ts"
import { Lease } from "../services/Lease.ts"
import { increment, ticksMissedTotal } from "../services/Metrics.ts"
import type { Actor } from "./Actor.ts"
import { tickLeaseName } from "./RunGuard.ts"

/** Per batch, at most this many unwritten TickMissed events wait for the database (the oldest go). */
export const MAX_UNRECORDED_MISSED_TICKS = 1000

/**
 * Writes the batch's TickMissed events that waited for the database, oldest first; stops at the
 * first that still cannot be written. Only the batch's own actor (or start-up, before it gets
 * any message) calls this, so two flushes of one batch never overlap.
 */
export const flushUnrecorded = (actor: Actor) =>
  Effect.gen(function*() {
    const events = yield* EventLog
    const waiting = yield* Ref.get(actor.unrecorded)
    let written = 0
    for (const event of waiting) {
      const ok = yield* events.append(event).pipe(Effect.as(true), Effect.orElseSucceed(() => false))
      if (!ok) break
      written++
    }
    if (written === 0) return
    yield* Ref.update(actor.unrecorded, (now) => now.slice(written))
    yield* Effect.logInfo(`Recorded ${written} missed tick(s) that waited for the database`)
      .pipe(Effect.annotateLogs({ batch: actor.batch.name }))
  })

/** Keeps `event` for later; past MAX_UNRECORDED_MISSED_TICKS the oldest waiting ones are dropped, loudly. */
const keepForLater = (actor: Actor, event: TickMissed) =>
  Effect.gen(function*() {
    const dropped = yield* Ref.modify(actor.unrecorded, (now) => {
      const next = [...now, event]
      const over = Math.max(0, next.length - MAX_UNRECORDED_MISSED_TICKS)
      return [over, next.slice(over)] as const
    })
    if (dropped > 0) {
      yield* Effect.logError(
        `${dropped} unrecorded missed tick(s) dropped: more than ${MAX_UNRECORDED_MISSED_TICKS} waiting`
      )
    }
  })

/**
 * A tick that will not run is recorded once cluster-wide: whoever claims the tick records it.
 * Except when the lease store itself is unreachable: then every replica records its own miss
 * (duplicated beats silent). When the run guard could not write the run's RunStarted
 * (`database_unavailable`), this process already holds the tick's claim. A TickMissed that
 * cannot be written waits in memory (bounded) and is written once the database answers again.
 */
export const recordMissed = (
  actor: Actor,
  scheduledAt: Date,
  reason: TickMissed["reason"],
  log: Effect.Effect<void> = Effect.logWarning("Tick missed")
) =>
  Effect.gen(function*() {
    const events = yield* EventLog
    const lease = yield* Lease
    const at = DateTime.fromDateUnsafe(scheduledAt)
    if (reason !== "lease_unavailable" && reason !== "database_unavailable") {
      if (
        !(yield* lease.claim(tickLeaseName(actor.batch.name, at), tickClaimTtl(periodAt(actor.cron, scheduledAt))))
      ) return
    }
    yield* increment(ticksMissedTotal, 1, { batch: actor.batch.name, reason })
    yield* log
    yield* Ref.update(actor.state, (s) => ({ ...s, history: { ...s.history, lastCoveredTick: scheduledAt } }))
    const event = new TickMissed({ batch: actor.batch.name, scheduled_at: DateTime.formatIso(at), reason })
    yield* flushUnrecorded(actor)
    const waiting = (yield* Ref.get(actor.unrecorded)).length > 0
    const written = !waiting && (yield* events.append(event).pipe(
      Effect.as(true),
      Effect.catchCause((cause) =>
        Effect.as(
          Effect.logWarning("Could not record missed tick; it waits for the database", Cause.pretty(cause)),
          false
        )
      )
    ))
    if (!written) yield* keepForLater(actor, event)
  }).pipe(
    Effect.catchCause((cause) => Effect.logWarning("Could not record missed tick", Cause.pretty(cause))),
    Effect.annotateLogs({ batch: actor.batch.name, scheduled_at: scheduledAt.toISOString(), reason })
  )
