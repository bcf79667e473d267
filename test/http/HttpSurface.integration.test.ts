/**
 * What the HTTP surface refuses before any handler runs, on a real `sweeper start`: a Host that is
 * not the server's own (a DNS-rebinding page in the operator's browser would send its own name), a
 * body larger than a few KB (answered 413 without reading it); and the headers every page carries.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { request } from "node:http"
import { freshDatabase } from "../support/postgres.ts"
import { scopedSweeper } from "../support/processes.ts"
import { freshRedisUrl } from "../support/redis.ts"

const TOKEN = "surface-token"

interface Answer {
  readonly status: number
  readonly headers: Record<string, string | Array<string> | undefined>
  readonly body: string
}

/**
 * One request over a fresh connection with exactly these headers (fetch cannot set Host). `body`
 * chunks are written one by one while the answer has not come; `declaredLength` is sent as
 * Content-Length whatever is written. Fails when no answer comes within `seconds`.
 */
const call = (
  port: number,
  options: {
    readonly method?: string
    readonly path: string
    readonly headers?: Record<string, string>
    readonly body?: ReadonlyArray<string>
    readonly declaredLength?: number
    readonly seconds?: number
  }
) =>
  Effect.callback<Answer>((resume) => {
    let answered = false
    const req = request({
      host: "127.0.0.1",
      port,
      method: options.method ?? "GET",
      path: options.path,
      headers: {
        ...options.headers,
        ...(options.declaredLength === undefined ? {} : { "content-length": String(options.declaredLength) })
      },
      agent: false,
      setHost: options.headers?.host === undefined
    })
    const timer = setTimeout(() => {
      req.destroy()
      resume(Effect.die(new Error(`no answer to ${options.path} within ${options.seconds ?? 10} s`)))
    }, (options.seconds ?? 10) * 1000)
    req.on("response", (response) => {
      answered = true
      let body = ""
      response.on("data", (chunk: Buffer) => (body += chunk.toString()))
      response.on("end", () => {
        clearTimeout(timer)
        req.destroy()
        resume(Effect.succeed({ status: response.statusCode ?? 0, headers: response.headers, body }))
      })
    })
    req.on("error", (error) => {
      // A server that answers and closes while the body is still being sent: the answer counts.
      if (!answered) {
        clearTimeout(timer)
        resume(Effect.die(error))
      }
    })
    const chunks = [...(options.body ?? [])]
    const writeNext = () => {
      if (answered || req.destroyed) return
      const chunk = chunks.shift()
      if (chunk === undefined) {
        if (options.declaredLength === undefined) req.end()
        return
      }
      req.write(chunk, () => setTimeout(writeNext, 5))
    }
    writeNext()
  })

describe("HTTP surface guards", () => {
  it.live(
    "refuses foreign Hosts and large bodies, and sends the console's security headers",
    () =>
      Effect.gen(function*() {
        const db = yield* freshDatabase
        const redisUrl = yield* freshRedisUrl
        const sweeper = yield* scopedSweeper("surface", {
          DATABASE_URL: db.url,
          REDIS_URL: redisUrl,
          SWEEPER_API_TOKEN: TOKEN,
          SWEEPER_HTTP_ALLOWED_HOSTS: "sweeper.internal, Ops.Example.com"
        })
        const port = Number(new URL(yield* Effect.promise(() => sweeper.listening)).port)

        // The server's own names: its address, localhost, and those configured (any port, any case).
        for (const host of [`127.0.0.1:${port}`, `localhost:${port}`, "sweeper.internal", "ops.example.com:443"]) {
          const own = yield* call(port, { path: "/api/batches", headers: { host } })
          assert.strictEqual(own.status, 200, host)
        }
        // Anything else, as a page whose name was rebound to 127.0.0.1 would send it, reads nothing.
        for (
          const host of [
            `evil.example:${port}`,
            "127.0.0.1.evil.example",
            "sweeper.internal.evil.example",
            "localhost.evil"
          ]
        ) {
          for (const path of ["/api/batches", "/", "/api/stream", "/metrics"]) {
            const foreign = yield* call(port, { path, headers: { host } })
            assert.strictEqual(foreign.status, 421, `${host} ${path}`)
            assert.notInclude(foreign.body, "stuck-export-jobs")
          }
        }

        // Every console page: a policy that allows only its own script and styles, never framed, no referrer.
        const page = yield* call(port, { path: "/" })
        assert.strictEqual(page.status, 200)
        const policy = String(page.headers["content-security-policy"])
        for (const directive of ["default-src 'none'", "script-src 'self'", "frame-ancestors 'none'"]) {
          assert.include(policy, directive)
        }
        assert.strictEqual(page.headers["x-content-type-options"], "nosniff")
        assert.strictEqual(page.headers["referrer-policy"], "no-referrer")
        assert.strictEqual(page.headers["x-frame-options"], "DENY")

        const run = "/api/batches/stuck-export-jobs/run"
        const auth = { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" }
        // A small body is read as before.
        const dry = yield* call(port, { method: "POST", path: run, headers: auth, body: ["{\"dryRun\": true}"] })
        assert.strictEqual(dry.status, 200, dry.body)
        // A declared 50 MB is refused before a byte of it is read: only 1 KB is ever sent.
        const declared = yield* call(port, {
          method: "POST",
          path: run,
          headers: auth,
          body: ["x".repeat(1024)],
          declaredLength: 50 * 1024 * 1024,
          seconds: 5
        })
        assert.strictEqual(declared.status, 413, declared.body)
        assert.include(declared.body, "\"payload_too_large\"")
        // A chunked body with no length is refused once it passes the limit, not read to its end.
        const chunked = yield* call(port, {
          method: "POST",
          path: run,
          headers: { ...auth, "transfer-encoding": "chunked" },
          body: Array.from({ length: 2000 }, () => "y".repeat(16 * 1024)),
          seconds: 10
        })
        assert.strictEqual(chunked.status, 413, chunked.body)
        // Without the token a large body is still not read: 413 or 401, answered at once.
        const anonymous = yield* call(port, {
          method: "POST",
          path: run,
          body: ["x"],
          declaredLength: 50 * 1024 * 1024,
          seconds: 5
        })
        assert.include([401, 413], anonymous.status)
      }).pipe(Effect.scoped),
    150_000
  )
})
