/**
 * Counts, across runs, how often each row was skipped because another transaction held it. A
 * diagnostic, not a repair: where no backend is provided (a bare spec, a benchmark harness) the
 * default counts nothing, so no caller has to provide it.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import type { RedisError } from "../domain/Errors.ts"

export interface LockedRowsService {
  /**
   * Counts one more skip of each row (`domain/LockedRows.ts` keys and TTL, refreshed by the skip)
   * and returns each row's count so far, in the order given.
   */
  readonly skipped: (
    batch: string,
    ids: ReadonlyArray<string | number>
  ) => Effect.Effect<ReadonlyArray<number>, RedisError>
}

export const LockedRows = Context.Reference<LockedRowsService>("sweeper/services/LockedRows", {
  defaultValue: () => ({ skipped: () => Effect.succeed([]) })
})
