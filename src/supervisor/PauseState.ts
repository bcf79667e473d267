/**
 * Pause and resume. Pauses are events, and not only this process writes them: `sweeper pause`
 * against the same database, or another replica's console. The event is written first and the
 * actor's state changes only once it is; before each tick the actor takes the newest pause event
 * of its stream as the truth.
 */
import * as Cause from "effect/Cause"
import * as Effect from "effect/Effect"
import * as Ref from "effect/Ref"
import { describeError, PauseNotRecorded } from "../domain/Errors.ts"
import { BatchPaused, BatchResumed } from "../domain/Events.ts"
import { EventLog } from "../services/EventLog.ts"
import type { Actor, ActorState } from "./Actor.ts"

/**
 * The one road of a pause or resume: its event, written or refused as PauseNotRecorded. The
 * supervisor (through the API) and the CLI without one (straight to the database) both take it;
 * every supervisor folds the event before its next tick.
 */
export const recordPause = (batch: string, action: "pause" | "resume", by: string) =>
  Effect.flatMap(
    EventLog,
    (events) =>
      events.append(action === "pause" ? new BatchPaused({ batch, by }) : new BatchResumed({ batch, by })).pipe(
        Effect.catchCause((cause) =>
          Effect.fail(new PauseNotRecorded({ batch, action, detail: describeError(Cause.squash(cause)) }))
        )
      )
  )

/**
 * The state once paused or resumed. A disabled batch stays disabled and a running one keeps
 * running: its status follows the pause when the run ends.
 */
const withPause = (s: ActorState, pause: { by: string; at: Date } | undefined): ActorState => {
  const keep = s.status === "disabled" || s.status === "running"
  return pause !== undefined
    ? {
      ...s,
      status: keep ? s.status : "paused",
      history: { ...s.history, paused: true, pausedBy: pause.by, pausedAt: pause.at }
    }
    : {
      ...s,
      status: keep ? s.status : "idle",
      history: { ...s.history, paused: false, pausedBy: undefined, pausedAt: undefined }
    }
}

/**
 * Takes the newest BatchPaused / BatchResumed of the batch's stream as the truth, so an operator's
 * pause stops the batch everywhere from its next tick. Unreadable events keep the state this
 * process knows.
 */
export const refreshPaused = (actor: Actor) =>
  actor.pauseLock.withPermits(1)(Effect.gen(function*() {
    const events = yield* EventLog
    const stream = `batch:${actor.batch.name}`
    const [paused, resumed] = yield* Effect.all([
      events.query({ stream, type: "BatchPaused", newestFirst: true, limit: 1 }),
      events.query({ stream, type: "BatchResumed", newestFirst: true, limit: 1 })
    ])
    const lastPause = paused[0]
    const isPaused = lastPause !== undefined && (resumed[0] === undefined || resumed[0].id < lastPause.id)
    yield* Ref.update(actor.state, (s) =>
      s.history.paused === isPaused
        ? s
        : withPause(
          s,
          isPaused ? { by: String(lastPause!.data.by ?? "unknown"), at: lastPause!.occurredAt } : undefined
        ))
  })).pipe(
    Effect.catchCause((cause) => Effect.logWarning("Could not read the batch's pause state", Cause.pretty(cause)))
  )

/**
 * Pause or resume: the event first, then the state. An event that cannot be written fails the
 * call with PauseNotRecorded and changes nothing: the event log is the truth every replica and
 * refreshPaused fold, so a state it does not hold would be undone at the next tick.
 */
export const setPaused = (actor: Actor, action: "pause" | "resume", by: string) =>
  actor.pauseLock.withPermits(1)(
    Effect.gen(function*() {
      yield* recordPause(actor.batch.name, action, by)
      const at = new Date(yield* Effect.clockWith((clock) => clock.currentTimeMillis))
      yield* Ref.update(actor.state, (s) => withPause(s, action === "pause" ? { by, at } : undefined))
      yield* Effect.logInfo(action === "pause" ? "Batch paused" : "Batch resumed", { by })
    }).pipe(Effect.annotateLogs({ batch: actor.batch.name }))
  )
