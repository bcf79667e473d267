/**
 * One migrated database per test run, which every PgTest database is cloned from (CREATE DATABASE
 * … TEMPLATE): migrating each from empty costs ≈ 40 statements and index builds, a clone none of
 * them, and the suite makes over a hundred. Dropped when the run ends. Where it cannot be made (no
 * server, a migration that fails) PgTest migrates each database itself, so its tests say why.
 */
import { PgClient } from "@effect/sql-pg"
import { Effect, Redacted } from "effect"
import { randomBytes } from "node:crypto"
import { migrate } from "../../src/layers/postgres/Migrations.ts"
import { layerServer } from "../../src/layers/postgres/Postgres.ts"
import { adminUrl, databaseUrl, TEMPLATE_VARIABLE } from "./postgres.ts"

const admin = (statement: string) =>
  Effect.flatMap(PgClient.PgClient, (sql) => sql.unsafe(statement)).pipe(
    Effect.provide(PgClient.layer({ url: Redacted.make(adminUrl), maxConnections: 1 }))
  )

export default async function migratedTemplate() {
  const name = `sweeper_tpl_${randomBytes(6).toString("hex")}`
  const made = await Effect.runPromiseExit(Effect.gen(function*() {
    yield* admin(`CREATE DATABASE ${name}`)
    yield* Effect.scoped(Effect.provide(migrate, layerServer(Redacted.make(databaseUrl(name)))))
    // A clone needs its template without sessions: nothing may connect to it from here on.
    yield* admin(`ALTER DATABASE ${name} WITH ALLOW_CONNECTIONS false`)
  }))
  if (made._tag === "Success") process.env[TEMPLATE_VARIABLE] = name
  return () => Effect.runPromise(Effect.ignore(admin(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)))
}
