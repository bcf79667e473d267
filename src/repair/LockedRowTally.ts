/**
 * Rows a batch skipped because another open transaction held them (a page claims its rows FOR
 * UPDATE SKIP LOCKED and never waits for one), tallied the same way for every batch that skips
 * them (`domain/LockedRows.ts` says why):
 *
 *   per unit   the skipped ids in one info line; each counted across runs (`LockedRows`), once per
 *              run however often the run meets it (a page revisited, a retried attempt); a row
 *              skipped LOCKED_RUNS_WARNING runs in a row or more warned about once per run; the
 *              unit's other rows got past, so any count of theirs is forgotten
 *   per run    how many rows the run skipped: each unit returns its rows the run had not skipped
 *              yet, and the summary's `skippedLocked` sums them
 *   at the end a run that covered every candidate (its loops ended "done") got past every counted
 *              row it did not skip (repaired, or no longer a candidate): those are forgotten
 *
 * The counts are a diagnostic: a dry run writes none, and a count that cannot be read or written
 * fails nothing (logged at debug). One tally per run attempt; a retried attempt makes its own, and
 * the store's once-per-run rule keeps its skips from counting twice.
 */
import * as Effect from "effect/Effect"
import { randomUUID } from "node:crypto"
import { CurrentRun } from "../domain/Batch.ts"
import { lockedTooOften, type SkipCount } from "../domain/LockedRows.ts"
import { LockedRows } from "../services/LockedRows.ts"
import { logIds } from "./RepairLoop.ts"

export type RowId = string | number

export interface LockedRowTally {
  /**
   * A unit met `rows` and skipped `locked` of them (those another transaction held). Returns how
   * many of `locked` this run had not skipped before: what the unit adds to `skippedLocked`.
   */
  readonly unit: (rows: ReadonlyArray<RowId>, locked: ReadonlyArray<RowId>) => Effect.Effect<number>
  /** The run met every candidate: every counted row it did not skip is forgotten. */
  readonly complete: Effect.Effect<void>
}

/**
 * The tally of one run attempt of `batch`; skipped rows are logged as `message` with their ids
 * under `key` (e.g. `build_ids`; a warning names one under the singular, `build_id`).
 */
export const lockedRowTally = (batch: string, key: string, message: string) =>
  Effect.gen(function*() {
    const run = yield* CurrentRun
    const store = yield* LockedRows
    // A bare run (a spec) has no run id: each tally is a run of its own.
    const runId = run.runId ?? randomUUID()
    /** Rows this attempt skipped: counted once in `skippedLocked`, never forgotten by `complete`. */
    const skipped = new Set<string>()
    /** A count that cannot be read or written fails nothing: `fallback` instead, logged at debug. */
    const quietly = <A, E>(what: string, effect: Effect.Effect<A, E>, fallback: A): Effect.Effect<A> =>
      effect.pipe(
        Effect.tapError((error) => Effect.logDebug(`Could not ${what} locked rows`, error)),
        Effect.orElseSucceed(() => fallback)
      )
    /** The rows counted before this attempt, read once (only if a unit gets past some row, or at the end). */
    const counted = yield* Effect.cached(
      Effect.map(quietly("read", store.counted(batch), []), (ids) => new Set(ids))
    )
    /** Forgets the rows among `ids` that have a count; taken out of `counted` before the write. */
    const forget = (ids: ReadonlyArray<string>) =>
      Effect.gen(function*() {
        if (ids.length === 0) return
        const known = yield* counted
        const gone = ids.filter((id) => known.has(id) || skipped.has(id))
        if (gone.length === 0) return
        for (const id of gone) known.delete(id)
        yield* quietly("forget", store.passed(batch, gone), undefined)
      })
    const singular = key.replace(/s$/, "")

    const unit = (rows: ReadonlyArray<RowId>, locked: ReadonlyArray<RowId>) =>
      Effect.gen(function*() {
        if (run.dryRun) return 0
        const held = new Set(locked.map(String))
        yield* forget(rows.map(String).filter((id) => !held.has(id)))
        if (locked.length === 0) return 0
        yield* logIds(message, key, locked)
        const unknown: ReadonlyArray<SkipCount> = locked.map(() => ({ runs: 0, first: true }))
        const counts = yield* quietly("count", store.skipped(batch, runId, locked), unknown)
        let firstTime = 0
        locked.forEach((id, i) => {
          if (counts[i]?.first !== false && !skipped.has(String(id))) firstTime++
          skipped.add(String(id))
        })
        for (const { id, runs } of lockedTooOften(locked, counts)) {
          yield* Effect.logWarning("Row skipped as locked by another transaction run after run", {
            [singular]: id,
            runs
          })
        }
        return firstTime
      })

    const complete = Effect.gen(function*() {
      if (run.dryRun) return
      yield* forget([...(yield* counted)].filter((id) => !skipped.has(id)))
    })

    return { unit, complete } satisfies LockedRowTally
  })
