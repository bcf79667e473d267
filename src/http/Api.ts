/**
 * The supervisor's JSON API as one `HttpApi` definition: Http.ts implements it, and the CLI's
 * client is derived from it (`HttpApiClient`), so the two cannot drift. Every error has the one
 * shape `{"error": {"code", "message"}}`, its status fixed by its code.
 *
 *   GET  /api/batches, /api/batches/:name (with its last runs), /api/runs?batch=&limit=,
 *        /api/events?stream=&type=&run=&since=&until=&limit=
 *   POST /api/batches/:name/run ({"dryRun"?, "force"?, "now"?}), …/pause, …/resume (bearer token)
 *
 * A new group (e.g. ConsoleApi.ts's) is one `.add(Group)` line on `SweeperApi` below — before its
 * `.middleware(ErrorShape)`, which applies only to the groups added before it — plus its
 * `HttpApiBuilder.group` layer in the `Layer.provide([...])` list of Http.ts's `ApiLive`. Plain routes (/healthz,
 * /readyz, /metrics, the dashboard, the SSE stream) stay router
 * routes in Http.ts: they are not JSON.
 */
import * as Effect from "effect/Effect"
import * as HttpApi from "effect/http-api/HttpApi"
import * as HttpApiEndpoint from "effect/http-api/HttpApiEndpoint"
import * as HttpApiGroup from "effect/http-api/HttpApiGroup"
import * as HttpApiMiddleware from "effect/http-api/HttpApiMiddleware"
import * as HttpApiSchema from "effect/http-api/HttpApiSchema"
import * as Schema from "effect/Schema"
import { MODES } from "../domain/Shadow.ts"
import { ConsoleApi, EventSchema } from "./ConsoleApi.ts"

/** An error of the one shape, for one code at one status. */
const apiError = <const Code extends string>(code: Code, status: number) =>
  Schema.Struct({
    error: Schema.Struct({
      code: Schema.Literal(code),
      message: Schema.String,
      /** For unknown_batch: the batches that exist. */
      known: Schema.optionalKey(Schema.Array(Schema.String))
    })
  }).pipe(HttpApiSchema.status(status))

export const Unauthorized = apiError("unauthorized", 401)
export const ApiDisabled = apiError("api_disabled", 403)
export const UnknownBatchError = apiError("unknown_batch", 404)
export const BatchDisabledError = apiError("batch_disabled", 409)
export const BadRequest = apiError("bad_request", 400)
export const Internal = apiError("internal", 500)
/** A store this action must write to refused (a pause that could not be recorded): nothing changed. */
export const Unavailable = apiError("unavailable", 503)
/** A request body past HttpGuards' limit (a larger Content-Length is refused before any handler). */
export const PayloadTooLarge = apiError("payload_too_large", 413)

/** Any of the above, as a client reads it back. */
export const AnyApiError = Schema.Struct({ error: Schema.Struct({ code: Schema.String, message: Schema.String }) })

/** Request decoding failures (a bad query or body) answer bad_request in the one shape. */
export class ErrorShape extends HttpApiMiddleware.Service<ErrorShape>()("sweeper/http/Api/ErrorShape", {
  error: BadRequest
}) {}

/** Mutating actions need `Authorization: Bearer <SWEEPER_API_TOKEN or the local token>`. */
export class Authorized extends HttpApiMiddleware.Service<Authorized>()("sweeper/http/Api/Authorized", {
  error: [Unauthorized, ApiDisabled]
}) {}

const Iso = Schema.NullOr(Schema.String)

const LastRunView = Schema.Struct({
  runId: Schema.NullOr(Schema.String),
  outcome: Schema.String,
  finishedAt: Schema.String,
  durationMs: Schema.Number,
  summary: Schema.Unknown,
  reason: Schema.NullOr(Schema.String),
  error: Schema.NullOr(Schema.String)
})

/** One batch as an operator sees it (BatchView.ts builds it). */
export const BatchViewSchema = Schema.Struct({
  name: Schema.String,
  worker: Schema.String,
  description: Schema.String,
  /** act, or shadow (proposes beside GitLab's worker); a supervisor of an earlier release sends none: act. */
  mode: Schema.Literals(MODES).pipe(Schema.withDecodingDefaultKey(Effect.succeed("act" as const))),
  cron: Schema.String,
  cronInWords: Schema.String,
  timezone: Schema.String,
  state: Schema.Literals(["idle", "running", "paused", "disabled", "breaker_open"]),
  disabled: Schema.Boolean,
  paused: Schema.NullOr(Schema.Struct({ by: Schema.NullOr(Schema.String), at: Iso })),
  breaker: Schema.Struct({ open: Schema.Boolean, until: Iso }),
  nextTick: Iso,
  nextTicks: Schema.Array(Schema.String),
  lastRun: Schema.NullOr(LastRunView),
  lastOutcome: Schema.NullOr(Schema.String),
  openRun: Schema.NullOr(
    Schema.Struct({ runId: Schema.String, startedAt: Schema.String, node: Schema.String, overdue: Schema.Boolean })
  ),
  lastSuccessAt: Iso,
  consecutiveFailures: Schema.Number,
  /**
   * The database its GitLab writes go to: "ci" only when the ci tables are a database of their own.
   * A supervisor of an earlier release (a rolling upgrade) sends neither field: one database.
   */
  database: Schema.Literals(["main", "ci"]).pipe(Schema.withDecodingDefaultKey(Effect.succeed("main" as const))),
  /** GitLab's ci tables are in a database of their own (a decomposed GitLab). */
  decomposed: Schema.Boolean.pipe(Schema.withDecodingDefaultKey(Effect.succeed(false))),
  config: Schema.Struct({
    budget: Schema.String,
    lease: Schema.NullOr(Schema.Struct({ name: Schema.String, ttl: Schema.String })),
    missedRuns: Schema.Literals(["run-latest-if-recent", "skip"])
  }),
  /** The console's: the running run's progress and the last backlog sample (Console.ts), as drawn. */
  live: Schema.optional(Schema.NullOr(Schema.Unknown)),
  backlog: Schema.optional(Schema.Unknown),
  /** What the health gate holds the batch on now, one line each. */
  holds: Schema.optional(Schema.Array(Schema.String))
})

