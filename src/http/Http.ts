/**
 * The operator's HTTP surface (127.0.0.1 by default):
 *
 *   the JSON API (Api.ts's SweeperApi): /api/batches, /api/batches/:name, /api/runs, /api/events,
 *     POST /api/batches/:name/run, …/pause, …/resume — implemented below as HttpApiBuilder groups
 *   plain routes: /healthz, /readyz (PostgreSQL and Redis reachable), /metrics (Prometheus text),
 *     /api/health (the health gate: each signal's reading, thresholds and state; what holds which batch),
 *   GET  / (dashboard), /batches/:name, /runs/:id, /api/stream (SSE) and the console's JSON group: Console.ts
 *
 * POSTs need `Authorization: Bearer <SWEEPER_API_TOKEN>` (or the local token the supervisor
 * publishes in its data directory for the CLI), compared in constant time. Every error is JSON of
 * one shape: `{"error": {"code", "message"}}`.
 */
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import { PgClient } from "@effect/sql-pg"
import * as Cause from "effect/Cause"
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as HttpApiBuilder from "effect/http-api/HttpApiBuilder"
import * as HttpApiMiddleware from "effect/http-api/HttpApiMiddleware"
import * as HttpRouter from "effect/http/HttpRouter"
import * as HttpServerRequest from "effect/http/HttpServerRequest"
import * as HttpServerResponse from "effect/http/HttpServerResponse"
import * as Layer from "effect/Layer"
import * as Metric from "effect/Metric"
import * as Option from "effect/Option"
import * as Redacted from "effect/Redacted"
import * as Schema from "effect/Schema"
import { createHash, timingSafeEqual } from "node:crypto"
import { createRequire } from "node:module"
import { SweeperConfig } from "../config/Config.ts"
import { refusesLookAhead } from "../domain/Batch.ts"
import { describeError, type PauseNotRecorded } from "../domain/Errors.ts"
import { isRunId } from "../domain/Events.ts"
import { currentPeriod } from "../domain/Schedule.ts"
import { RedisStores } from "../layers/redis/Redis.ts"
import { Backlog } from "../services/Backlog.ts"
import { EventLog } from "../services/EventLog.ts"
import { HealthReport } from "../services/HealthReport.ts"
import {
  batchBreakerOpen,
  batchDisabled,
  batchPaused,
  batchPeriodSeconds,
  buildInfo,
  prometheusText,
  setGauge
} from "../services/Metrics.ts"
import { Scheduler } from "../supervisor/Scheduler.ts"
import { localToken } from "../supervisor/SupervisorAddress.ts"
import { snapshotView } from "../views/BatchView.ts"
import { recentRuns } from "../views/Runs.ts"
import { Authorized, ErrorShape, RunBody, SweeperApi } from "./Api.ts"
import { ConsoleRoutes, ConsoleServices, consoleViews } from "./Console.ts"
import { consoleHandlers } from "./ConsoleApi.ts"
import { HttpGuards, isBodyTooLarge, payloadTooLarge } from "./HttpGuards.ts"

// node:http through require, not `import`: its ESM namespace evaluates the lazy WebSocket export,
// which loads undici (fetch), never used here and held for the life of the process (idle RSS).
const { createServer } = createRequire(import.meta.url)("node:http") as typeof import("node:http")

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
  | "payload_too_large"
  | "misdirected"

const STATUS: Record<ErrorCode, number> = {
  unauthorized: 401,
  api_disabled: 403,
  unknown_batch: 404,
  batch_disabled: 409,
  bad_request: 400,
  not_found: 404,
  internal: 500,
  /** A store this action must write to refused (a pause that could not be recorded): nothing changed. */
  unavailable: 503,
  payload_too_large: 413,
  /** A Host that is not this server's (HttpGuards.ts). */
  misdirected: 421
}

/** The one error shape every endpoint answers with. */
export const apiError = (code: ErrorCode, message: string, extra: Record<string, unknown> = {}) =>
  HttpServerResponse.jsonUnsafe({ error: { code, message, ...extra } }, { status: STATUS[code] })

const digest = (text: string) => createHash("sha256").update(text, "utf8").digest()

/**
 * Constant-time token check: equal-length SHA-256 digests through timingSafeEqual, so neither the
 * comparison nor a length mismatch tells an attacker how much of a guess was right.
 */
export const tokenMatches = (presented: string, expected: string): boolean =>
  timingSafeEqual(digest(presented), digest(expected))

