/**
 * The console's pages and services, registered on the HTTP router beside the JSON API:
 *
 *   GET /                  every batch as a card, with its backlog and, while it runs, its progress
 *   GET /batches/:name     a batch: its card, configuration, history charts (?window=1h|24h|7d|30d;
 *                          by default the one its runs call for), runs
 *   GET /batches/:name/shadow  a batch in shadow mode beside GitLab's worker: agreement, counts
 *                          per verdict and the latest disagreements with their facts (?window=)
 *   GET /runs/:id          a run: outcome, trigger, node, timings, summary, error, holds, and its
 *                          repairs paged by keyset (?type=…&after=<event id>)
 *   GET /favicon.svg, /favicon.ico
 *   GET /api/stream        SSE: one shared feed of view changes (ConsoleFeed), heartbeats, capped
 *   GET /console/dashboard.js, /console/dashboard.css
 *   + the ConsoleApi group (/api/runs/:id, /api/batches/:name/history, /api/backlog)
 *
 * `ConsoleServices` builds RunHistory on PostgreSQL and the Backlog sampler on the Redis in use
 * (real stores, or the embedded in-memory one).
 */
import * as NodeHttpServerRequest from "@effect/platform-node/NodeHttpServerRequest"
import * as Cache from "effect/Cache"
import * as Context from "effect/Context"
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as HttpRouter from "effect/http/HttpRouter"
import * as HttpServerRequest from "effect/http/HttpServerRequest"
import * as HttpServerResponse from "effect/http/HttpServerResponse"
import * as Latch from "effect/Latch"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as PubSub from "effect/PubSub"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import * as Stream from "effect/Stream"
import { SweeperConfig } from "../config/Config.ts"
import { describeError } from "../domain/Errors.ts"
import { shadowCapable } from "../domain/Shadow.ts"
import { CiDatabase } from "../layers/postgres/Databases.ts"
import { RunHistorySql } from "../layers/postgres/RunHistorySql.ts"
import { Backlog, type BacklogSnapshot } from "../services/Backlog.ts"
import { EventLog } from "../services/EventLog.ts"
import { HealthReport } from "../services/HealthReport.ts"
import { RunHistory } from "../services/RunHistory.ts"
import type { ShadowLedger } from "../services/ShadowLedger.ts"
import { describePostgres } from "../supervisor/App.ts"
import { liveRun } from "../supervisor/LiveProgress.ts"
import { type BatchSnapshot, Scheduler } from "../supervisor/Scheduler.ts"
import { BacklogLive } from "../views/Backlog.ts"
import { snapshotView } from "../views/BatchView.ts"
import { recentRuns } from "../views/Runs.ts"
import { chooseWindow, isWindow, WINDOWS } from "./Charts.ts"
import { SCRIPT, SCRIPT_PATH, STYLE, STYLE_PATH } from "./console/assets.ts"
import { positiveInteger, readHistory, readRun, readShadow } from "./ConsoleApi.ts"
import {
  batchHistory,
  batchPage,
  card,
  type CardView,
  dashboardPage,
  FAVICON,
  holdsBanner,
  runPage
} from "./Dashboard.ts"
import { SHADOW_DEFAULT_WINDOW, shadowPage } from "./ShadowView.ts"

const DEFAULT_EVENTS = 100
const BATCH_PAGE_RUNS = 50

/** A batch as the console shows it: the shared view, its live run and its last backlog sample. */
export const cardView = (
  snapshot: BatchSnapshot,
  now: Date,
  backlog: BacklogSnapshot | undefined,
  decomposed = false
): CardView => ({
  ...snapshotView(snapshot, now, decomposed),
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
  // Every app composition has CiDatabase; a console built without one has one database.
  const decomposed = Option.exists(yield* Effect.serviceOption(CiDatabase), (ci) => ci.decomposed)
  return (yield* scheduler.snapshots).map((s) => cardView(s, now, sample, decomposed))
})

/** The most `/api/stream` connections served at once; one more is answered 503. */
export const MAX_STREAMS = 100
/** A comment line on every open stream this often, so proxies and browsers keep idle ones open. */
export const HEARTBEAT = "15 seconds"
/** How often the shared feed looks at the views (memory only: the scheduler, the backlog's last sample). */
const FEED_PERIOD = "1 second"

/**
 * One feed of view changes for every console client. A single fiber reads the views once a second,
 * and only when they differ from the last reading renders the SSE frames once: `batches` (the views
 * as JSON, for scripts) and `page` (each card's HTML and the holds banner, which the page script
 * swaps in). Each client's stream is the feed's PubSub: the current frames first, then each change.
 * So an open tab costs neither a read nor a render of its own, however many are open; and with no
 * tab open nothing is read at all: the fiber waits, and the first client's connection reads the
 * views before its stream starts (an idle supervisor otherwise built every card's view each second
 * for nobody, which kept its allocation, and its resident heap, growing).
 */
