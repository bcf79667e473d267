/** Migration 0007 (standalone only): the stuck-builds family's column and indexes on ci_builds. */
import * as Effect from "effect/Effect"
import * as SqlClient from "effect/sql/SqlClient"
import { OWNERSHIP_TABLE } from "../DatabaseSchema.ts"

/**
 * The stuck-builds family on Sweeper's own ci_builds (standalone: embedded, demos, tests): the
 * delayed builds' scheduled_at that drop-scheduled-builds reads, and one partial index per status
 * the family walks, in its keyset order, so each walk reads only its own rows. GitLab's databases
 * have their own columns and indexes and are never touched (doctor judges their scans).
 */
export const stuckBuildsFamily = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const owned = yield* sql<{ n: string }>`SELECT count(*) AS n FROM ${sql(OWNERSHIP_TABLE)}
    WHERE table_name = 'ci_builds'`
  if (Number(owned[0]?.n ?? 0) === 0) return
  yield* sql`ALTER TABLE ci_builds ADD COLUMN IF NOT EXISTS scheduled_at timestamptz NULL`
  for (const status of ["pending", "running", "scheduled"]) {
    yield* sql.unsafe(`CREATE INDEX IF NOT EXISTS index_ci_builds_${status}_on_created_at_project_id_id
      ON ci_builds (created_at, project_id, id) WHERE status = '${status}' AND type = 'Ci::Build'`)
  }
})