const instant = (value: string | null) => {
  if (value === null || value === "") {
    return Option.none<Date | undefined>().pipe(Option.orElse(() => Option.some(undefined)))
  }
  const date = new Date(value)
  return Number.isNaN(date.getTime()) || !/^\d{4}-\d{2}-\d{2}/.test(value)
    ? Option.none<Date | undefined>()
    : Option.some<Date | undefined>(date)
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
  const stores = yield* Effect.serviceOption(RedisStores)
  const health = yield* HealthReport

  const nowDate = Effect.map(DateTime.now, (now) => new Date(DateTime.toEpochMillis(now)))
  const check = <E>(probe: Effect.Effect<unknown, E>) =>
    probe.pipe(
      Effect.timeoutOption(CHECK_TIMEOUT),
      Effect.map(Option.match({ onNone: () => "timeout", onSome: () => "ok" })),
      Effect.catchCause(() => Effect.succeed("unreachable"))
    )

  yield* router.add("GET", "/healthz", HttpServerResponse.text("ok\n"))
  yield* router.add(
    "GET",
    "/readyz",
    Effect.gen(function*() {
      // Every GitLab store is pinged: a batch needs all three, so one down is not ready.
      const [postgres, storeStatus] = yield* Effect.all([
        check(sql`SELECT 1`),
        Option.match(stores, {
          onNone: () => Effect.void,
          onSome: (all) =>
            Effect.forEach(all, ({ store, redis }) =>
              Effect.map(
                check(redis.use("ping", (client) => client.ping())),
                (status) => [store, { status, kind: redis.kind }] as const
              ), {
              concurrency: "unbounded"
            }).pipe(Effect.map((entries) => Object.fromEntries(entries)))
        })
      ], { concurrency: 2 })
      const storeStatuses = storeStatus === undefined ? [] : Object.values(storeStatus).map((entry) => entry.status)
      const redisStatus = storeStatus === undefined
        ? "ok (in-memory)"
        : storeStatuses.find((status) => status !== "ok") ?? "ok"
      const ready = postgres === "ok" && redisStatus.startsWith("ok")
      return HttpServerResponse.jsonUnsafe(
        { ready, postgres, redis: redisStatus, ...(storeStatus === undefined ? {} : { redisStores: storeStatus }) },
        { status: ready ? 200 : 503 }
      )
    })
  )
  yield* setGauge(buildInfo, 1, { version: VERSION, node_version: process.version, node: settings.node })

  yield* router.add(
    "GET",
    "/metrics",
    Effect.gen(function*() {
      const scrapedAt = yield* nowDate
      const now = scrapedAt.getTime()
      for (const snapshot of yield* scheduler.snapshots) {
        const view = snapshotView(snapshot, scrapedAt)
        if (view.lastSuccessAt !== null) {
          yield* setGauge(lastSuccessAgeSeconds, (now - Date.parse(view.lastSuccessAt)) / 1000, { batch: view.name })
        }
        yield* setGauge(batchPaused, view.paused === null ? 0 : 1, { batch: view.name })
        yield* setGauge(batchDisabled, view.disabled ? 1 : 0, { batch: view.name })
        yield* setGauge(batchBreakerOpen, view.breaker.open ? 1 : 0, { batch: view.name })
        yield* setGauge(batchPeriodSeconds, Duration.toSeconds(currentPeriod(snapshot.cronSchedule, scrapedAt)), {
          batch: view.name
        })
      }
      // The process and runtime figures are read by the Metrics layer as it renders.
      return HttpServerResponse.text(yield* prometheusText, { contentType: "text/plain; version=0.0.4; charset=utf-8" })
    })
  )

  yield* router.add(
    "GET",
    "/api/health",
    Effect.map(health.snapshot, (snapshot) => HttpServerResponse.jsonUnsafe(snapshot))
  )
  // The pages (/, /batches/:name, /runs/:id) and the console's JSON group: ConsoleRoutes (Console.ts).
}))

/** Who paused: the `X-Sweeper-Actor` header (the CLI and dashboard send one), else "http". */
const byOf = (request: HttpServerRequest.HttpServerRequest) => {
  const actor = request.headers["x-sweeper-actor"]
  return typeof actor === "string" && /^[\w .:@-]{1,64}$/.test(actor) ? actor : "http"
}

/** A store that failed under a read: `internal`, with its cause, in the one error shape. */
const orInternal = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.catchCause(
    effect,
    (cause) => Effect.fail({ error: { code: "internal" as const, message: describeError(cause) } })
  )

