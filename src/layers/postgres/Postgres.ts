/**
 * The PostgreSQL client: a real server from `DATABASE_URL`, or an embedded PGlite under
 * `<SWEEPER_DATA_DIR>/pgdata` served to @effect/sql-pg over loopback TCP. PGlite is one process's
 * database: a lock file keeps a second Sweeper process from opening the same data directory.
 * PGlite and its socket server are imported only when the embedded database is opened: a process
 * on a real server (DATABASE_URL) never loads them (an idle supervisor loads only what its
 * backends need).
 */
import { PgClient } from "@effect/sql-pg"
import type { PGLiteSocketServer } from "@electric-sql/pglite-socket"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type * as Redacted from "effect/Redacted"
import * as Schema from "effect/Schema"
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import type { Server, Socket } from "node:net"
import { join } from "node:path"
import type { DatabaseTimeouts } from "../../config/Config.ts"

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

/** The session settings of `timeouts` as startup parameters, in ms; a zero one is not sent. */
export const timeoutParameters = (timeouts: DatabaseTimeouts): Readonly<Record<string, string>> =>
  Object.fromEntries(
    ([
      ["statement_timeout", timeouts.statement],
      ["lock_timeout", timeouts.lock],
      ["idle_in_transaction_session_timeout", timeouts.idleInTransaction]
    ] as const)
      .filter(([, duration]) => Duration.toMillis(duration) > 0)
      .map(([name, duration]) => [name, `${Math.ceil(Duration.toMillis(duration))}ms`])
  )

/**
 * A PostgreSQL server's client. Sweeper's own connections to GitLab's databases pass the configured
 * `timeouts`, sent in every session's startup packet; without them (tests, benchmarks) the
 * server's defaults apply.
 */
export const layerServer = (url: Redacted.Redacted<string>, timeouts?: DatabaseTimeouts) =>
  PgClient.layer({
    url,
    maxConnections: 10,
    startupParameters: {
      ...sessionDefaults.startupParameters,
      ...(timeouts === undefined ? {} : timeoutParameters(timeouts))
    }
  })

/** Whether a process with this pid is running (signal 0 checks without signalling). */
export const isAlive = (pid: number) => {
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
      const holder = Number.parseInt(
        (() => {
          try {
            return readFileSync(lockFile, "utf8")
          } catch {
            return ""
          }
        })(),
        10
      )
      if (Number.isInteger(holder) && holder !== process.pid && isAlive(holder)) {
        return yield* new EmbeddedDatabaseBusy({ dataDir, pid: holder })
      }
      writeFileSync(lockFile, String(process.pid))
      return lockFile
    }),
    (lockFile) => Effect.sync(() => rmSync(lockFile, { force: true }))
  )

/**
 * Every socket the socket server accepts, until it closes. `PGLiteSocketServer.stop()` waits for
 * all of them, but one accepted just before `stop()` and handed to it just after (the client's
 * connect racing a SIGTERM during start-up) it only `end()`s: with the client's startup message
 * still unread that socket never closes, and `stop()` would wait forever.
 */
const trackSockets = (server: PGLiteSocketServer) => {
  const sockets = new Set<Socket>()
  // The net.Server is private to pglite-socket (pinned version); without it we only lose the fix.
  const net = (server as unknown as { readonly server?: Server | null }).server
  net?.on("connection", (socket: Socket) => {
    sockets.add(socket)
    socket.once("close", () => sockets.delete(socket))
  })
  return sockets
}

/**
 * The embedded PostgreSQL's settings beyond PGlite's own. Its shared buffers live in the
 * WebAssembly memory, which never shrinks, so every buffer page ever touched stays resident: at
 * PostgreSQL's default 128 MB an embedded supervisor settled near 480 MB RSS, at 16 MB about 240 MB
 * less (measured). Sweeper's own tables on the embedded default are small; 16 MB holds them.
 */
const EMBEDDED_SETTINGS = ["-c", "shared_buffers=16MB"]

/** An embedded PostgreSQL; `dataDir` undefined keeps it in memory (specs, benchmarks). */
export const layerEmbedded = (dataDir: string | undefined) =>
  Layer.unwrap(Effect.gen(function*() {
    if (dataDir !== undefined) yield* lockDataDir(dataDir)
    const { server } = yield* Effect.acquireRelease(
      Effect.tryPromise({
        try: async () => {
          const [{ PGlite }, { PGLiteSocketServer }] = await Promise.all([
            import("@electric-sql/pglite"),
            import("@electric-sql/pglite-socket")
          ])
          const db = await PGlite.create(dataDir === undefined ? undefined : join(dataDir, "pgdata"), {
            startParams: [...PGlite.defaultStartParams, ...EMBEDDED_SETTINGS]
          })
          // Exactly one connection: PGlite interleaves protocol messages of concurrent connections.
          const socketServer = new PGLiteSocketServer({ db, host: "127.0.0.1", port: 0, maxConnections: 1 })
          await socketServer.start()
          return { db, server: socketServer, sockets: trackSockets(socketServer) }
        },
        catch: (cause) => new EmbeddedDatabaseError({ dataDir: dataDir ?? "(memory)", cause })
      }),
      (opened) =>
        Effect.promise(async () => {
          // stop() stops accepting and closes the sockets its handlers read; the ones no handler
          // reads (turned away) only close if destroyed.
          const stopped = opened.server.stop()
          for (const socket of opened.sockets) if (socket.listenerCount("data") === 0) socket.destroy()
          await stopped
          await opened.db.close()
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