export class ConsoleFeed extends Context.Service<ConsoleFeed, {
  /** The SSE frames now, then every change; fails with `TooManyStreams` beyond MAX_STREAMS. */
  readonly open: Effect.Effect<Stream.Stream<Uint8Array>, TooManyStreams>
  /** Streams open now. */
  readonly clients: Effect.Effect<number>
}>()("sweeper/http/ConsoleFeed") {}

export class TooManyStreams extends Schema.TaggedError<TooManyStreams>()("TooManyStreams", {
  max: Schema.Number
}) {}

const encoder = new TextEncoder()

/** The frames of one reading: what every client is sent when the key changes. */
const frames = (views: ReadonlyArray<CardView>, holds: ReadonlyArray<string>) => {
  const page = { cards: Object.fromEntries(views.map((v) => [v.name, card(v)])), holds: holdsBanner(holds) }
  return encoder.encode(
    `event: batches\ndata: ${JSON.stringify(views)}\n\nevent: page\ndata: ${JSON.stringify(page)}\n\n`
  )
}

/** One reading of what the console shows: the views and the gate's holds. */
export interface ConsoleReading {
  readonly views: ReadonlyArray<CardView>
  readonly holds: ReadonlyArray<string>
}

/**
 * The feed over any reading (the views in the supervisor, a counting fake in tests): one fiber in
 * the caller's scope reads every FEED_PERIOD while at least one client is connected, whatever their
 * number, and not at all while none is.
 */
export const makeConsoleFeed = Effect.fnUntraced(function*(
  read: Effect.Effect<ConsoleReading>,
  options: {
    readonly maxStreams?: number | undefined
    /** How often the views are read while a client is connected (FEED_PERIOD). */
    readonly period?: Duration.Input | undefined
  } = {}
) {
  const maxStreams = options.maxStreams ?? MAX_STREAMS
  const period = options.period ?? FEED_PERIOD
  // Times inside the views (next ticks) move on their own; the key leaves out what only the clock
  // changed, so an idle console sends nothing until something happens.
  const keyOf = (reading: ConsoleReading) =>
    JSON.stringify([reading.views.map(({ nextTicks: _, ...rest }) => rest), reading.holds])
  let lastKey: string | undefined
  // Each frame is the whole state, so a client that reads slowly (or not at all) needs only the
  // newest: a sliding PubSub of one keeps that for each subscriber and drops what it has not taken
  // (an unbounded one kept every frame a stalled client missed). The replay is the current frames,
  // what a client connecting now is sent first.
  const latest = yield* PubSub.sliding<Uint8Array>({ capacity: 1, replay: 1 })
  yield* PubSub.publish(latest, encoder.encode(""))
  /** One reading; the frames are rendered and published only when it differs from the last. */
  const refresh = Effect.flatMap(read, (reading) => {
    const key = keyOf(reading)
    if (key === lastKey) return Effect.void
    lastKey = key
    return PubSub.publish(latest, frames(reading.views, reading.holds))
  })
  // Open while a client is connected: the reading fiber passes it before each period's read.
  const connected = yield* Latch.make(false)
  yield* Effect.forkScoped(Effect.forever(
    Latch.await(connected).pipe(Effect.andThen(Effect.sleep(period)), Effect.andThen(refresh))
  ))
  let open = 0
  const heartbeat = Stream.tick(HEARTBEAT).pipe(
    Stream.drop(1),
    Stream.map(() => encoder.encode(": heartbeat\n\n"))
  )
  const close = Effect.sync(() => {
    if (--open === 0) Latch.closeUnsafe(connected)
  })
  return ConsoleFeed.of({
    clients: Effect.sync(() => open),
    open: Effect.suspend(() => {
      if (open >= maxStreams) return Effect.fail(new TooManyStreams({ max: maxStreams }))
      if (open++ === 0) Latch.openUnsafe(connected)
      const stream = Stream.concat(
        Stream.make(encoder.encode("retry: 3000\n\n")),
        Stream.fromPubSub(latest).pipe(Stream.merge(heartbeat, { haltStrategy: "left" }))
      ).pipe(Stream.ensuring(close))
      // Read now, so the stream starts with the views as they are, not as they were when the last
      // client left (with clients already connected the frames are at most a period old anyway).
      return open === 1 ? refresh.pipe(Effect.onInterrupt(() => close), Effect.as(stream)) : Effect.succeed(stream)
    })
  })
})

