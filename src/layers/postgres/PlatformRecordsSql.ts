/** PlatformRecords on PostgreSQL: one primary-key look-up per table and call. */
import { PgClient } from "@effect/sql-pg"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { PlatformRecords } from "../../services/PlatformRecords.ts"

/** The primary-key look-up (exported so `sweeper doctor` EXPLAINs the exact text). */
export const existingIdsQuery = (
  sql: PgClient.PgClient,
  table: "namespaces" | "projects",
  ids: ReadonlyArray<number>
) => sql<{ readonly id: string | number }>`SELECT id FROM ${sql(table)} WHERE ${sql.in("id", ids)} ORDER BY id`

export const PlatformRecordsSql = Layer.effect(
  PlatformRecords,
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient

    const existing = (table: "namespaces" | "projects") =>
      Effect.fnUntraced(function*(ids: ReadonlyArray<number>) {
        if (ids.length === 0) return []
        const rows = yield* existingIdsQuery(sql, table, ids)
        // bigint ids come back as strings; the ids asked about are safe integers, so Number is exact.
        return rows.map((row) => Number(row.id))
      })
    const namespaces = existing("namespaces")
    const projects = existing("projects")

    return PlatformRecords.of({
      existingNamespaceIds: Effect.fn("PlatformRecords.existingNamespaceIds")(function*(ids: ReadonlyArray<number>) {
        return yield* namespaces(ids)
      }),
      existingProjectIds: Effect.fn("PlatformRecords.existingProjectIds")(function*(ids: ReadonlyArray<number>) {
        return yield* projects(ids)
      })
    })
  })
)
