/**
 * What a batch's actor is made of: its mailbox, its state (a fold of its events, kept in a Ref the
 * actor alone writes, pauses aside) and the missed ticks waiting for the database. The behaviour
 * lives in BatchActor.ts, MissedTicks.ts and PauseState.ts.
 */
import type * as Cron from "effect/Cron"
import type * as Deferred from "effect/Deferred"
import type * as FiberSet from "effect/FiberSet"
import type * as Queue from "effect/Queue"
import type * as Ref from "effect/Ref"
import type * as Semaphore from "effect/Semaphore"
import type { BatchHistory } from "../domain/BatchState.ts"
import type { TickMissed } from "../domain/Events.ts"
import type { RegisteredBatch } from "../programs/index.ts"
import type { RunResult, Trigger } from "./RunGuard.ts"

export type Message =
  | { readonly _tag: "Tick"; readonly scheduledAt: Date; readonly trigger: Trigger }
  | {
    readonly _tag: "RunNow"
    readonly dryRun: boolean
    readonly asOf?: Date | undefined
    readonly reply: Deferred.Deferred<RunResult>
  }

export type ActorStatus = "idle" | "running" | "paused" | "disabled"

export interface ActorState {
  readonly status: ActorStatus
  readonly nextTick: Date | undefined
  readonly pendingTick: Date | undefined
  readonly history: BatchHistory
  /** The pause (its pausedAt, in ms) whose missed ticks have been logged: one line per pause, not per tick. */
  readonly pauseLogged?: number | undefined
}

export interface Actor {
  readonly batch: RegisteredBatch
  readonly cronText: string
  readonly cron: Cron.Cron
  readonly mailbox: Queue.Queue<Message>
  readonly state: Ref.Ref<ActorState>
  /** TickMissed events that could not be written (database down), oldest first; flushed later. */
  readonly unrecorded: Ref.Ref<ReadonlyArray<TickMissed>>
  /**
   * One pause-state change at a time: a pause (write, then apply) and the refresh from the event
   * log (read, then apply) must not interleave, or a refresh that read before the pause was written
   * would apply the old state after it.
   */
  readonly pauseLock: Semaphore.Semaphore
}

/** What every actor of one scheduler shares: whether it is shutting down, and the runs in flight. */
export interface Runs {
  readonly shuttingDown: Ref.Ref<boolean>
  readonly inflight: FiberSet.FiberSet<RunResult>
}
