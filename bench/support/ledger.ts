/**
 * What the raw baselines need to write the ledger as Sweeper does: a run id for their rows and the
 * check that a phase wrote exactly the event rows it owes.
 *
 * Sweeper writes one `sweeper_events` row per repaired record (concurrency-limit-resume: one
 * ConcurrencyLimitJobsResumed per move, its jids inside, as the journaled move writes it), with a
 * run id, so every row enters every index of the ledger, the partial `(run_id, id)` one included.
 * The raw baselines write the same rows (same table, type, stream, payload keys and run id column),
 * set-based, in the repair's own statement or one INSERT … SELECT per slice; without a RunStarted,
 * RunFinished, lease, fence, claim or outbox.
 */
import { PgClient } from "@effect/sql-pg"
import { Data, Effect } from "effect"
import { randomUUID } from "node:crypto"
import { fmt } from "./harness.ts"

/** The run id a raw phase stamps on its rows (no run row: the raw baseline has no runs). */
export const rawRunId = () => randomUUID()

export class LedgerMismatch extends Data.TaggedError("LedgerMismatch")<{ readonly message: string }> {}

/**
 * Fails the phase unless the ledger holds exactly `rows` events of `type` (and, with `counted`, their
 * `data.count` sums to that): a raw baseline that skipped its ledger would make a ratio against it
 * meaningless. Run after the phase's timing.
 */
export const expectLedgerRows = (type: string, rows: number, counted?: number) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const [found] = yield* sql<{ readonly rows: string; readonly counted: string | null }>`
      SELECT count(*) AS rows, sum((data->>'count')::bigint) AS counted FROM sweeper_events WHERE type = ${type}`
    const writtenRows = Number(found!.rows)
    const writtenCount = Number(found!.counted ?? 0)
    if (writtenRows !== rows || (counted !== undefined && writtenCount !== counted)) {
      return yield* new LedgerMismatch({
        message: `raw wrote ${fmt(writtenRows)} ${type} rows (count ${fmt(writtenCount)}), owed ${fmt(rows)}${
          counted === undefined ? "" : ` (count ${fmt(counted)})`
        }`
      })
    }
    return writtenRows
  })
