/**
 * The repair loop: the one piece of machinery under every page-, step- and pass-shaped
 * batch, so that a program is only its seed's flowchart — what a unit reads and decides, what it
 * writes — and every cross-cutting capability lives here once:
 *
 *   source of units (keyset pages with read-ahead, scan steps that grow, passes, a list)
 *     → before each unit: HealthGate.beforeUnit (a hold; proceed:false stops as if the budget
 *       were spent), its heldMs/heldBy summed into the summary
 *     → plan (read and decide; never writes)
 *     → dry run: each target's `wouldChange`, the unit's dry counts; never a write
 *     → else the fence (unless the write fences itself in its own statement), then the write,
 *       whose `commit`s are reported at once (`reportProgress`) and folded into the totals
 *     → after each unit: budget spent? (cooperative: overshoot ≤ one unit; the deadline is the
 *       run's, set once, so loops run one after another or a retried attempt share it)
 *     → progress: a keyset cursor moves past every page, a step past every entry, a list past every
 *       input, so no source revisits a unit; a repeated write (`repeatUntilDone`) that changes
 *       nothing twice in a row ends its loop
 *     → passes: cadence from a `Schedule` (1 s for a positive limit, back to back for 0, 1 s
 *       after a pass that moved nothing)
 *
 * What programs import, from four files: the types, the budget and the bookkeeping every loop
 * shares (LoopBookkeeping.ts), where units come from (UnitLoops.ts), the cadence of passes and
 * their leases (Cadence.ts), work isolated per key (IsolatedKeys.ts).
 *
 * Why its own room (repair/) and not layers/ or runtime/: it is no implementation of a service
 * contract and has no backend to choose; like the run guard it is policy applied to every batch the
 * same way, but it depends only on domain/ and services/ (CurrentRun, Clock, the HealthGate and
 * Lease contracts), so programs may import it as they import those.
 */
export { leasedPasses, type Next, passes, underLease } from "./Cadence.ts"
export { isolatedEach, isolatedEachWith, type KeyFailure } from "./IsolatedKeys.ts"
export {
  type Budget,
  budget,
  type Counts,
  type Held,
  logIds,
  type LoopResult,
  NOT_HELD,
  type Stop,
  sumHeld,
  type Unit,
  withDeadline
} from "./LoopBookkeeping.ts"
export { each, growingSteps, type Growth, keysetPages, repeatUntilDone } from "./UnitLoops.ts"
