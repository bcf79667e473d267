/**
 * The operator's HTTP surface (127.0.0.1 by default):
 *
 *   GET  /healthz, /readyz (PostgreSQL and Redis reachable), /metrics (Prometheus text)
 *   GET  /api/batches, /api/batches/:name (with its last runs), /api/runs?batch=&limit=,
 *        /api/events?stream=&type=&run=&since=&limit=, /api/stream (SSE: batches as they change)
 *   POST /api/batches/:name/run ({"dryRun": true, "force": true}), …/pause, …/resume
 *   GET  / (dashboard), /batches/:name (a batch's page)
 *
 * POSTs need `Authorization: Bearer <SWEEPER_API_TOKEN>` (or the local token the supervisor
 * publishes in its data directory for the CLI), compared in constant time. Every error is JSON of
 * one shape: `{"error": {"code", "message"}}`.
 */
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import { PgClient } from "@effect/sql-pg"
import { DateTime, Duration, Effect, Layer, Metric, Option, Redacted, Schedule, Schema, Stream } from "effect"
import { HttpRouter, HttpServerRequest, HttpServerResponse } from "effect/http"
import { createHash, timingSafeEqual } from "node:crypto"
import { createServer } from "node:http"
import { monitorEventLoopDelay } from "node:perf_hooks"
import { refusesLookAhead } from "../domain/Batch.ts"
import { describeError } from "../domain/Errors.ts"
import { currentPeriod } from "../domain/Schedule.ts"
import { SweeperConfig } from "../layers/Config.ts"
import { RedisStores } from "../layers/Redis.ts"
import { EventLog } from "../services/EventLog.ts"
import {
  activeHandles,
  batchBreakerOpen,
  batchDisabled,
  batchPaused,
  batchPeriodSeconds,
  buildInfo,
  eventLoopLagSeconds,
  processCpuSecondsTotal,
  processHeapTotalBytes,
  processHeapUsedBytes,
  processResidentMemoryBytes,
  processStartTimeSeconds,
  prometheusText,
  setGauge
} from "../services/Metrics.ts"
import { batchPage, dashboardPage } from "./Dashboard.ts"
import { batchView, type BatchView } from "./BatchView.ts"
import { recentRuns } from "./Runs.ts"
import { type BatchSnapshot, Scheduler } from "./Scheduler.ts"
import { localToken } from "./SupervisorAddress.ts"

export const lastSuccessAgeSeconds = Metric.gauge("sweeper_last_success_age_seconds", {
  description: "Seconds since each batch's last successful run (absent until its first success)"
})

const CHECK_TIMEOUT = Duration.seconds(2)
/** package.json's version; reported in sweeper_build_info. */
const VERSION = "0.1.0"
const DEFAULT_EVENTS = 100
const MAX_EVENTS = 1000
const BATCH_PAGE_RUNS = 50

export type ErrorCode =
  | "unauthorized"
  | "api_disabled"
  | "unknown_batch"
  | "batch_disabled"
  | "bad_request"
  | "not_found"
  | "internal"
  | "unavailable"

const STATUS: Record<ErrorCode, number> = {
  unauthorized: 401,
  api_disabled: 403,
  unknown_batch: 404,
  batch_disabled: 409,
  bad_request: 400,
  not_found: 404,
  internal: 500,
  /** A store this action must write to refused (a pause that could not be recorded): nothing changed. */
  unavailable: 503
}

/** The one error shape every endpoint answers with. */
export const apiError = (code: ErrorCode, message: string, extra: Record<string, unknown> = {}) =>
  HttpServerResponse.jsonUnsafe({ error: { code, message, ...extra } }, { status: STATUS[code] })

const digest = (text: string) => createHash("sha256").update(text, "utf8").digest()

/**
 * Constant-time token check: equal-length SHA-256 digests through timingSafeEqual, so neither the
 * comparison nor a length mismatch tells an attacker how much of a guess was right.
 */
export const tokenMatches = (presented: string, expected: string): boolean => timingSafeEqual(digest(presented), digest(expected))

export const snapshotView = (snapshot: BatchSnapshot, now: Date): BatchView =>
  batchView({
    batch: snapshot.batch,
    cronText: snapshot.cron,
    cron: snapshot.cronSchedule,
    timezone: snapshot.timezone,
    running: snapshot.status === "running",
    disabled: snapshot.status === "disabled",
    history: snapshot.history
  }, now)

