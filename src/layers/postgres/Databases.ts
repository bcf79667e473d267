/**
 * GitLab's two database connections as Sweeper holds them. `PgClient` in the context is always
 * main's (Sweeper's own tables, main's GitLab tables); `CiDatabase` is the connection to GitLab's ci
 * database, which is main's own client when ci is not separate (CI_DATABASE_URL absent, or pointing
 * at the very database DATABASE_URL names). Layers of ci tables get `CiDatabase.sql` as their PgClient,
 * and `MainDatabase` when they must also reach main (the event outbox's relay).
 */
import { PgClient } from "@effect/sql-pg"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as SqlClient from "effect/sql/SqlClient"
import type { DatabaseName } from "../../domain/Databases.ts"

export class CiDatabase extends Context.Service<CiDatabase, {
  readonly sql: PgClient.PgClient
  /** True when ci is a database of its own; false when ci's tables are in main (one client). */
  readonly decomposed: boolean
}>()("sweeper/layers/postgres/CiDatabase") {}

/** Main's client under its own name, for code that runs where `PgClient` is ci's. */
export class MainDatabase extends Context.Service<MainDatabase, PgClient.PgClient>()(
  "sweeper/layers/postgres/MainDatabase"
) {}

/** What identifies a database across connections: its name on the server and the server's start. */
const identityOf = (sql: PgClient.PgClient) =>
  Effect.map(
    sql<{ readonly identity: string }>`SELECT current_database() || '@' || pg_postmaster_start_time()::text
      || ':' || current_setting('port') AS identity`,
    (rows) => rows[0]?.identity ?? ""
  )

/** Whether two clients reach the same database (CI_DATABASE_URL naming main's database another way). */
export const sameDatabase = (main: PgClient.PgClient, ci: PgClient.PgClient) =>
  Effect.map(Effect.all([identityOf(main), identityOf(ci)]), ([a, b]) => a === b)

/** ci = main: one client for both names. */
export const SingleDatabase = Layer.effect(
  CiDatabase,
  Effect.map(PgClient.PgClient, (sql) => CiDatabase.of({ sql, decomposed: false }))
)

/** main's client as MainDatabase (provided beside PgClient at the composition root). */
export const MainDatabaseLive = Layer.effect(MainDatabase, Effect.map(PgClient.PgClient, (sql) => sql))

/** The client of each of GitLab's databases: main's, and ci's (main's own when ci is not separate). */
export const databaseClients: Effect.Effect<
  Readonly<Record<DatabaseName, PgClient.PgClient>>,
  never,
  PgClient.PgClient | CiDatabase
> = Effect.gen(function*() {
  return { main: yield* PgClient.PgClient, ci: (yield* CiDatabase).sql }
})

/** Runs `effect` with `sql` as its PgClient and SqlClient (a ci-table query on ci's connection). */
export const onClient = (sql: PgClient.PgClient) => <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  effect.pipe(Effect.provideService(SqlClient.SqlClient, sql), Effect.provideService(PgClient.PgClient, sql))
