/**
 * Counts, across runs, how many runs in a row skipped each row because another transaction held
 * it (`domain/LockedRows.ts` says what counts). A diagnostic, not a repair: where no backend is
 * provided (a bare spec, a benchmark harness) the default keeps nothing, so no caller has to
 * provide it.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import type { RedisError } from "../domain/Errors.ts"
import type { SkipCount } from "../domain/LockedRows.ts"

export interface LockedRowsService {
  /** The ids of the batch's rows that have a count now: a run reads them once to forget those it gets past. */
  readonly counted: (batch: string) => Effect.Effect<ReadonlyArray<string>, RedisError>
  /**
   * A skip of each row by `run`: counted once per run (a second skip in the same run, a revisited
   * page or a retried attempt, counts nothing), the count refreshed. Returns each row's runs in a
   * row and whether this was the run's first skip of it, in the order given.
   */
  readonly skipped: (
    batch: string,
    run: string,
    ids: ReadonlyArray<string | number>
  ) => Effect.Effect<ReadonlyArray<SkipCount>, RedisError>
  /** Forgets the rows a run got past: repaired, or no longer a candidate. */
  readonly passed: (batch: string, ids: ReadonlyArray<string | number>) => Effect.Effect<void, RedisError>
}

export const LockedRows = Context.Reference<LockedRowsService>("sweeper/services/LockedRows", {
  defaultValue: () => ({
    counted: () => Effect.succeed([]),
    skipped: (_, __, ids) => Effect.succeed(ids.map(() => ({ runs: 0, first: true }))),
    passed: () => Effect.void
  })
})
