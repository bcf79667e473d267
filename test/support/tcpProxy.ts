/**
 * A loopback TCP proxy a test can cut: `refuse()` closes its port and every connection through it
 * (a client then gets ECONNREFUSED, as from a server that is down), `accept()` opens the same port
 * again. Put in front of PostgreSQL, it makes "the database refuses connections" without stopping
 * the shared server the other tests use.
 */
import { createConnection, createServer, type Server, type Socket } from "node:net"

export interface TcpProxy {
  readonly port: number
  readonly refuse: () => Promise<void>
  readonly accept: () => Promise<void>
}

const listen = (server: Server, port: number) =>
  new Promise<number>((resolve, reject) => {
    server.once("error", reject)
    server.listen(port, "127.0.0.1", () => {
      server.off("error", reject)
      resolve((server.address() as { port: number }).port)
    })
  })

export const startTcpProxy = async (targetPort: number, targetHost = "127.0.0.1"): Promise<TcpProxy> => {
  const open = new Set<Socket>()
  const server = createServer((client) => {
    const upstream = createConnection(targetPort, targetHost)
    for (const socket of [client, upstream]) {
      open.add(socket)
      socket.on("close", () => open.delete(socket))
      socket.on("error", () => {
        client.destroy()
        upstream.destroy()
      })
    }
    client.pipe(upstream)
    upstream.pipe(client)
  })
  const port = await listen(server, 0)
  return {
    port,
    refuse: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve())
        for (const socket of open) socket.destroy()
      }),
    accept: () => listen(server, port).then(() => undefined)
  }
}
