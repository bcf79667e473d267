/**
 * What the health gate's actor (HealthGateActor.ts) is asked and what it answers: its requests,
 * each waiter's reply, and the view it publishes after every request (with what the report says of
 * one hold). The actor's state and its handling of each request are in HealthGateActor.ts.
 */
import type * as Deferred from "effect/Deferred"
import type * as Effect from "effect/Effect"
import type * as SubscriptionRef from "effect/SubscriptionRef"
import type { RunInfo } from "../../domain/Batch.ts"
import { holdText, type SignalRule } from "../../domain/Health.ts"
import type * as Holds from "../../domain/HealthHolds.ts"
import type { HoldReport, ThrottleReport } from "../../services/HealthReport.ts"
import type { GateBatches } from "./HealthGateBatches.ts"

/** What one ask of a run's waiter hears back. */
export interface AskReply {
  /** The signals holding the run after this check (opened now or kept). */
  readonly holding: ReadonlyArray<string>
  /** Some hold of the run is open. */
  readonly held: boolean
  /**
   * The run's held time not reported by an earlier verdict, taken when this reply is the waiter's
   * last (released, or its deadline passed); 0 otherwise.
   */
  readonly heldMs: number
  /** The run's deadline has passed while held: the waiter's last reply. */
  readonly pastDeadline: boolean
}

/** What the actor holds now, published after each request. */
export interface ActorView {
  readonly holds: ReadonlyArray<HoldReport>
  readonly throttled: ReadonlyArray<ThrottleReport>
}

export type Request =
  | { readonly _tag: "Enter"; readonly run: string; readonly batch: string; readonly info: RunInfo }
  | {
    readonly _tag: "Ask"
    readonly run: string
    readonly batch: string
    readonly rules: ReadonlyArray<SignalRule>
    readonly deadlineMillis: number | undefined
    readonly reply: Deferred.Deferred<AskReply>
  }
  | { readonly _tag: "Leave"; readonly run: string; readonly reply: Deferred.Deferred<void> }
  | { readonly _tag: "Recall"; readonly batch: string }
  | {
    readonly _tag: "Throttle"
    readonly batch: string
    readonly worker: string
    readonly limit: number
    readonly dryRun: boolean
    readonly reply: Deferred.Deferred<number>
  }

export interface GateActor {
  /**
   * A waiter of the run enters the gate (its holds then end only when the last waiter leaves). Put on
   * the queue without waiting: the actor takes requests in order, so the waiter's asks come after it.
   */
  readonly enter: (run: string, batch: string, info: RunInfo) => Effect.Effect<void>
  /** One check of the batch's rules against the run's holds, on the readings published now. */
  readonly ask: (
    run: string,
    batch: string,
    rules: ReadonlyArray<SignalRule>,
    deadlineMillis: number | undefined
  ) => Effect.Effect<AskReply>
  /**
   * A waiter leaves its run: the last one ends the holds still open (its deadline, an interruption).
   * `wait`: return once the actor has done it (the holds it ends are written); an interrupted waiter
   * only puts it on the queue.
   */
  readonly leave: (run: string, wait: boolean) => Effect.Effect<void>
  /** concurrency-limit-resume's throttled limit for a pass (a dry run's moves nothing). */
  readonly throttle: (batch: string, worker: string, limit: number, dryRun: boolean) => Effect.Effect<number>
  readonly view: SubscriptionRef.SubscriptionRef<ActorView>
  /** sweeper_repair_held and its seconds, and every effective limit, at rest from start-up. */
  readonly seriesAtStart: Effect.Effect<void>
}

/** What the report says of a run's open hold. */
export const holdReport = (
  batches: GateBatches,
  rules: ReadonlyArray<SignalRule>,
  batch: string,
  signal: string,
  hold: Holds.OpenHold
): HoldReport => {
  const rule = rules.find((r) => r.signal === signal)
  const database = batches.databaseFor(signal, batch)
  return {
    batch,
    signal,
    ...(database === undefined ? {} : { database }),
    value: hold.value,
    display: hold.display,
    threshold: hold.threshold,
    since: new Date(hold.since).toISOString(),
    text: holdText({
      batch,
      signal,
      database,
      display: hold.display,
      threshold: hold.threshold,
      prometheus: rule?.source._tag === "Prometheus",
      since: hold.since
    })
  }
}
