/**
 * The console's event stream over a real HTTP server: a client that stops reading cannot make the
 * supervisor hold its frames, nor its stream slot, for longer than the write timeout.
 */
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Layer } from "effect"
import { HttpRouter, HttpServer } from "effect/http"
import { createServer } from "node:http"
import { connect } from "node:net"
import { eventStream, makeConsoleFeed } from "../../src/http/Console.ts"

const MB = 1024 * 1024
const rssMb = () => Math.round(process.memoryUsage().rss / MB)

/** Polls `check` every 100 ms until it holds or `seconds` pass; whether it held. */
const eventually = (check: () => Effect.Effect<boolean>, seconds: number) =>
  Effect.gen(function*() {
    for (let i = 0; i < seconds * 10; i++) {
      if (yield* check()) return true
      yield* Effect.sleep("100 millis")
    }
    return false
  })

describe("console event stream", () => {
  it.live(
    "a client that stops reading is disconnected after the write timeout and its slot is freed",
    () =>
      Effect.gen(function*() {
        // A reading that changes every period and renders large frames: a busy console, quickly.
        let change = 0
        const filler = "x".repeat(256 * 1024)
        const read = Effect.sync(() => ({ views: [], holds: [`change ${change++} ${filler}`] }))
        const feed = yield* makeConsoleFeed(read, { maxStreams: 1, period: "20 millis" })
        const server = yield* Layer.build(
          HttpRouter.serve(HttpRouter.add("GET", "/api/stream", eventStream(feed, { writeTimeout: "1 second" })), {
            disableListenLog: true,
            disableLogger: true
          }).pipe(Layer.provideMerge(NodeHttpServer.layer(createServer, { port: 0, host: "127.0.0.1" })))
        )
        const { address } = Context.get(server, HttpServer.HttpServer)
        const port = address._tag === "UnixPathAddress" ? 0 : address.port
        const before = rssMb()

        // Sends its request, then never reads a byte of the answer.
        yield* Effect.acquireRelease(
          Effect.sync(() => {
            const socket = connect(port, "127.0.0.1")
            socket.write(`GET /api/stream HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n\r\n`)
            socket.pause()
            return socket
          }),
          (socket) => Effect.sync(() => socket.destroy())
        )
        assert.isTrue(yield* eventually(() => Effect.map(feed.clients, (n) => n === 1), 10), "the stream opened")
        const freed = yield* eventually(() => Effect.map(feed.clients, (n) => n === 0), 30)
        const during = rssMb()
        console.log(`stalled stream: RSS ${before} MB before, ${during} MB after; ${change} frames of 512 kB rendered`)
        assert.isTrue(freed, "the stalled client still holds its stream slot")

        // The slot is free for the next client, which is served.
        const response = yield* Effect.promise(() => fetch(`http://127.0.0.1:${port}/api/stream`))
        assert.strictEqual(response.status, 200)
        const reader = response.body!.getReader()
        const first = yield* Effect.promise(() => reader.read())
        assert.include(new TextDecoder().decode(first.value), "retry:")
        yield* Effect.promise(() => reader.cancel())
      }).pipe(Effect.scoped),
    60_000
  )
})
