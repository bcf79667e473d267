/**
 * The PostgreSQL client: a real server from `DATABASE_URL`, or an embedded PGlite under
 * `<SWEEPER_DATA_DIR>/pgdata` served to @effect/sql-pg over loopback TCP. PGlite is one process's
 * database: a lock file keeps a second Sweeper process from opening the same data directory.
 */
import { PGlite } from "@electric-sql/pglite"
import { PGLiteSocketServer } from "@electric-sql/pglite-socket"
import { PgClient } from "@effect/sql-pg"
import { Effect, Layer, type Redacted, Schema } from "effect"
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { join } from "node:path"

export class EmbeddedDatabaseBusy extends Schema.TaggedError<EmbeddedDatabaseBusy>()("EmbeddedDatabaseBusy", {
  dataDir: Schema.String,
  pid: Schema.Number
}) {
  override get message() {
    return `the embedded database in ${this.dataDir} is open in process ${this.pid}; stop it or set DATABASE_URL`
  }
}

export class EmbeddedDatabaseError extends Schema.TaggedError<EmbeddedDatabaseError>()("EmbeddedDatabaseError", {
  dataDir: Schema.String,
  cause: Schema.Defect()
}) {}

const sessionDefaults = { startupParameters: { TimeZone: "UTC" } } as const

export const layerServer = (url: Redacted.Redacted<string>) =>
  PgClient.layer({ url, maxConnections: 10, ...sessionDefaults })

const isAlive = (pid: number) => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

const lockDataDir = (dataDir: string) =>
  Effect.acquireRelease(
    Effect.gen(function*() {
      mkdirSync(dataDir, { recursive: true })
      const lockFile = join(dataDir, "embedded.lock")
      const holder = Number.parseInt((() => {
        try {
          return readFileSync(lockFile, "utf8")
        } catch {
          return ""
        }
      })(), 10)
      if (Number.isInteger(holder) && holder !== process.pid && isAlive(holder)) {
        return yield* new EmbeddedDatabaseBusy({ dataDir, pid: holder })
      }
      writeFileSync(lockFile, String(process.pid))
      return lockFile
    }),
    (lockFile) => Effect.sync(() => rmSync(lockFile, { force: true }))
  )

/** An embedded PostgreSQL; `dataDir` undefined keeps it in memory (specs, benchmarks). */
export const layerEmbedded = (dataDir: string | undefined) =>
  Layer.unwrap(Effect.gen(function*() {
    if (dataDir !== undefined) yield* lockDataDir(dataDir)
    const { server } = yield* Effect.acquireRelease(
      Effect.tryPromise({
        try: async () => {
          const db = await PGlite.create(dataDir === undefined ? undefined : join(dataDir, "pgdata"))
          // Exactly one connection: PGlite interleaves protocol messages of concurrent connections.
          const server = new PGLiteSocketServer({ db, host: "127.0.0.1", port: 0, maxConnections: 1 })
          await server.start()
          return { db, server }
        },
        catch: (cause) => new EmbeddedDatabaseError({ dataDir: dataDir ?? "(memory)", cause })
      }),
      ({ db, server }) => Effect.promise(async () => {
        await server.stop()
        await db.close()
      })
    )
    const [host, port] = server.getServerConn().split(":")
    return PgClient.layer({
      host: host ?? "127.0.0.1",
      port: Number(port),
      username: "postgres",
      database: "postgres",
      maxConnections: 1,
      ...sessionDefaults
    })
  }))