const unknownBatch = (error: { readonly name: string; readonly known: ReadonlyArray<string> }) =>
  Effect.fail({
    error: { code: "unknown_batch" as const, message: `unknown batch "${error.name}"`, known: error.known }
  })

const badRequest = (message: string) => Effect.fail({ error: { code: "bad_request" as const, message } })

const notRecorded = (error: PauseNotRecorded) =>
  Effect.fail({ error: { code: "unavailable" as const, message: error.message } })

const asJson = (value: unknown): unknown => value === undefined ? undefined : JSON.parse(JSON.stringify(value))

const BatchesLive = HttpApiBuilder.group(
  SweeperApi,
  "batches",
  Effect.fnUntraced(function*(handlers) {
    const scheduler = yield* Scheduler
    const events = yield* EventLog
    const health = yield* HealthReport
    const context = yield* Effect.context<Backlog | Scheduler>()
    // Each batch's card view (its live run and backlog, Console.ts) with what the gate holds it on.
    const views = Effect.gen(function*() {
      const holds = (yield* health.snapshot).holds
      return (yield* consoleViews).map((view) => ({
        ...view,
        // As JSON has them (dates as ISO strings), which is what the schema's Unknown accepts.
        live: asJson(view.live),
        backlog: asJson(view.backlog),
        holds: holds.filter((hold) => hold.batch === view.name).map((hold) => hold.text)
      }))
    }).pipe(Effect.provideContext(context))
    const runs = (options: { readonly batch?: string | undefined; readonly limit: number }) =>
      orInternal(recentRuns(options).pipe(Effect.provideService(EventLog, events)))
    return handlers
      .handle("list", () => views)
      .handle("get", ({ params }) =>
        Effect.gen(function*() {
          const all = yield* views
          const view = all.find((v) => v.name === params.name)
          if (view === undefined) return yield* unknownBatch({ name: params.name, known: all.map((v) => v.name) })
          return { ...view, runs: yield* runs({ batch: view.name, limit: BATCH_PAGE_RUNS }) }
        }))
      .handle("runs", ({ query }) =>
        Effect.gen(function*() {
          const limit = integer(query.limit ?? null, BATCH_PAGE_RUNS, 500)
          if (Option.isNone(limit)) return yield* badRequest("limit: expected a positive integer")
          const names = (yield* scheduler.snapshots).map((s) => s.name)
          if (query.batch !== undefined && !names.includes(query.batch)) {
            return yield* unknownBatch({ name: query.batch, known: names })
          }
          return yield* runs({ batch: query.batch, limit: limit.value })
        }))
      .handle("events", ({ query }) =>
        Effect.gen(function*() {
          const since = instant(query.since ?? null)
          if (Option.isNone(since)) return yield* badRequest("since: expected an ISO-8601 instant")
          const until = instant(query.until ?? null)
          if (Option.isNone(until)) return yield* badRequest("until: expected an ISO-8601 instant")
          const limit = integer(query.limit ?? null, DEFAULT_EVENTS, MAX_EVENTS)
          if (Option.isNone(limit)) return yield* badRequest("limit: expected a positive integer")
          if (query.run !== undefined && query.run !== "" && !isRunId(query.run)) {
            return yield* badRequest(`run: expected a run id (a UUID), got ${JSON.stringify(query.run.slice(0, 80))}`)
          }
          const found = yield* orInternal(events.query({
            stream: query.stream || undefined,
            type: query.type || undefined,
            runId: query.run || undefined,
            since: since.value,
            until: until.value,
            newestFirst: true,
            limit: limit.value
          }))
          return found.map((e) => ({ ...e, occurredAt: e.occurredAt.toISOString() }))
        }))
  })
)

