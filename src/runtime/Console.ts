/**
 * The console's pages and services, registered on the HTTP router beside the JSON API:
 *
 *   GET /                  every batch as a card, with its backlog and, while it runs, its progress
 *   GET /batches/:name     a batch: its card, configuration, history charts (?window=24h|7d|30d), runs
 *   GET /runs/:id          a run: outcome, trigger, node, timings, summary, error, holds, and its
 *                          repairs paged by keyset (?type=…&after=<event id>)
 *   GET /favicon.svg, /favicon.ico
 *   + the ConsoleApi group (/api/runs/:id, /api/batches/:name/history, /api/backlog)
 *
 * `ConsoleServices` builds RunHistory on PostgreSQL and the Backlog sampler on the Redis in use
 * (real stores, or the embedded in-memory one).
 */
import { DateTime, Effect, Layer, Option, Schedule } from "effect"
import { HttpRouter, HttpServerRequest, HttpServerResponse } from "effect/http"
import { describeError } from "../domain/Errors.ts"
import { RunHistorySql } from "../layers/postgres/RunHistorySql.ts"
import { Backlog, type BacklogSnapshot } from "../services/Backlog.ts"
import { EventLog } from "../services/EventLog.ts"
import { HealthReport } from "../services/HealthReport.ts"
import { RunHistory } from "../services/RunHistory.ts"
import { BacklogLive } from "./Backlog.ts"
import { snapshotView } from "./BatchView.ts"
import { isWindow } from "./Charts.ts"
import { positiveInteger, readHistory, readRun } from "./ConsoleApi.ts"
import { batchPage, type CardView, dashboardPage, FAVICON, runPage } from "./Dashboard.ts"
import { liveRun } from "./LiveProgress.ts"
import { recentRuns } from "./Runs.ts"
import { type BatchSnapshot, Scheduler } from "./Scheduler.ts"

const DEFAULT_EVENTS = 100
const BATCH_PAGE_RUNS = 50

/** A batch as the console shows it: the shared view, its live run and its last backlog sample. */
export const cardView = (snapshot: BatchSnapshot, now: Date, backlog: BacklogSnapshot | undefined): CardView => ({
  ...snapshotView(snapshot, now),
  live: snapshot.status === "running" ? liveRun(snapshot.name) : null,
  backlog: (() => {
    const mine = backlog?.batches.find((b) => b.batch === snapshot.name)
    return mine === undefined ? undefined : { ...mine, sampledAt: backlog!.sampledAt }
  })()
})

/** Every batch's card view now (what `/api/batches` and `/api/stream` send, and the pages draw). */
export const consoleViews = Effect.gen(function*() {
  const scheduler = yield* Scheduler
  const backlog = yield* Effect.serviceOption(Backlog)
  const now = DateTime.toDateUtc(yield* DateTime.now)
  const sample = Option.isSome(backlog) ? yield* backlog.value.current : undefined
  return (yield* scheduler.snapshots).map((s) => cardView(s, now, sample))
})

const html = (page: string, status = 200) =>
  HttpServerResponse.text(page, { contentType: "text/html; charset=utf-8", status })

export const ConsolePages = HttpRouter.use(Effect.fn(function*(router) {
  const scheduler = yield* Scheduler
  const events = yield* EventLog
  const health = yield* HealthReport
  const context = yield* Effect.context<RunHistory | Backlog | Scheduler>()
  const query = Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    return new URL(request.url, "http://sweeper").searchParams
  })
  const views = consoleViews.pipe(Effect.provideService(Scheduler, scheduler))
  /** A page that fails shows one line, never a stack: the store error's description. */
  const page = <E, R>(effect: Effect.Effect<HttpServerResponse.HttpServerResponse, E, R>) =>
    effect.pipe(
      Effect.provideService(EventLog, events),
      Effect.provideContext(context),
      Effect.catchCause((cause) =>
        Effect.succeed(
          html(`<!doctype html><title>Error</title><p>${describeError(cause).replace(/</g, "&lt;")}</p>`, 500)
        )
      )
    ) as Effect.Effect<
      HttpServerResponse.HttpServerResponse,
      never,
      Exclude<R, EventLog | RunHistory | Backlog | Scheduler>
    >

  const favicon = HttpServerResponse.text(FAVICON, {
    contentType: "image/svg+xml",
    headers: { "cache-control": "max-age=86400" }
  })
  yield* router.add("GET", "/favicon.svg", Effect.succeed(favicon))
  yield* router.add("GET", "/favicon.ico", Effect.succeed(favicon))

  yield* router.add(
    "GET",
    "/",
    page(Effect.gen(function*() {
      const stream = ((yield* query).get("stream") ?? "").trim().slice(0, 500)
      const found = stream === "" ? [] : yield* events.query({ stream, newestFirst: true, limit: DEFAULT_EVENTS })
      return html(
        dashboardPage(yield* views, { stream, events: found, holds: (yield* health.snapshot).holds.map((h) => h.text) })
      )
    }))
  )

  yield* router.add(
    "GET",
    "/batches/:name",
    page(Effect.gen(function*() {
      const { name } = yield* HttpRouter.params
      const view = (yield* views).find((v) => v.name === name)
      if (view === undefined) {
        return html(
          `<!doctype html><title>Unknown batch</title><p>unknown batch ${(name ?? "").replace(/</g, "&lt;")}</p>`,
          404
        )
      }
      const requested = (yield* query).get("window") ?? "24h"
      const window = isWindow(requested) ? requested : "24h"
      const history = yield* readHistory(view.name, window)
      return html(batchPage(view, yield* recentRuns({ batch: view.name, limit: BATCH_PAGE_RUNS }), history))
    }))
  )

  yield* router.add(
    "GET",
    "/runs/:id",
    page(Effect.gen(function*() {
      const { id } = yield* HttpRouter.params
      const params = yield* query
      const type = params.get("type") || undefined
      const after = positiveInteger(params.get("after")) ?? undefined
      const found = yield* readRun(id ?? "", { type, after })
      if (found === null) {
        return html(`<!doctype html><title>No such run</title><p>no run ${(id ?? "").replace(/</g, "&lt;")}</p>`, 404)
      }
      return html(runPage(found.run, found.page, { type: found.type, after }))
    }))
  )
}))

export const ConsoleServices = Layer.mergeAll(RunHistorySql, BacklogLive)

/**
 * A run changes what waits: the backlog is sampled again as soon as any batch's last run changes
 * (checked each second, from the scheduler's memory), so a card never shows the builds its run just
 * dropped for the rest of the 30 s period. Still a timer, never a read per request.
 */
export const BacklogAfterRuns = Layer.effectDiscard(Effect.gen(function*() {
  const scheduler = yield* Scheduler
  const backlog = yield* Backlog
  let last = ""
  const check = Effect.gen(function*() {
    const runs = (yield* scheduler.snapshots).map((s) => s.history.lastRun?.runId ?? "").join(",")
    if (last !== "" && runs !== last) yield* backlog.refresh
    last = runs
  })
  yield* Effect.forkScoped(Effect.repeat(check, Schedule.spaced("1 second")))
}))

/** The pages, for `HttpRouter.serve` (given ConsoleServices); the JSON group is in SweeperApi (Api.ts). */
export const ConsoleRoutes = Layer.mergeAll(ConsolePages, BacklogAfterRuns)
