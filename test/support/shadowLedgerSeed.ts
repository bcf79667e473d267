/**
 * A shadow ledger with one of each verdict for drop-canceling-builds, as reconciles leave it, for
 * the console's shadow view tests: three matched, one mismatched, one sweeperOnly whose entity and
 * facts are hostile HTML, one ignored, one still waiting, and a matched one judged two days ago
 * (in the week, not the day).
 */
import { PgClient } from "@effect/sql-pg"
import * as Effect from "effect/Effect"

export const HOSTILE = "<img src=x onerror=alert(1)>\"'</script>"
export const HOSTILE_ENTITY = `build:${HOSTILE}`

const HOUR = 3600_000

export const seedShadowLedger = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  const now = Date.now()
  const row = (
    entity: string,
    verdict: string | null,
    settledAgoMs: number,
    observed: Record<string, unknown> | null,
    facts: Record<string, unknown> = { status: "canceling", updated_at: "2026-11-20T10:00:00.000Z" }
  ) => {
    const proposed = new Date(now - settledAgoMs - 2 * HOUR)
    return sql`INSERT INTO sweeper_shadow_candidates
      (batch, entity, rule, outcome, facts, run_id, proposed_at, last_proposed_at, due_at, verdict, observed, settled_at)
      VALUES ('drop-canceling-builds', ${entity}, 'canceling', ${sql.json({ status: "failed", failure_reason: 3 })}, ${
      sql.json(facts)
    }, NULL, ${proposed}, ${proposed}, ${
      verdict === null ? new Date(now + HOUR) : new Date(proposed.getTime() + 75 * 60_000)
    }, ${verdict}, ${observed === null ? null : sql.json(observed)}, ${
      verdict === null ? null : new Date(now - settledAgoMs)
    })`
  }
  const failed = { status: "failed", failure_reason: 3 }
  yield* row("build:9001", "matched", 10 * 60_000, failed)
  yield* row("build:9002", "matched", 20 * 60_000, failed)
  yield* row("build:9003", "matched", 30 * 60_000, failed)
  yield* row("build:9004", "mismatched", 40 * 60_000, { status: "canceled", failure_reason: null })
  yield* row(HOSTILE_ENTITY, "sweeperOnly", 50 * 60_000, { status: "canceling", failure_reason: null }, {
    status: "canceling",
    note: HOSTILE
  })
  yield* row("build:9006", "ignored", 15 * 60_000, { status: "success", failure_reason: null })
  yield* row("build:9007", null, 0, null)
  yield* row("build:9008", "matched", 48 * HOUR, failed)
})
