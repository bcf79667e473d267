/**
 * The console's JSON endpoints as one `HttpApiGroup`, so they join the JSON API's
 * `HttpApi` with one line (`.add(ConsoleApi)`), and their handlers with `consoleHandlers`:
 *
 *   GET /api/runs/:id?after=&type=&limit=    a run (timings, error, holds) and a page of its repairs
 *   GET /api/batches/:name/history?window=   a batch's runs over 1h | 24h | 7d | 30d (the charts' numbers)
 *   GET /api/backlog                         what waits per batch and the oldest's age (last sample)
 *   GET /api/batches/:name/shadow?window=    shadow mode's agreement, counts and latest disagreements
 *                                            over 1h | 24h | 7d | 30d (7d by default), as the CLI's report
 *
 * Errors have the API's one shape, `{"error": {"code", "message"}}`.
 */
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import type * as HttpApiBuilder from "effect/http-api/HttpApiBuilder"
import * as HttpApiEndpoint from "effect/http-api/HttpApiEndpoint"
import * as HttpApiGroup from "effect/http-api/HttpApiGroup"
import * as HttpApiSchema from "effect/http-api/HttpApiSchema"
import * as Schema from "effect/Schema"
import { describeError } from "../domain/Errors.ts"
import type { StoredEvent } from "../domain/Events.ts"
import { shadowCapable } from "../domain/Shadow.ts"
import { batchNames } from "../programs/index.ts"
import { Backlog, type BacklogSnapshot } from "../services/Backlog.ts"
import { REPAIRS_PAGE, REPAIRS_PAGE_MAX, RunHistory, type RunPoint } from "../services/RunHistory.ts"
import { ShadowLedger } from "../services/ShadowLedger.ts"
import { BUCKETS, isWindow, WINDOWS } from "./Charts.ts"

/**
 * The API's one error shape, one schema per status. The codes differ per schema, so the encoder
 * picks the right status for a failure (the shapes are otherwise the same).
 */
const ApiErrorBody = <const Codes extends ReadonlyArray<string>>(status: number, codes: Codes) =>
  Schema.Struct({ error: Schema.Struct({ code: Schema.Literals(codes), message: Schema.String }) }).pipe(
    HttpApiSchema.status(status)
  )
export const NotFound = ApiErrorBody(404, ["not_found", "unknown_batch"])
export const BadRequest = ApiErrorBody(400, ["bad_request"])
export const Internal = ApiErrorBody(500, ["internal"])

/** A stored event, `occurredAt` as an ISO-8601 string (also SweeperApi's /api/events). */
export const EventSchema = Schema.Struct({
  id: Schema.Number,
  stream: Schema.String,
  type: Schema.String,
  data: Schema.Record(Schema.String, Schema.Unknown),
  runId: Schema.NullOr(Schema.String),
  occurredAt: Schema.String
})

export const RunResponse = Schema.Struct({
  run: Schema.Struct({
    runId: Schema.String,
    batch: Schema.String,
    trigger: Schema.NullOr(Schema.String),
    node: Schema.NullOr(Schema.String),
    dryRun: Schema.Boolean,
    startedAt: Schema.NullOr(Schema.String),
    finishedAt: Schema.NullOr(Schema.String),
    durationMs: Schema.NullOr(Schema.Number),
    outcome: Schema.NullOr(Schema.String),
    reason: Schema.NullOr(Schema.String),
    summary: Schema.Unknown,
    error: Schema.NullOr(Schema.String),
    holds: Schema.Array(EventSchema),
    repairs: Schema.Number,
    /** The pipelines of the builds the run dropped (one more than the page lists when cut). */
    pipelines: Schema.Array(Schema.Number)
  }),
  repairs: Schema.Struct({
    type: Schema.NullOr(Schema.String),
    events: Schema.Array(EventSchema),
    /** Pass as `after` for the next page; null on the last. */
    next: Schema.NullOr(Schema.Number)
  })
})

export const Window = Schema.Literals(["1h", "24h", "7d", "30d"])

export const HistoryResponse = Schema.Struct({
  batch: Schema.String,
  window: Window,
  since: Schema.String,
  until: Schema.String,
  runs: Schema.Array(Schema.Struct({
    runId: Schema.String,
    startedAt: Schema.NullOr(Schema.String),
    finishedAt: Schema.String,
    durationMs: Schema.Number,
    outcome: Schema.String,
    repairs: Schema.Number,
    dryRun: Schema.Boolean
  })),
  /** Every run of the window folded by `bucketMs` (the runs list stops at the newest 2 000). */
  bucketMs: Schema.Number,
  buckets: Schema.Array(Schema.Struct({
    start: Schema.String,
    runs: Schema.Number,
    dryRuns: Schema.Number,
    succeeded: Schema.Number,
    failed: Schema.Number,
    repairs: Schema.Number,
    durationMsMax: Schema.Number,
    durationMsTotal: Schema.Number
  })),
  /** The whole window's runs and repairs (dry runs' repairs left out), from the buckets. */
  totals: Schema.Struct({ runs: Schema.Number, dryRuns: Schema.Number, repairs: Schema.Number })
})

