/**
 * The operator's HTTP surface (127.0.0.1 by default): /healthz, /readyz (PostgreSQL and Redis
 * reachable), /metrics (Prometheus text), /api/batches (JSON), / (a small dashboard), and the
 * mutating actions POST /api/batches/:name/{run,pause,resume}, which need SWEEPER_API_TOKEN.
 */
import { NodeHttpServer } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { DateTime, Duration, Effect, Layer, Metric, Option, Redacted } from "effect"
import { HttpRouter, HttpServerRequest, HttpServerResponse } from "effect/http"
import { createServer } from "node:http"
import { SweeperConfig } from "../layers/Config.ts"
import { RedisStores } from "../layers/Redis.ts"
import { prometheusText, setGauge } from "../services/Metrics.ts"
import { type BatchSnapshot, Scheduler } from "./Scheduler.ts"

export const lastSuccessAgeSeconds = Metric.gauge("sweeper_last_success_age_seconds", {
  description: "Seconds since each batch's last successful run (absent until its first success)"
})

const CHECK_TIMEOUT = Duration.seconds(2)

const batchJson = (snapshot: BatchSnapshot) => ({
  name: snapshot.name,
  worker: snapshot.worker,
  description: snapshot.description,
  cron: snapshot.cron,
  timezone: snapshot.timezone,
  state: snapshot.status,
  nextTick: snapshot.nextTick?.toISOString() ?? null,
  lastRun: snapshot.history.lastRun === undefined ? null : {
    runId: snapshot.history.lastRun.runId,
    outcome: snapshot.history.lastRun.outcome,
    finishedAt: snapshot.history.lastRun.finishedAt.toISOString(),
    durationMs: snapshot.history.lastRun.durationMs,
    summary: snapshot.history.lastRun.summary
  },
  lastOutcome: snapshot.history.lastRun?.outcome ?? null,
  lastSuccessAt: snapshot.history.lastSuccessAt?.toISOString() ?? null,
  consecutiveFailures: snapshot.history.consecutiveFailures
})

const escapeHtml = (text: string) =>
  text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", "\"": "&quot;", "'": "&#39;" })[c]!)

const dashboard = (snapshots: ReadonlyArray<BatchSnapshot>) => `<!doctype html>
<html><head><meta charset="utf-8"><title>Sweeper</title><meta http-equiv="refresh" content="10">
<style>body{font:14px system-ui,sans-serif;margin:2em}table{border-collapse:collapse}td,th{padding:.3em .8em;border-bottom:1px solid #ddd;text-align:left}
.succeeded{color:#070}.failed,.timed_out{color:#b00}.skipped{color:#777}</style></head><body>
<h1>Sweeper</h1><table><tr><th>batch</th><th>cron</th><th>state</th><th>next tick</th><th>last run</th><th>outcome</th><th>summary</th></tr>
${snapshots.map((s) => {
  const last = s.history.lastRun
  return `<tr><td title="${escapeHtml(s.description)}">${escapeHtml(s.name)}</td><td><code>${escapeHtml(s.cron)}</code> ${escapeHtml(s.timezone)}</td><td>${s.status}</td><td>${s.nextTick?.toISOString() ?? ""}</td><td>${last?.finishedAt.toISOString() ?? "never"}</td><td class="${last?.outcome ?? ""}">${last?.outcome ?? ""}</td><td><code>${escapeHtml(JSON.stringify(last?.summary ?? null))}</code></td></tr>`
}).join("\n")}
</table><p><a href="/api/batches">/api/batches</a> · <a href="/metrics">/metrics</a> · <a href="/readyz">/readyz</a></p></body></html>`

