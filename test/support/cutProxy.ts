/**
 * A loopback TCP proxy that cuts its server off at an exact point of a client's conversation: the
 * n-th time a client sends `pattern` (e.g. one Redis command in RESP form), that chunk is dropped,
 * every connection is destroyed and the proxy stops listening, so every reconnect is refused
 * (ECONNREFUSED, as from a server that is down) until `restore`. Cutting at a command rather than
 * after some milliseconds puts the outage at the same point of a run on an idle and on a loaded
 * machine. (Accepting and closing each reconnect instead would not do: ioredis counts a connect
 * that succeeds as a recovery and would wait forever instead of failing the command.)
 *
 * Counting assumes `pattern` does not straddle two TCP chunks, which holds for short commands a
 * client writes in one `write` (ioredis writes each command whole).
 */
import { Effect } from "effect"
import { type AddressInfo, connect, createServer, type Socket } from "node:net"

export interface CutProxy {
  /** The proxy's port on 127.0.0.1. */
  readonly port: number
  /** Cut at the `occurrence`-th (1-based, counted from now) chunk that contains `pattern`. */
  readonly cutOn: (pattern: Buffer, occurrence: number) => void
  /** Resolves once the cut has happened. */
  readonly cut: Promise<void>
  /** Listen on the same port and forward connections again. */
  readonly restore: () => Promise<void>
}

/** The RESP bytes a client sends for a command of bulk strings, e.g. `resp("get", key)` (ioredis sends names in lower case). */
export const resp = (...parts: ReadonlyArray<string>): Buffer =>
  Buffer.from(`*${parts.length}\r\n${parts.map((p) => `$${Buffer.byteLength(p)}\r\n${p}\r\n`).join("")}`)

/** A proxy to `target` (host:port on loopback) for the current scope. */
export const cutProxy = (target: { readonly host: string; readonly port: number }) =>
  Effect.acquireRelease(
    Effect.promise(() =>
      new Promise<{ proxy: CutProxy; close: () => Promise<void> }>((resolve) => {
        const sockets = new Set<Socket>()
        let down = false
        let watch: { pattern: Buffer; remaining: number } | undefined
        let cutDone: () => void = () => {}
        const cut = new Promise<void>((r) => (cutDone = r))
        const track = (socket: Socket) => {
          sockets.add(socket)
          socket.on("close", () => sockets.delete(socket))
          socket.on("error", () => {})
        }
        const goDown = () => {
          down = true
          server.close()
          for (const socket of sockets) socket.destroy()
          cutDone()
        }
        const server = createServer((client) => {
          track(client)
          const upstream = connect(target.port, target.host)
          track(upstream)
          client.on("data", (chunk: Buffer) => {
            if (watch !== undefined && chunk.includes(watch.pattern) && --watch.remaining === 0) {
              watch = undefined
              goDown()
              return
            }
            if (!down) upstream.write(chunk)
          })
          upstream.on("data", (chunk: Buffer) => {
            if (!down) client.write(chunk)
          })
          client.on("close", () => upstream.destroy())
          upstream.on("close", () => client.destroy())
        })
        server.listen(0, "127.0.0.1", () => {
          const { port } = server.address() as AddressInfo
          resolve({
            proxy: {
              port,
              cutOn: (pattern, occurrence) => (watch = { pattern, remaining: occurrence }),
              cut,
              restore: () =>
                new Promise<void>((listening) => {
                  down = false
                  server.listen(port, "127.0.0.1", () => listening())
                })
            },
            close: () =>
              new Promise<void>((done) => {
                for (const socket of sockets) socket.destroy()
                if (server.listening) server.close(() => done())
                else done()
              })
          })
        })
      })
    ),
    ({ close }) => Effect.promise(close)
  ).pipe(Effect.map(({ proxy }) => proxy))