const PartJson = Schema.Struct({
  label: Schema.String,
  count: Schema.Number,
  capped: Schema.Boolean,
  oldestAt: Schema.NullOr(Schema.String)
})

export const BacklogResponse = Schema.Struct({
  sampledAt: Schema.NullOr(Schema.String),
  batches: Schema.Array(Schema.Struct({
    batch: Schema.String,
    what: Schema.String,
    count: Schema.Number,
    capped: Schema.Boolean,
    oldestAt: Schema.NullOr(Schema.String),
    oldestSeconds: Schema.NullOr(Schema.Number),
    parts: Schema.Array(PartJson),
    stale: Schema.Boolean,
    note: Schema.NullOr(Schema.String),
    error: Schema.NullOr(Schema.String)
  }))
})

const ShadowSampleJson = Schema.Struct({
  entity: Schema.String,
  verdict: Schema.String,
  rule: Schema.String,
  outcome: Schema.Record(Schema.String, Schema.Unknown),
  facts: Schema.Record(Schema.String, Schema.Unknown),
  observed: Schema.NullOr(Schema.Record(Schema.String, Schema.Unknown)),
  settledAt: Schema.String
})

/** One batch's shadow report (the ledger's, as `sweeper shadow report --json` prints it) and its window. */
export const ShadowResponse = Schema.Struct({
  batch: Schema.String,
  window: Window,
  since: Schema.String,
  matched: Schema.Number,
  mismatched: Schema.Number,
  sweeperOnly: Schema.Number,
  gitlabOnly: Schema.Number,
  ignored: Schema.Number,
  waiting: Schema.Number,
  agreement: Schema.NullOr(Schema.Number),
  samples: Schema.Array(ShadowSampleJson)
})

export class ConsoleApi extends HttpApiGroup.make("console").add(
  HttpApiEndpoint.get("run", "/api/runs/:id", {
    params: { id: Schema.String },
    // Strings checked by the handler, so a bad value answers in the API's one error shape.
    query: {
      after: Schema.optional(Schema.String),
      type: Schema.optional(Schema.String),
      limit: Schema.optional(Schema.String)
    },
    success: RunResponse,
    error: [NotFound, BadRequest, Internal]
  }),
  HttpApiEndpoint.get("history", "/api/batches/:name/history", {
    params: { name: Schema.String },
    query: { window: Schema.optional(Schema.String) },
    success: HistoryResponse,
    error: [NotFound, BadRequest, Internal]
  }),
  HttpApiEndpoint.get("backlog", "/api/backlog", { success: BacklogResponse }),
  HttpApiEndpoint.get("shadow", "/api/batches/:name/shadow", {
    params: { name: Schema.String },
    query: { window: Schema.optional(Schema.String) },
    success: ShadowResponse,
    error: [NotFound, BadRequest, Internal]
  })
) {}

const iso = (date: Date | null) => date?.toISOString() ?? null

export const eventJson = (event: StoredEvent) => ({ ...event, occurredAt: event.occurredAt.toISOString() })

export const pointJson = (run: RunPoint) => ({
  ...run,
  startedAt: iso(run.startedAt),
  finishedAt: run.finishedAt.toISOString()
})

export const backlogJson = (snapshot: BacklogSnapshot, now: Date) => ({
  sampledAt: iso(snapshot.sampledAt),
  batches: snapshot.batches.map((b) => ({
    ...b,
    oldestAt: iso(b.oldestAt),
    oldestSeconds: b.oldestAt === null ? null : Math.max(0, Math.round((now.getTime() - b.oldestAt.getTime()) / 1000)),
    parts: b.parts.map((p) => ({ ...p, oldestAt: iso(p.oldestAt) }))
  }))
})

const notFound = (code: "not_found" | "unknown_batch", message: string) => Effect.fail({ error: { code, message } })
const badRequest = (message: string) => Effect.fail({ error: { code: "bad_request" as const, message } })
/** A store error: `internal` with its cause chain, in the one shape (never a bare 500). */
const internal = Effect.mapError((error: unknown) => ({
  error: { code: "internal" as const, message: describeError(error) }
}))

/** A query's positive integer: undefined when absent, null when malformed. */
export const positiveInteger = (text: string | null | undefined): number | undefined | null =>
  text === undefined || text === null || text === "" ? undefined : /^\d{1,15}$/.test(text) ? Number(text) : null

