import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { layerEmbedded } from "../../src/layers/postgres/Postgres.ts"

describe("the embedded PostgreSQL (PGlite)", () => {
  // Its shared buffers live in WebAssembly memory, which never shrinks: PostgreSQL's default 128 MB
  // kept an idle embedded supervisor near 480 MB RSS.
  it.live("runs with small shared buffers", () =>
    Effect.gen(function*() {
      const sql = yield* PgClient.PgClient
      const [row] = yield* sql<{ readonly shared_buffers: string }>`SHOW shared_buffers`
      assert.strictEqual(row!.shared_buffers, "16MB")
    }).pipe(Effect.provide(layerEmbedded(undefined))), 60_000)
})
