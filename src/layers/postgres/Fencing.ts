/**
 * Fenced SQL writes. Inside the write's transaction, record the run's lease epoch in
 * `sweeper_lease_fences` unless a newer epoch is already there; if one is, a newer holder has
 * written since our lease expired and this write must not happen (LeaseLost rolls it back). Runs
 * without a lease (no fence in CurrentRun) write unfenced.
 */
import { PgClient } from "@effect/sql-pg"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { CurrentRun } from "../../domain/Batch.ts"
import { LeaseLost } from "../../domain/Errors.ts"

/**
 * The longest a fence write waits for the lease's fence row. Only
 * writers of the same lease lock that row, each for one statement or one short transaction that
 * waits on nothing else (their row writes skip locked rows), so a wait past this means another
 * holder's connection hangs mid-transaction (a stopped process, a partition): the write fails with
 * PostgreSQL's lock timeout (55P03, retried by the run guard as transient, within its budget)
 * instead of waiting until that connection dies. Set with `set_config(…, true)` in the statement
 * itself, so it lasts for the write's own transaction and costs no round trip.
 */
export const FENCE_LOCK_TIMEOUT = Duration.seconds(5)

/**
 * The fence as three CTEs, the last named `fenced`: one row when the write may happen, none when a
 * newer holder has written. Why two paths: a holder's writes (two pages of a run in flight at once)
 * would queue behind each other on the fence row if each took its exclusive lock. So a write whose
 * epoch is already recorded takes only a share lock on the row (`fence_held`): same-epoch writes
 * share it, and a newer holder's upsert, which locks it exclusively, waits for them to commit (and
 * they for it: re-checked on its new version, the row no longer has their epoch). Only a write with
 * a newer epoch, or the lease's first, upserts (`fence_bumped`). Both bounded by the lock timeout.
 */
const fenceCtes = (sql: PgClient.PgClient, lease: string, epoch: number) => {
  const timeout = `${Duration.toMillis(FENCE_LOCK_TIMEOUT)}ms`
  const bounded = sql`(SELECT set_config('lock_timeout', ${timeout}, true)) AS bounded`
  return sql`fence_held AS (
      SELECT f.epoch FROM ${bounded}, sweeper_lease_fences f
      WHERE f.name = ${lease}::text AND f.epoch = ${epoch}::bigint FOR SHARE OF f),
    fence_bumped AS (
      INSERT INTO sweeper_lease_fences (name, epoch)
      SELECT ${lease}::text, ${epoch}::bigint FROM ${bounded} WHERE NOT EXISTS (SELECT FROM fence_held)
      ON CONFLICT (name) DO UPDATE SET epoch = EXCLUDED.epoch
      WHERE sweeper_lease_fences.epoch <= EXCLUDED.epoch
      RETURNING epoch),
    fenced AS (SELECT epoch FROM fence_held UNION ALL SELECT epoch FROM fence_bumped)`
}

export const fenceWrite = Effect.fnUntraced(function*(sql: PgClient.PgClient) {
  const run = yield* CurrentRun
  if (Option.isNone(run.fence)) return
  const { lease, epoch } = run.fence.value
  yield* run.fence.value.check
  const accepted = yield* sql`WITH ${fenceCtes(sql, lease, epoch)} SELECT epoch FROM fenced`
  if (accepted.length === 0) return yield* new LeaseLost({ lease, epoch })
})

/**
 * The fence for a write that is ONE statement (data-modifying CTEs, autocommit): the same check,
 * as the statement's first CTEs (`WITH ${fence.ctes}, …`), the last named `fenced`. It yields one
 * row when the write may happen (our epoch recorded, or no fence at all) and none when a newer
 * holder has written; the statement guards each of its writes with `EXISTS (SELECT FROM fenced)`
 * and reports `(SELECT count(*) FROM fenced)`, and the caller fails with `lost` when that is 0
 * (nothing was written). One round trip for fence, write and events instead of BEGIN, fence,
 * write, events, COMMIT.
 */
export const fencedCte = Effect.fnUntraced(function*(sql: PgClient.PgClient) {
  const run = yield* CurrentRun
  if (Option.isNone(run.fence)) return { ctes: sql`fenced AS (SELECT 1 AS epoch)`, lost: Option.none<LeaseLost>() }
  const { lease, epoch } = run.fence.value
  yield* run.fence.value.check
  return {
    ctes: fenceCtes(sql, lease, epoch),
    lost: Option.some(new LeaseLost({ lease, epoch }))
  }
})
