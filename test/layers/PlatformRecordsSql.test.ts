/** PlatformRecordsSql on a real PostgreSQL, and the memory implementation held to the same cases. */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { MemoryPlatformRecords, PlatformRecordsMemory } from "../../src/layers/memory/PlatformRecordsMemory.ts"
import { PlatformRecordsSql } from "../../src/layers/postgres/PlatformRecordsSql.ts"
import { PlatformRecords } from "../../src/services/PlatformRecords.ts"
import { PgTest } from "../support/postgres.ts"

/** Namespaces 1, 2, 9007199254740991 and projects 5, 6 exist. */
const seeded: Record<string, Layer.Layer<PlatformRecords>> = {
  sql: Layer.effectDiscard(Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    yield* sql`INSERT INTO namespaces (id, name, path) VALUES (1, 'a', 'a'), (2, 'b', 'b'), (9007199254740991, 'big', 'big')`
    yield* sql`INSERT INTO projects (id, namespace_id, name, path) VALUES (5, 1, 'p', 'p'), (6, 2, 'q', 'q')`
  })).pipe(Layer.provideMerge(PlatformRecordsSql), Layer.provideMerge(PgTest), Layer.orDie),
  memory: Layer.effectDiscard(Effect.gen(function*() {
    const state = yield* MemoryPlatformRecords
    for (const id of [1, 2, 9007199254740991]) state.namespaces.add(id)
    for (const id of [5, 6]) state.projects.add(id)
  })).pipe(Layer.provideMerge(PlatformRecordsMemory))
}

for (const [name, backend] of Object.entries(seeded)) {
  describe(`PlatformRecords (${name})`, () => {
    it.live("keeps only ids with a row, ascending, per table", () =>
      Effect.gen(function*() {
        const records = yield* PlatformRecords
        assert.deepStrictEqual(yield* records.existingNamespaceIds([9007199254740991, 5, 2, 1, 77]), [
          1,
          2,
          9007199254740991
        ])
        assert.deepStrictEqual(yield* records.existingProjectIds([1, 2, 6, 5]), [5, 6])
        assert.deepStrictEqual(yield* records.existingProjectIds([404]), [])
      }).pipe(Effect.provide(backend)))

    it.live("empty input: empty output", () =>
      Effect.gen(function*() {
        const records = yield* PlatformRecords
        assert.deepStrictEqual(yield* records.existingNamespaceIds([]), [])
        assert.deepStrictEqual(yield* records.existingProjectIds([]), [])
      }).pipe(Effect.provide(backend)))
  })
}