const RunBody = Schema.Struct({
  dryRun: Schema.optionalKey(Schema.Boolean),
  force: Schema.optionalKey(Schema.Boolean),
  /** `--now`: the ISO-8601 instant thresholds are judged at (`sweeper events prune --before` sends it). */
  now: Schema.optionalKey(Schema.String)
})

const instant = (value: string | null) => {
  if (value === null || value === "") return Option.none<Date | undefined>().pipe(Option.orElse(() => Option.some(undefined)))
  const date = new Date(value)
  return Number.isNaN(date.getTime()) || !/^\d{4}-\d{2}-\d{2}/.test(value) ? Option.none<Date | undefined>() : Option.some<Date | undefined>(date)
}

const integer = (value: string | null, fallback: number, max: number) => {
  if (value === null || value === "") return Option.some(fallback)
  if (!/^\d+$/.test(value)) return Option.none<number>()
  return Option.some(Math.max(1, Math.min(max, Number(value))))
}

export const Routes = HttpRouter.use(Effect.fn(function*(router) {
  const scheduler = yield* Scheduler
  const settings = yield* SweeperConfig
  const sql = yield* PgClient.PgClient
  const events = yield* EventLog
  const stores = yield* Effect.serviceOption(RedisStores)

  const nowDate = Effect.map(DateTime.now, (now) => new Date(DateTime.toEpochMillis(now)))
  const views = Effect.gen(function*() {
    const now = yield* nowDate
    return (yield* scheduler.snapshots).map((s) => snapshotView(s, now))
  })

  const check = <E>(probe: Effect.Effect<unknown, E>) =>
    probe.pipe(
      Effect.timeoutOption(CHECK_TIMEOUT),
      Effect.map(Option.match({ onNone: () => "timeout", onSome: () => "ok" })),
      Effect.catchCause(() => Effect.succeed("unreachable"))
    )

  const query = Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    return new URL(request.url, "http://sweeper").searchParams
  })

  /** Store errors become `internal` with their cause; nothing escapes as a bare 500. */
  const handled = <E, R>(effect: Effect.Effect<HttpServerResponse.HttpServerResponse, E, R>) =>
    effect.pipe(Effect.catchCause((cause) => Effect.succeed(apiError("internal", describeError(cause)))))

  const authorized = (
    action: (name: string, request: HttpServerRequest.HttpServerRequest) => Effect.Effect<HttpServerResponse.HttpServerResponse, unknown>
  ) =>
    handled(Effect.gen(function*() {
      const request = yield* HttpServerRequest.HttpServerRequest
      const { name } = yield* HttpRouter.params
      const header = request.headers["authorization"] ?? ""
      const presented = header.startsWith("Bearer ") ? header.slice("Bearer ".length) : ""
      // Evaluate both so the time taken does not say which token exists.
      const local = tokenMatches(presented, localToken)
      const configured = Option.isSome(settings.apiToken) && tokenMatches(presented, Redacted.value(settings.apiToken.value))
      if (!local && !configured) {
        return Option.isNone(settings.apiToken)
          ? apiError("api_disabled", "mutating API disabled: set SWEEPER_API_TOKEN")
          : apiError("unauthorized", "missing or wrong bearer token")
      }
      return yield* action(name ?? "", request)
    }))

  const unknownBatch = (error: { readonly name: string; readonly known: ReadonlyArray<string> }) =>
    Effect.succeed(apiError("unknown_batch", `unknown batch "${error.name}"`, { known: error.known }))

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
  const loopDelay = monitorEventLoopDelay({ resolution: 20 })
  loopDelay.enable()
  yield* Effect.addFinalizer(() => Effect.sync(() => loopDelay.disable()))
  yield* setGauge(buildInfo, 1, { version: VERSION, node_version: process.version, node: settings.node })
  yield* setGauge(processStartTimeSeconds, Math.round((Date.now() - process.uptime() * 1000) / 1000))

  yield* router.add("GET", "/metrics", Effect.gen(function*() {
    const scrapedAt = yield* nowDate
    const now = scrapedAt.getTime()
    for (const snapshot of yield* scheduler.snapshots) {
      const view = snapshotView(snapshot, scrapedAt)
      if (view.lastSuccessAt !== null) yield* setGauge(lastSuccessAgeSeconds, (now - Date.parse(view.lastSuccessAt)) / 1000, { batch: view.name })
      yield* setGauge(batchPaused, view.paused === null ? 0 : 1, { batch: view.name })
      yield* setGauge(batchDisabled, view.disabled ? 1 : 0, { batch: view.name })
      yield* setGauge(batchBreakerOpen, view.breaker.open ? 1 : 0, { batch: view.name })
      yield* setGauge(batchPeriodSeconds, Duration.toSeconds(currentPeriod(snapshot.cronSchedule, scrapedAt)), { batch: view.name })
    }
    // Process and runtime figures, read at scrape time.
    const memory = process.memoryUsage()
    const cpu = process.cpuUsage()
    yield* setGauge(processResidentMemoryBytes, memory.rss)
    yield* setGauge(processHeapUsedBytes, memory.heapUsed)
    yield* setGauge(processHeapTotalBytes, memory.heapTotal)
    yield* setGauge(processCpuSecondsTotal, (cpu.user + cpu.system) / 1e6)
    yield* setGauge(activeHandles, process.getActiveResourcesInfo().length)
    yield* setGauge(eventLoopLagSeconds, Number.isFinite(loopDelay.percentile(99)) ? loopDelay.percentile(99) / 1e9 : 0)
    loopDelay.reset()
    return HttpServerResponse.text(yield* prometheusText, { contentType: "text/plain; version=0.0.4; charset=utf-8" })
  }))

  yield* router.add("GET", "/api/batches", Effect.map(views, (all) => HttpServerResponse.jsonUnsafe(all)))
  yield* router.add("GET", "/api/batches/:name", handled(Effect.gen(function*() {
    const { name } = yield* HttpRouter.params
    const view = (yield* views).find((v) => v.name === name)
    if (view === undefined) return yield* unknownBatch({ name: name ?? "", known: (yield* views).map((v) => v.name) })
    return HttpServerResponse.jsonUnsafe({ ...view, runs: yield* recentRuns({ batch: view.name, limit: BATCH_PAGE_RUNS }) })
  }).pipe(Effect.provideService(EventLog, events))))
  yield* router.add("GET", "/api/runs", handled(Effect.gen(function*() {
    const params = yield* query
    const batch = params.get("batch") ?? undefined
    const limit = integer(params.get("limit"), BATCH_PAGE_RUNS, 500)
    if (Option.isNone(limit)) return apiError("bad_request", "limit: expected a positive integer")
    const names = (yield* scheduler.snapshots).map((s) => s.name)
    if (batch !== undefined && !names.includes(batch)) return yield* unknownBatch({ name: batch, known: names })
    return HttpServerResponse.jsonUnsafe(yield* recentRuns({ batch, limit: limit.value }))
  }).pipe(Effect.provideService(EventLog, events))))
  yield* router.add("GET", "/api/events", handled(Effect.gen(function*() {
    const params = yield* query
    const since = instant(params.get("since"))
    if (Option.isNone(since)) return apiError("bad_request", "since: expected an ISO-8601 instant")
    const until = instant(params.get("until"))
    if (Option.isNone(until)) return apiError("bad_request", "until: expected an ISO-8601 instant")
    const limit = integer(params.get("limit"), DEFAULT_EVENTS, MAX_EVENTS)
    if (Option.isNone(limit)) return apiError("bad_request", "limit: expected a positive integer")
    const found = yield* events.query({
      stream: params.get("stream") || undefined,
      type: params.get("type") || undefined,
      runId: params.get("run") || undefined,
      since: since.value,
      until: until.value,
      newestFirst: true,
      limit: limit.value
    })
    return HttpServerResponse.jsonUnsafe(found.map((e) => ({ ...e, occurredAt: e.occurredAt.toISOString() })))
  })))
  // Server-sent events: the batch views now, then again whenever they change (checked each second).
  yield* router.add("GET", "/api/stream", Effect.sync(() => {
    let last = ""
    const encoder = new TextEncoder()
    const changes = Stream.fromEffectSchedule(views, Schedule.spaced("1 second")).pipe(
      Stream.map((all) => JSON.stringify(all)),
      Stream.filter((json) => {
        const changed = json !== last
        last = json
        return changed
      }),
      Stream.map((json) => encoder.encode(`event: batches\ndata: ${json}\n\n`))
    )
    return HttpServerResponse.stream(changes, {
      contentType: "text/event-stream",
      headers: { "cache-control": "no-cache" }
    })
  }))

  yield* router.add("POST", "/api/batches/:name/run", authorized((name, request) =>
    Effect.gen(function*() {
      const text = yield* request.text
      const body = text.trim() === ""
        ? Option.some({} as typeof RunBody.Type)
        : Schema.decodeUnknownOption(Schema.fromJsonString(RunBody))(text)
      if (Option.isNone(body)) return apiError("bad_request", "body: expected {\"dryRun\"?: boolean, \"force\"?: boolean, \"now\"?: ISO-8601}")
      const asOf = instant(body.value.now ?? null)
      if (Option.isNone(asOf)) return apiError("bad_request", "now: expected an ISO-8601 instant")
      // As the CLI's `run --now`: a real run never judges at a future instant (it would repair too early).
      if (refusesLookAhead(asOf.value, new Date(DateTime.toEpochMillis(yield* DateTime.now)), body.value.dryRun === true)) {
        return apiError("bad_request", "now: in the future; only a dry run may look ahead")
      }
      return yield* scheduler.runNow(name, { dryRun: body.value.dryRun, force: body.value.force, asOf: asOf.value }).pipe(
        Effect.map((result) => HttpServerResponse.jsonUnsafe(result)),
        Effect.catchTags({
          UnknownBatch: unknownBatch,
          BatchDisabled: (error) => Effect.succeed(apiError("batch_disabled", error.message))
        })
      )
    })))
  yield* router.add("POST", "/api/batches/:name/pause", authorized((name, request) =>
    scheduler.pause(name, byOf(request)).pipe(
      Effect.as(HttpServerResponse.jsonUnsafe({ paused: name })),
      Effect.catchTags({ UnknownBatch: unknownBatch, PauseNotRecorded: (error) => Effect.succeed(apiError("unavailable", error.message)) })
    )))
  yield* router.add("POST", "/api/batches/:name/resume", authorized((name, request) =>
    scheduler.resume(name, byOf(request)).pipe(
      Effect.as(HttpServerResponse.jsonUnsafe({ resumed: name })),
      Effect.catchTags({ UnknownBatch: unknownBatch, PauseNotRecorded: (error) => Effect.succeed(apiError("unavailable", error.message)) })
    )))

  yield* router.add("GET", "/", handled(Effect.gen(function*() {
    const stream = ((yield* query).get("stream") ?? "").trim().slice(0, 500)
    const found = stream === "" ? [] : yield* events.query({ stream, newestFirst: true, limit: DEFAULT_EVENTS })
    const page = dashboardPage(yield* views, { stream, events: found })
    return HttpServerResponse.text(page, { contentType: "text/html; charset=utf-8" })
  })))
  yield* router.add("GET", "/batches/:name", handled(Effect.gen(function*() {
    const { name } = yield* HttpRouter.params
    const view = (yield* views).find((v) => v.name === name)
    if (view === undefined) return HttpServerResponse.text(`unknown batch ${name ?? ""}\n`, { status: 404 })
    const page = batchPage(view, yield* recentRuns({ batch: view.name, limit: BATCH_PAGE_RUNS }))
    return HttpServerResponse.text(page, { contentType: "text/html; charset=utf-8" })
  }).pipe(Effect.provideService(EventLog, events))))
}))

/** Who paused: the `X-Sweeper-Actor` header (the CLI and dashboard send one), else "http". */
const byOf = (request: HttpServerRequest.HttpServerRequest) => {
  const actor = request.headers["x-sweeper-actor"]
  return typeof actor === "string" && /^[\w .:@-]{1,64}$/.test(actor) ? actor : "http"
}

/** The HTTP server on SWEEPER_HTTP_HOST:SWEEPER_HTTP_PORT (port 0 picks a free port). */
export const HttpLive = Layer.unwrap(Effect.gen(function*() {
  const settings = yield* SweeperConfig
  return HttpRouter.serve(Routes, { disableListenLog: true, disableLogger: true }).pipe(
    Layer.provideMerge(NodeHttpServer.layer(createServer, { port: settings.httpPort, host: settings.httpHost }))
  )
}))