export const ConsoleFeedLive = (options: { readonly maxStreams?: number } = {}) =>
  Layer.effect(
    ConsoleFeed,
    Effect.gen(function*() {
      const health = yield* HealthReport
      const context = yield* Effect.context<Backlog | Scheduler>()
      const read = Effect.gen(function*() {
        const views = yield* consoleViews.pipe(Effect.provideContext(context))
        return { views, holds: (yield* health.snapshot).holds.map((h) => h.text) }
      })
      return yield* makeConsoleFeed(read, options)
    })
  )

/**
 * How long a console stream may go without handing a byte to its client before the client is
 * dropped. A healthy stream writes at least every HEARTBEAT, so only a client that stopped reading
 * (its socket's buffers full, our write waiting) reaches it; dropping it ends its stream and frees
 * its slot, which it would otherwise hold for as long as its connection stayed open.
 */
export const WRITE_TIMEOUT = "45 seconds"

/**
 * Server-sent events: the shared feed's frames (ConsoleFeed), capped at its number of streams. The
 * write timeout is the socket's inactivity timeout (Node refreshes it as each write completes, not
 * when one is queued), so it is a bound on a write waiting for the client.
 */
export const eventStream = (feed: ConsoleFeed["Service"], options: { readonly writeTimeout?: Duration.Input } = {}) =>
  feed.open.pipe(
    Effect.tap(() =>
      Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) =>
        Effect.sync(() => {
          const response = NodeHttpServerRequest.toServerResponse(request)
          const timeout = Duration.toMillis(Duration.fromInputUnsafe(options.writeTimeout ?? WRITE_TIMEOUT))
          response.setTimeout(timeout, () => response.destroy())
        }))
    ),
    Effect.map((stream) =>
      HttpServerResponse.stream(stream, {
        contentType: "text/event-stream",
        headers: { "cache-control": "no-cache" }
      })
    ),
    Effect.catch((error) =>
      Effect.succeed(HttpServerResponse.jsonUnsafe({
        error: { code: "unavailable", message: `the console serves at most ${error.max} streams at once` }
      }, { status: 503, headers: { "retry-after": "10" } }))
    )
  )

const html = (page: string, status = 200) =>
  HttpServerResponse.text(page, { contentType: "text/html; charset=utf-8", status })