export const Routes = HttpRouter.use(Effect.fn(function*(router) {
  const scheduler = yield* Scheduler
  const settings = yield* SweeperConfig
  const sql = yield* PgClient.PgClient
  const stores = yield* Effect.serviceOption(RedisStores)

  const check = <E>(probe: Effect.Effect<unknown, E>) =>
    probe.pipe(
      Effect.timeoutOption(CHECK_TIMEOUT),
      Effect.map(Option.match({ onNone: () => "timeout", onSome: () => "ok" })),
      Effect.catchCause(() => Effect.succeed("unreachable"))
    )

  const authorized = (
    action: (name: string, request: HttpServerRequest.HttpServerRequest) => Effect.Effect<HttpServerResponse.HttpServerResponse>
  ) =>
    Effect.gen(function*() {
      const request = yield* HttpServerRequest.HttpServerRequest
      const { name } = yield* HttpRouter.params
      if (Option.isNone(settings.apiToken)) {
        return HttpServerResponse.jsonUnsafe({ error: "mutating API disabled: set SWEEPER_API_TOKEN" }, { status: 403 })
      }
      if (request.headers["authorization"] !== `Bearer ${Redacted.value(settings.apiToken.value)}`) {
        return HttpServerResponse.jsonUnsafe({ error: "unauthorized" }, { status: 401 })
      }
      return yield* action(name ?? "", request)
    })

  const unknown = (error: { readonly name: string; readonly known: ReadonlyArray<string> }) =>
    Effect.succeed(HttpServerResponse.jsonUnsafe({ error: `unknown batch ${error.name}`, known: error.known }, { status: 404 }))

  yield* router.add("GET", "/healthz", HttpServerResponse.text("ok\n"))
  yield* router.add("GET", "/readyz", Effect.gen(function*() {
    // Every GitLab store is pinged (SPEC §8.2): a batch needs all three, so one down is not ready.
    const [postgres, storeStatus] = yield* Effect.all([
      check(sql`SELECT 1`),
      Option.match(stores, {
        onNone: () => Effect.succeed(undefined),
        onSome: (all) =>
          Effect.forEach(all, ({ store, redis }) =>
            Effect.map(check(redis.use("ping", (client) => client.ping())), (status) => [store, { status, kind: redis.kind }] as const), {
            concurrency: "unbounded"
          }).pipe(Effect.map((entries) => Object.fromEntries(entries)))
      })
    ], { concurrency: 2 })
    const storeStatuses = storeStatus === undefined ? [] : Object.values(storeStatus).map((entry) => entry.status)
    const redisStatus = storeStatus === undefined ? "ok (in-memory)" : storeStatuses.find((status) => status !== "ok") ?? "ok"
    const ready = postgres === "ok" && redisStatus.startsWith("ok")
    return HttpServerResponse.jsonUnsafe(
      { ready, postgres, redis: redisStatus, ...(storeStatus === undefined ? {} : { redisStores: storeStatus }) },
      { status: ready ? 200 : 503 }
    )
  }))
  yield* router.add("GET", "/metrics", Effect.gen(function*() {
    const now = DateTime.toEpochMillis(yield* DateTime.now)
    for (const snapshot of yield* scheduler.snapshots) {
      const success = snapshot.history.lastSuccessAt
      if (success !== undefined) yield* setGauge(lastSuccessAgeSeconds, (now - success.getTime()) / 1000, { batch: snapshot.name })
    }
    return HttpServerResponse.text(yield* prometheusText, { contentType: "text/plain; version=0.0.4; charset=utf-8" })
  }))
  yield* router.add("GET", "/api/batches", Effect.map(scheduler.snapshots, (all) => HttpServerResponse.jsonUnsafe(all.map(batchJson))))
  yield* router.add("GET", "/", Effect.map(scheduler.snapshots, (all) => HttpServerResponse.html(dashboard(all))))
  yield* router.add("POST", "/api/batches/:name/run", authorized((name) =>
    scheduler.runNow(name).pipe(
      Effect.map((result) => HttpServerResponse.jsonUnsafe(result)),
      Effect.catchTag("UnknownBatch", unknown)
    )))
  yield* router.add("POST", "/api/batches/:name/pause", authorized((name) =>
    scheduler.pause(name, "http").pipe(
      Effect.as(HttpServerResponse.jsonUnsafe({ paused: name })),
      Effect.catchTag("UnknownBatch", unknown)
    )))
  yield* router.add("POST", "/api/batches/:name/resume", authorized((name) =>
    scheduler.resume(name, "http").pipe(
      Effect.as(HttpServerResponse.jsonUnsafe({ resumed: name })),
      Effect.catchTag("UnknownBatch", unknown)
    )))
}))

/** The HTTP server on SWEEPER_HTTP_HOST:SWEEPER_HTTP_PORT (port 0 picks a free port). */
export const HttpLive = Layer.unwrap(Effect.gen(function*() {
  const settings = yield* SweeperConfig
  return HttpRouter.serve(Routes, { disableListenLog: true, disableLogger: true }).pipe(
    Layer.provideMerge(NodeHttpServer.layer(createServer, { port: settings.httpPort, host: settings.httpHost }))
  )
}))