/** One finished run, read back from its events (Runs.ts). */
export const RunRecordSchema = Schema.Struct({
  runId: Schema.NullOr(Schema.String),
  batch: Schema.String,
  trigger: Schema.NullOr(Schema.String),
  node: Schema.NullOr(Schema.String),
  dryRun: Schema.Boolean,
  startedAt: Iso,
  finishedAt: Schema.String,
  durationMs: Schema.Number,
  outcome: Schema.String,
  summary: Schema.Unknown,
  reason: Schema.NullOr(Schema.String),
  error: Schema.NullOr(Schema.String),
  targets: Schema.NullOr(Schema.Array(Schema.String)),
  targetsTotal: Schema.NullOr(Schema.Number)
})

/** A run that a run closed as abandoned before it began (AbandonedRuns' LastRun; its finishedAt a Date). */
const ClosedRunSchema = Schema.Struct({
  runId: Schema.NullOr(Schema.String),
  outcome: Schema.String,
  finishedAt: Schema.DateFromString,
  durationMs: Schema.Number,
  summary: Schema.Unknown,
  reason: Schema.optional(Schema.String),
  error: Schema.optional(Schema.String)
})

/** What one run through the run guard returned (RunGuard's RunResult, as JSON). */
export const RunResultSchema = Schema.Struct({
  batch: Schema.String,
  runId: Schema.String,
  outcome: Schema.Literals(["succeeded", "failed", "timed_out", "skipped", "abandoned"]),
  summary: Schema.Unknown,
  reason: Schema.optional(Schema.String),
  error: Schema.optional(Schema.String),
  durationMs: Schema.Number,
  closed: Schema.optional(Schema.Array(ClosedRunSchema)),
  dryRun: Schema.Boolean,
  targets: Schema.optional(Schema.Array(Schema.String)),
  targetsTotal: Schema.optional(Schema.Number),
  /** Repair events not yet in the ledger when the run ended (a decomposed GitLab's relay); absent: none. */
  eventsOwed: Schema.optional(Schema.Number),
  /** Where RunFinished went when main's ledger could not take it; absent: in the ledger. */
  runFinished: Schema.optional(Schema.Literals(["outbox", "nowhere"]))
})

/** A stored event: defined beside the console's group (imported here, never the other way), one schema for both. */
export { EventSchema }

export const RunBody = Schema.Struct({
  dryRun: Schema.optionalKey(Schema.Boolean),
  force: Schema.optionalKey(Schema.Boolean),
  /** `--now`: the ISO-8601 instant thresholds are judged at (`sweeper events prune --before` sends it). */
  now: Schema.optionalKey(Schema.String)
})

const name = { name: Schema.String }

export const BatchesGroup = HttpApiGroup.make("batches")
  .add(HttpApiEndpoint.get("list", "/api/batches", { success: Schema.Array(BatchViewSchema) }))
  .add(HttpApiEndpoint.get("get", "/api/batches/:name", {
    params: name,
    success: Schema.Struct({ ...BatchViewSchema.fields, runs: Schema.Array(RunRecordSchema) }),
    error: [UnknownBatchError, Internal]
  }))
  .add(HttpApiEndpoint.get("runs", "/api/runs", {
    // Strings, checked by the handler: its messages are the API's ("limit: expected a positive integer").
    query: { batch: Schema.optionalKey(Schema.String), limit: Schema.optionalKey(Schema.String) },
    success: Schema.Array(RunRecordSchema),
    error: [UnknownBatchError, BadRequest, Internal]
  }))
  .add(HttpApiEndpoint.get("events", "/api/events", {
    query: {
      stream: Schema.optionalKey(Schema.String),
      type: Schema.optionalKey(Schema.String),
      run: Schema.optionalKey(Schema.String),
      since: Schema.optionalKey(Schema.String),
      until: Schema.optionalKey(Schema.String),
      limit: Schema.optionalKey(Schema.String)
    },
    success: Schema.Array(EventSchema),
    error: [BadRequest, Internal]
  }))

export const ActionsGroup = HttpApiGroup.make("actions")
  .add(HttpApiEndpoint.post("run", "/api/batches/:name/run", {
    params: name,
    // The server reads it raw (Http.ts): no body at all is `{}`.
    payload: RunBody,
    success: RunResultSchema,
    error: [UnknownBatchError, BatchDisabledError, BadRequest, PayloadTooLarge, Internal]
  }))
  .add(HttpApiEndpoint.post("pause", "/api/batches/:name/pause", {
    params: name,
    success: Schema.Struct({ paused: Schema.String }),
    error: [UnknownBatchError, Unavailable, Internal]
  }))
  .add(HttpApiEndpoint.post("resume", "/api/batches/:name/resume", {
    params: name,
    success: Schema.Struct({ resumed: Schema.String }),
    error: [UnknownBatchError, Unavailable, Internal]
  }))
  .middleware(Authorized)

export const SweeperApi = HttpApi.make("sweeper")
  .add(BatchesGroup)
  .add(ActionsGroup)
  // New groups go here: the middleware below covers the groups added above it.
  .middleware(ErrorShape)
  // The console's group (ConsoleApi.ts) takes every parameter as a string and answers bad values in
  // the one error shape itself, so it needs no ErrorShape.
  .add(ConsoleApi)