export const ConsolePages = HttpRouter.use(Effect.fn(function*(router) {
  const scheduler = yield* Scheduler
  const events = yield* EventLog
  const health = yield* HealthReport
  const context = yield* Effect.context<RunHistory | Backlog | Scheduler | ShadowLedger>()
  // Decomposed, the overview names both databases (as the start-up log does); one database, nothing.
  const ci = yield* Effect.serviceOption(CiDatabase)
  const databases = Option.exists(ci, (found) => found.decomposed) ? describePostgres(yield* SweeperConfig) : undefined
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
      Exclude<R, EventLog | RunHistory | Backlog | Scheduler | ShadowLedger>
    >

  const favicon = HttpServerResponse.text(FAVICON, {
    contentType: "image/svg+xml",
    headers: { "cache-control": "max-age=86400" }
  })
  yield* router.add("GET", "/favicon.svg", Effect.succeed(favicon))
  // The script and styles: their URLs carry a hash of their content, so a day of caching never mixes versions.
  const asset = (body: string, contentType: string) =>
    Effect.succeed(HttpServerResponse.text(body, { contentType, headers: { "cache-control": "max-age=86400" } }))
  yield* router.add("GET", SCRIPT_PATH, asset(SCRIPT, "text/javascript; charset=utf-8"))
  yield* router.add("GET", STYLE_PATH, asset(STYLE, "text/css; charset=utf-8"))

  yield* router.add("GET", "/api/stream", eventStream(yield* ConsoleFeed))
  yield* router.add("GET", "/favicon.ico", Effect.succeed(favicon))

  yield* router.add(
    "GET",
    "/",
    page(Effect.gen(function*() {
      const stream = ((yield* query).get("stream") ?? "").trim().slice(0, 500)
      const found = stream === "" ? [] : yield* events.query({ stream, newestFirst: true, limit: DEFAULT_EVENTS })
      return html(
        dashboardPage(yield* views, {
          stream,
          events: found,
          holds: (yield* health.snapshot).holds.map((h) => h.text),
          databases
        })
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
      const requested = (yield* query).get("window") ?? ""
      const history = isWindow(requested) ? yield* readHistory(view.name, requested) : yield* chosenHistory(view.name)
      return html(batchPage(view, yield* recentRuns({ batch: view.name, limit: BATCH_PAGE_RUNS }), history))
    }))
  )

  yield* router.add(
    "GET",
    "/batches/:name/shadow",
    page(Effect.gen(function*() {
      const { name } = yield* HttpRouter.params
      const view = (yield* views).find((v) => v.name === name)
      if (view === undefined || !shadowCapable(view.name)) {
        return html(
          `<!doctype html><title>No shadow mode</title><p>no shadow mode for ${(name ?? "").replace(/</g, "&lt;")}</p>`,
          404
        )
      }
      const requested = (yield* query).get("window") ?? ""
      const window = isWindow(requested) ? requested : SHADOW_DEFAULT_WINDOW
      const { report } = yield* readShadow(view.name, window)
      return html(shadowPage(view, report, window))
    }))
  )

  // What a batch page re-reads when its batch finished a run: rendered once per (batch, window, last
  // run) and shared by every open tab of that page, so their reads do not grow with the tabs.
  const fragments = yield* makeHistoryFragments((key) =>
    Effect.gen(function*() {
      const history = isWindow(key.window) ? yield* readHistory(key.batch, key.window) : yield* chosenHistory(key.batch)
      return batchHistory(key.batch, yield* recentRuns({ batch: key.batch, limit: BATCH_PAGE_RUNS }), history)
    }).pipe(Effect.provideService(EventLog, events), Effect.provideContext(context))
  )
  yield* router.add(
    "GET",
    "/batches/:name/live",
    page(Effect.gen(function*() {
      const { name } = yield* HttpRouter.params
      const view = (yield* views).find((v) => v.name === name)
      if (view === undefined) return html("", 404)
      const window = (yield* query).get("window") ?? ""
      return html(yield* fragments({ batch: view.name, window, lastRun: view.lastRun?.runId ?? "" }))
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

export interface FragmentKey {
  readonly batch: string
  readonly window: string
  readonly lastRun: string
}

/**
 * A memo of rendered history fragments (effect's Cache: one lookup per key however many ask at
 * once; a few keys per batch, none kept past a minute). The last run is part of the key, so a new
 * run is a new fragment and nothing stale is served.
 */
export const makeHistoryFragments = Effect.fnUntraced(
  function*<E>(render: (key: FragmentKey) => Effect.Effect<string, E>) {
    const cache = yield* Cache.make({
      lookup: (key: string) => render(JSON.parse(key) as FragmentKey),
      capacity: 64,
      timeToLive: "1 minute"
    })
    // One text per key, its fields in a fixed order, so equal keys meet in the cache.
    return (key: FragmentKey) =>
      Cache.get(cache, JSON.stringify({ batch: key.batch, window: key.window, lastRun: key.lastRun }))
  }
)

/**
 * A batch page opened without `?window=`: the window its runs call for (Charts.ts's chooseWindow),
 * from the day's runs; a day without runs reads the week instead.
 */
const chosenHistory = Effect.fnUntraced(function*(batch: string) {
  const day = yield* readHistory(batch, "24h")
  const window = chooseWindow(day.runs, day.until)
  if (window === "24h") return day
  if (window !== "1h") return yield* readHistory(batch, window)
  const since = new Date(day.until.getTime() - WINDOWS["1h"])
  return { ...day, window, since, runs: day.runs.filter((r) => r.finishedAt >= since) }
})

export const ConsoleServices = ConsoleFeedLive().pipe(Layer.provideMerge(Layer.mergeAll(RunHistorySql, BacklogLive)))

/**
 * A run changes what waits: a batch's backlog is sampled again as soon as its last run changes
 * (checked each second, from the scheduler's memory), so a card never shows the builds its run just
 * dropped for the rest of the 30 s period. Only that batch: a run of one batch (resume ends one
 * every minute) must not re-read every other batch's stores.
 */
export const BacklogAfterRuns = Layer.effectDiscard(Effect.gen(function*() {
  const scheduler = yield* Scheduler
  const backlog = yield* Backlog
  let last: ReadonlyMap<string, string> | null = null
  const check = Effect.gen(function*() {
    const runs = new Map((yield* scheduler.snapshots).map((s) => [s.name, s.history.lastRun?.runId ?? ""]))
    const previous = last
    const changed = previous === null ? [] : [...runs].filter(([name, run]) => previous.get(name) !== run)
    if (changed.length > 0) yield* backlog.refreshOnly(changed.map(([name]) => name))
    last = runs
  })
  yield* Effect.forkScoped(Effect.repeat(check, Schedule.spaced("1 second")))
}))

/** The pages, for `HttpRouter.serve` (given ConsoleServices); the JSON group is in SweeperApi (Api.ts). */
export const ConsoleRoutes = Layer.mergeAll(ConsolePages, BacklogAfterRuns)
