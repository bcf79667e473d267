/**
 * Fenced SQL writes. Inside the write's transaction, record the run's lease epoch in
 * `sweeper_lease_fences` unless a newer epoch is already there; if one is, a newer holder has
 * written since our lease expired and this write must not happen (LeaseLost rolls it back). Runs
 * without a lease (no fence in CurrentRun) write unfenced.
 */
import { PgClient } from "@effect/sql-pg"
import { Effect, Option } from "effect"
import { CurrentRun } from "../domain/Batch.ts"
import { LeaseLost } from "../domain/Errors.ts"

export const fenceWrite = Effect.fnUntraced(function*(sql: PgClient.PgClient) {
  const run = yield* CurrentRun
  if (Option.isNone(run.fence)) return
  const { lease, epoch } = run.fence.value
  yield* run.fence.value.check
  const accepted = yield* sql`
    INSERT INTO sweeper_lease_fences (name, epoch) VALUES (${lease}, ${epoch})
    ON CONFLICT (name) DO UPDATE SET epoch = EXCLUDED.epoch
    WHERE sweeper_lease_fences.epoch <= EXCLUDED.epoch
    RETURNING epoch`
  if (accepted.length === 0) return yield* new LeaseLost({ lease, epoch })
})
