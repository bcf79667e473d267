/**
 * Real PostgreSQL for storage tests: every call makes a fresh database (migrated), dropped when the
 * scope closes, so test files never see each other's rows. The server is TEST_DATABASE_URL's
 * (default postgres://postgres@127.0.0.1:5432/test); tests fail, never skip, if it is unreachable.
 */
import { PgClient } from "@effect/sql-pg"
import { Context, Deferred, Effect, Fiber, Layer, Redacted } from "effect"
import { randomBytes } from "node:crypto"
import { migrate } from "../../src/layers/postgres/Migrations.ts"
import { layerServer } from "../../src/layers/postgres/Postgres.ts"

/**
 * Tests bound hangs, not connection speed: on a loaded 2-core CI machine a loopback connect once took
 * longer than @effect/sql-pg's default 5 s (a CI run failed on it, not on what its test checks), so
 * every test URL carries libpq's `connect_timeout` — read by the test process and, through
 * DATABASE_URL, by the CLI and supervisors it starts. A URL that already names one keeps its own.
 */
const patient = (url: URL) => {
  if (!url.searchParams.has("connect_timeout")) url.searchParams.set("connect_timeout", "30")
  return url.toString()
}

export const adminUrl = patient(new URL(process.env.TEST_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test"))

const admin = PgClient.layer({ url: Redacted.make(adminUrl), maxConnections: 1 })

export const databaseUrl = (name: string) => {
  const url = new URL(adminUrl)
  url.pathname = `/${name}`
  return patient(url)
}

/** The migrated database of this run PgTest's are cloned from (test/support/postgres.globalSetup.ts). */
export const TEMPLATE_VARIABLE = "SWEEPER_TEST_TEMPLATE_DATABASE"

/**
 * Creates a fresh database named `<prefix>_<random>`, empty or a copy of `template`; yields its
 * URL; drops it at scope close.
 */
export const freshDatabaseNamed = (prefix: string, template?: string) =>
  Effect.acquireRelease(
    Effect.gen(function*() {
      const name = `${prefix}_${randomBytes(6).toString("hex")}`
      const sql = yield* PgClient.PgClient
      yield* sql.unsafe(`CREATE DATABASE ${name}${template === undefined ? "" : ` TEMPLATE ${template}`}`)
      return { name, url: databaseUrl(name) }
    }).pipe(Effect.provide(admin)),
    ({ name }) =>
      Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        yield* sql.unsafe(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
      }).pipe(Effect.provide(admin), Effect.orDie)
  ).pipe(Effect.orDie)

/** Creates a fresh, empty database; yields its URL; drops it at scope close. */
export const freshDatabase = freshDatabaseNamed("sweeper_t")

export class TestDatabaseUrl extends Context.Service<TestDatabaseUrl, string>()("test/support/TestDatabaseUrl") {}

/**
 * PgClient (and SqlClient) on a fresh migrated database, plus its URL for child processes: a copy of
 * the run's migrated template where there is one, which `migrate` then finds up to date.
 */
export const PgTest = Layer.unwrap(Effect.gen(function*() {
  const { url } = yield* freshDatabaseNamed("sweeper_t", process.env[TEMPLATE_VARIABLE])
  return Layer.effectDiscard(migrate).pipe(
    Layer.provideMerge(layerServer(Redacted.make(url))),
    Layer.merge(Layer.succeed(TestDatabaseUrl, url)),
    Layer.orDie
  )
}))

/**
 * Holds rows locked as another client would: a connection of its own (not the pool under
 * test) runs `BEGIN; <lock>` and keeps the transaction open until the returned release runs, then
 * commits. `lock` is e.g. `SELECT 1 FROM ci_builds WHERE id IN (…) FOR UPDATE`.
 */
export const holdLocks = (lock: (sql: PgClient.PgClient) => Effect.Effect<unknown, unknown>) =>
  Effect.gen(function*() {
    const url = yield* TestDatabaseUrl
    const locked = yield* Deferred.make<void>()
    const release = yield* Deferred.make<void>()
    const holder = yield* Effect.gen(function*() {
      const other = yield* PgClient.PgClient
      yield* other.withTransaction(Effect.gen(function*() {
        yield* lock(other)
        yield* Deferred.succeed(locked, undefined)
        yield* Deferred.await(release)
      }))
    }).pipe(Effect.provide(layerServer(Redacted.make(url))), Effect.orDie, Effect.forkDetach)
    yield* Deferred.await(locked)
    return Deferred.succeed(release, undefined).pipe(Effect.andThen(Fiber.join(holder)), Effect.asVoid)
  })
