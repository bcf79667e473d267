/**
 * How a run's own record meets its repair events in the ledger. With one database a repair's events
 * are in the ledger when it commits, and RunFinished simply follows them. A decomposed GitLab's ci
 * repairs write theirs into ci's outbox and a relay brings them to main's ledger later, so the run's
 * end asks here how many are still owed, and RunFinished says so (the relay then closes them with
 * RunEventsRelayed); when main cannot take RunFinished at all, it waits in ci's outbox behind the
 * run's events (layers/postgres/Outbox.ts).
 */
import type * as Cause from "effect/Cause"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import type { SqlError } from "effect/sql/SqlError"
import type { RunFinished } from "../domain/Events.ts"

export const RunLedger = Context.Reference<{
  /**
   * How many of the run's repair events are not in the ledger yet, after giving the relay a bounded
   * chance to bring them. Fails when that cannot be known (ci unreachable or not answering) for a
   * run this process saw write nothing there.
   */
  readonly eventsOwed: (runId: string) => Effect.Effect<number, SqlError | Cause.TimeoutError>
  /**
   * Appends the run's RunFinished with `append`; one that says events are owed is registered in the
   * same transaction, so the relay appends RunEventsRelayed once the last of them is in.
   */
  readonly appendFinished: (
    finished: RunFinished,
    runId: string,
    append: Effect.Effect<void, SqlError>
  ) => Effect.Effect<void, SqlError>
  /**
   * Puts RunFinished where the relay will bring it to the ledger behind the run's own events (main
   * could not take it). False when there is no such place (one database) or it could not be written.
   */
  readonly deferFinished: (finished: RunFinished, runId: string) => Effect.Effect<boolean>
  /** Whether the run's RunFinished waits to be relayed (so the run is over, not abandoned). */
  readonly finishDeferred: (runId: string) => Effect.Effect<boolean, SqlError>
}>("sweeper/services/RunLedger", {
  defaultValue: () => ({
    eventsOwed: () => Effect.succeed(0),
    appendFinished: (_finished, _runId, append) => append,
    deferFinished: () => Effect.succeed(false),
    finishDeferred: () => Effect.succeed(false)
  })
})