const ActionsLive = HttpApiBuilder.group(
  SweeperApi,
  "actions",
  Effect.fnUntraced(function*(handlers) {
    const scheduler = yield* Scheduler
    return handlers
      // Raw: the body is decoded here, so a POST with no body or no content-type (curl, the
      // dashboard's form) is read as JSON like before; the client sends `application/json`.
      .handleRaw("run", ({ params, request }) =>
        Effect.gen(function*() {
          // A body that cannot be read is refused, never taken for an empty one: an empty body means
          // a real run with the defaults, which is not what a client whose `{"dryRun": true}` was lost asked for.
          const read = yield* Effect.exit(request.text)
          if (Exit.isFailure(read)) {
            // One past the size limit (HttpGuards.ts) is refused as such: 413, not "could not be read".
            return yield* Option.exists(Cause.findErrorOption(read.cause), isBodyTooLarge)
              ? Effect.fail(payloadTooLarge)
              : badRequest("body: could not be read")
          }
          const text = read.value
          const decoded = text.trim() === ""
            ? Option.some({})
            : Schema.decodeUnknownOption(Schema.fromJsonString(RunBody))(text)
          if (Option.isNone(decoded)) {
            return yield* badRequest("body: expected {\"dryRun\"?: boolean, \"force\"?: boolean, \"now\"?: ISO-8601}")
          }
          const body: typeof RunBody.Type = decoded.value
          const asOf = instant(body.now ?? null)
          if (Option.isNone(asOf)) return yield* badRequest("now: expected an ISO-8601 instant")
          if (
            refusesLookAhead(asOf.value, new Date(DateTime.toEpochMillis(yield* DateTime.now)), body.dryRun === true)
          ) {
            return yield* badRequest("now: in the future; only a dry run may look ahead")
          }
          return yield* scheduler.runNow(params.name, { dryRun: body.dryRun, force: body.force, asOf: asOf.value })
            .pipe(
              Effect.catchTags({
                UnknownBatch: unknownBatch,
                BatchDisabled: (error) =>
                  Effect.fail({ error: { code: "batch_disabled" as const, message: error.message } })
              })
            )
        }))
      .handle("pause", ({ params, request }) =>
        scheduler.pause(params.name, byOf(request)).pipe(
          Effect.as({ paused: params.name }),
          Effect.catchTags({ UnknownBatch: unknownBatch, PauseNotRecorded: notRecorded })
        ))
      .handle("resume", ({ params, request }) =>
        scheduler.resume(params.name, byOf(request)).pipe(
          Effect.as({ resumed: params.name }),
          Effect.catchTags({ UnknownBatch: unknownBatch, PauseNotRecorded: notRecorded })
        ))
  })
)

/** A query or body the API's schema refuses: bad_request, naming the part of the request. */
const ErrorShapeLive = HttpApiMiddleware.layerSchemaErrorTransform(
  ErrorShape,
  (error) =>
    Effect.fail({
      error: {
        code: "bad_request" as const,
        message: `${error.kind.toLowerCase()}: ${error.cause.message.replace(/\s*\n\s*/g, " ")}`
      }
    })
)

/**
 * The bearer token of the mutating actions, checked before the body is read: SWEEPER_API_TOKEN or
 * this process's local token (the CLI beside an embedded supervisor reads it from the address
 * file), both compared in constant time.
 */
const AuthorizedLive = Layer.effect(
  Authorized,
  Effect.gen(function*() {
    const settings = yield* SweeperConfig
    return (httpEffect) =>
      Effect.gen(function*() {
        const request = yield* HttpServerRequest.HttpServerRequest
        const header = request.headers["authorization"] ?? ""
        const presented = header.startsWith("Bearer ") ? header.slice("Bearer ".length) : ""
        // Evaluate both so the time taken does not say which token exists.
        const local = tokenMatches(presented, localToken)
        const configured = Option.isSome(settings.apiToken) &&
          tokenMatches(presented, Redacted.value(settings.apiToken.value))
        if (local || configured) return yield* httpEffect
        return yield* Option.isNone(settings.apiToken)
          ? Effect.fail({
            error: { code: "api_disabled" as const, message: "mutating API disabled: set SWEEPER_API_TOKEN" }
          })
          : Effect.fail({ error: { code: "unauthorized" as const, message: "missing or wrong bearer token" } })
      })
  })
)

/** The JSON API: SweeperApi's groups (one `Layer.provide` entry per group) and its middleware. */
export const ApiLive = HttpApiBuilder.layer(SweeperApi).pipe(
  Layer.provide([BatchesLive, ActionsLive, HttpApiBuilder.group(SweeperApi, "console", consoleHandlers)]),
  Layer.provide([ErrorShapeLive, AuthorizedLive])
)

/** The HTTP server on SWEEPER_HTTP_HOST:SWEEPER_HTTP_PORT (port 0 picks a free port). */
export const HttpLive = Layer.unwrap(Effect.gen(function*() {
  const settings = yield* SweeperConfig
  return HttpRouter.serve(
    Layer.mergeAll(Routes, ApiLive, ConsoleRoutes, HttpGuards).pipe(Layer.provide(ConsoleServices)),
    {
      disableListenLog: true,
      disableLogger: true
    }
  ).pipe(
    Layer.provideMerge(NodeHttpServer.layer(createServer, { port: settings.httpPort, host: settings.httpHost }))
  )
}))