const nowDate = Effect.map(DateTime.now, DateTime.toDateUtc)

/** Reads shared by the JSON handlers and the HTML pages. */
export const readRun = Effect.fnUntraced(
  function*(
    id: string,
    query: {
      readonly after?: number | undefined
      readonly type?: string | undefined
      readonly limit?: number | undefined
    }
  ) {
    const history = yield* RunHistory
    const run = yield* history.run(id)
    if (run === null) return null
    const limit = Math.max(1, Math.min(REPAIRS_PAGE_MAX, query.limit ?? REPAIRS_PAGE))
    const page = yield* history.repairs(id, { after: query.after, type: query.type, limit })
    return { run, page, type: query.type ?? null }
  }
)

export const readHistory = Effect.fnUntraced(function*(batch: string, window: keyof typeof WINDOWS) {
  const until = yield* nowDate
  const since = new Date(until.getTime() - WINDOWS[window])
  const history = yield* RunHistory
  const runs = yield* history.history(batch, since)
  const bucketMs = BUCKETS[window]
  const buckets = yield* history.buckets(batch, since, bucketMs)
  const totals = buckets.reduce(
    (sum, b) => ({ runs: sum.runs + b.runs, dryRuns: sum.dryRuns + b.dryRuns, repairs: sum.repairs + b.repairs }),
    { runs: 0, dryRuns: 0, repairs: 0 }
  )
  return { batch, window, since, until, runs, bucketMs, buckets, totals }
})

/** A batch's shadow report over the window: the ledger's one read, the CLI's report's. */
export const readShadow = Effect.fnUntraced(function*(batch: string, window: keyof typeof WINDOWS) {
  const since = new Date((yield* nowDate).getTime() - WINDOWS[window])
  const [report] = yield* (yield* ShadowLedger).report({ since, batches: [batch] })
  return { report: report!, since }
})

/**
 * The console group's handlers, for `HttpApiBuilder.group(<the API>, "console", consoleHandlers)`.
 * The services are taken when the group is built, so the group's layer (not each request) needs them.
 */
export const consoleHandlers = Effect.fn(function*(handlers: HttpApiBuilder.Handlers.FromGroup<typeof ConsoleApi>) {
  const services = yield* Effect.context<RunHistory | Backlog | ShadowLedger>()
  const withServices = <A, E>(effect: Effect.Effect<A, E, RunHistory | Backlog | ShadowLedger>) =>
    Effect.provideContext(effect, services)
  return handlers
    .handle("run", ({ params, query }) =>
      withServices(Effect.gen(function*() {
        const after = positiveInteger(query.after)
        if (after === null) return yield* badRequest("after: expected an event id")
        const limit = positiveInteger(query.limit)
        if (limit === null) return yield* badRequest("limit: expected a positive integer")
        const found = yield* readRun(params.id, { after, limit, type: query.type || undefined }).pipe(internal)
        if (found === null) return yield* notFound("not_found", `no run ${params.id}`)
        const { page, run, type } = found
        return {
          run: {
            ...run,
            startedAt: iso(run.startedAt),
            finishedAt: iso(run.finishedAt),
            holds: run.holds.map(eventJson)
          },
          repairs: { type, events: page.events.map(eventJson), next: page.next }
        }
      })))
    .handle("history", ({ params, query }) =>
      withServices(Effect.gen(function*() {
        if (!batchNames.includes(params.name)) return yield* notFound("unknown_batch", `unknown batch "${params.name}"`)
        const window = query.window ?? "24h"
        if (!isWindow(window)) return yield* badRequest("window: expected 1h, 24h, 7d or 30d")
        const found = yield* readHistory(params.name, window).pipe(internal)
        return {
          ...found,
          since: found.since.toISOString(),
          until: found.until.toISOString(),
          runs: found.runs.map(pointJson),
          buckets: found.buckets.map((b) => ({ ...b, start: b.start.toISOString() }))
        }
      })))
    .handle("backlog", () =>
      withServices(Effect.gen(function*() {
        const snapshot = yield* (yield* Backlog).current
        return backlogJson(snapshot, yield* nowDate)
      })))
    .handle("shadow", ({ params, query }) =>
      withServices(Effect.gen(function*() {
        if (!shadowCapable(params.name)) {
          return yield* notFound("unknown_batch", `no shadow mode for "${params.name}"`)
        }
        const window = query.window ?? "7d"
        if (!isWindow(window)) return yield* badRequest("window: expected 1h, 24h, 7d or 30d")
        const { report, since } = yield* readShadow(params.name, window).pipe(internal)
        return { ...report, window, since: since.toISOString() }
      })))
})
