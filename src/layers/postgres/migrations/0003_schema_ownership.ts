/** Migration 0003: the record of the platform tables Sweeper created. */
import * as Effect from "effect/Effect"
import * as SqlClient from "effect/sql/SqlClient"
import { MIGRATIONS_TABLE, OWNERSHIP_TABLE } from "../DatabaseSchema.ts"
import { createOwnershipTable, PLATFORM_TABLES } from "./Ownership.ts"

/**
 * Databases migrated before the ownership record existed had their platform tables created by
 * migration 1: record them, so detection keeps calling such a database standalone.
 */
export const ownershipRecord = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* createOwnershipTable
  const owned = yield* sql<{ n: string }>`SELECT count(*) AS n FROM ${sql(OWNERSHIP_TABLE)}`
  if (Number(owned[0]?.n ?? 0) > 0) return
  const legacy = yield* sql<{ n: string }>`SELECT count(*) AS n FROM ${sql(MIGRATIONS_TABLE)} WHERE migration_id = 1`
  if (Number(legacy[0]?.n ?? 0) === 0) return
  for (const table of PLATFORM_TABLES) {
    yield* sql`INSERT INTO ${sql(OWNERSHIP_TABLE)} (table_name)
      SELECT ${table} WHERE to_regclass(${table}) IS NOT NULL ON CONFLICT DO NOTHING`
  }
})
