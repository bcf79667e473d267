/**
 * The health gate: asked by the repair loop before every page, step or pass of every
 * batch — never inside one — so that repairs yield to a platform already in trouble (a standby
 * behind, a WAL burst, autovacuum on a table the batch writes, a Redis near its memory limit, a
 * Sidekiq queue already late, a Prometheus rule the operators alert on).
 *
 * A reference with a default, like `CurrentRun`: a program run bare (a spec, the REPL) sees an
 * open gate that never holds, and the runtime provides the configured one (`SWEEPER_HEALTH`).
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"

export interface GateRequest {
  /** The batch about to do a unit of work (kebab-case name). */
  readonly batch: string
  /**
   * Epoch milliseconds at which the run's budget ends, if it has one. A hold that reaches it
   * returns `proceed: false`: the loop stops as if its budget were spent (the run ends succeeded,
   * the next tick carries on).
   */
  readonly deadlineMillis?: number | undefined
}

export interface GateVerdict {
  /** true: do the unit now. false: the deadline passed while held; write nothing more. */
  readonly proceed: boolean
  /**
   * Wall-clock milliseconds the run was held that no earlier verdict reported (0 when every signal
   * was healthy). Concurrent units of a run share its holds, so summing every verdict of a run
   * gives the time it was held, not one copy per waiting unit.
   */
  readonly heldMs: number
  /**
   * The signals that held it, by configuration key (a Prometheus rule by its `name`). In a dry run,
   * which is never held: the signals that would have held a real run.
   */
  readonly heldBy: ReadonlyArray<string>
}

export interface LimitRequest {
  readonly batch: string
  readonly worker: string
  /** The worker's configured (or Redis) limit; only a positive limit is ever throttled. */
  readonly limit: number
}

export interface HealthGateShape {
  /**
   * Returns at once when the batch may proceed; otherwise holds (no writes, the lease kept and
   * renewed by the run guard) and re-checks on each new round of readings until released or the deadline passes.
   * A dry run (`CurrentRun.dryRun`) is never held and writes no gate event.
   * Never fails: a signal that cannot be read is `unknown`, treated as its configuration says.
   */
  readonly beforeUnit: (request: GateRequest) => Effect.Effect<GateVerdict>
  /**
   * concurrency-limit-resume with `throttleLimits`: the effective limit for this pass (×0.8, ×0.5,
   * recovering max(+1, ×1.1) per healthy pass up to `limit`). Without throttling: `limit`.
   */
  readonly effectiveLimit: (request: LimitRequest) => Effect.Effect<number>
  /**
   * A unit's write (a page, a step, a pass), run as is: the gate notes when this process starts and
   * stops writing the batch's database, so that a relative `walRate` learns the platform's normal rate
   * with Sweeper's own WAL taken out instead of skipping every sample taken while a batch ran.
   */
  readonly ownWrite: (batch: string) => <A, E, R>(write: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
}

const PROCEED: GateVerdict = { proceed: true, heldMs: 0, heldBy: [] }

/** The gate that never holds: no `SWEEPER_HEALTH`, or a program run bare. */
export const openGate: HealthGateShape = {
  beforeUnit: () => Effect.succeed(PROCEED),
  effectiveLimit: ({ limit }) => Effect.succeed(limit),
  ownWrite: () => (write) => write
}

export const HealthGate = Context.Reference<HealthGateShape>("sweeper/services/HealthGate", {
  defaultValue: () => openGate
})
