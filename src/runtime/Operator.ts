/**
 * What the CLI asks of Sweeper — the batches' views, events, a run, a pause — behind one contract
 * with two implementations, so each command has one road:
 *
 * - `remote`: a running supervisor that holds the embedded database (PGlite is one process's
 *   database), through a client derived from the API definition the server implements (Api.ts).
 * - `local`: the configured database and Redis, through the same layers the supervisor uses.
 *
 * `layer` picks: with DATABASE_URL the CLI reads the database itself; on the embedded default it
 * asks the supervisor that published its address, if one runs.
 */
import { Cause, Context, DateTime, type Duration, Effect, Layer, Option, Schema } from "effect"
import { FetchHttpClient, HttpClient, HttpClientRequest } from "effect/http"
import { HttpApiClient } from "effect/http-api"
import { userInfo } from "node:os"
import { configureBatches, SweeperConfig } from "../config/Config.ts"
import {
  BatchDisabled,
  describeError,
  hostOfUrl,
  InfrastructureUnavailable,
  InvalidConfig,
  PauseNotRecorded,
  type UnknownBatch
} from "../domain/Errors.ts"
import { openHolds } from "../domain/Health.ts"
import { batches, findBatch } from "../programs/index.ts"
import { type EventFilter, EventLog } from "../services/EventLog.ts"
import { AnyApiError, type BatchViewSchema, type EventSchema, type RunResultSchema, SweeperApi } from "./Api.ts"
import { AppLayer, describeBackends, ReadOnlyAppLayer } from "./App.ts"
import { batchView } from "./BatchView.ts"
import { runBatch } from "./RunGuard.ts"
import { loadHistory, recordPause } from "./Scheduler.ts"
import { findSupervisor, type SupervisorEndpoint } from "./SupervisorAddress.ts"

export type View = typeof BatchViewSchema.Type
export type EventView = typeof EventSchema.Type
export type RunView = typeof RunResultSchema.Type

export interface RunRequest {
  readonly dryRun: boolean
  readonly force: boolean
  readonly asOf?: Date | undefined
  readonly budget?: Duration.Duration | undefined
}

/** The supervisor refused a request as bad input (unknown or disabled batch, bad value): exit 2. */
export class RemoteRefusal extends Schema.TaggedError<RemoteRefusal>()("RemoteRefusal", { message: Schema.String }) {}

/** A flag this road cannot honour, e.g. `--budget` while the supervisor holds the database. */
export class UnsupportedFlag
  extends Schema.TaggedError<UnsupportedFlag>()("InvalidFlag", { flag: Schema.String, message: Schema.String })
{}

type Failure =
  | InfrastructureUnavailable
  | RemoteRefusal
  | UnsupportedFlag
  | PauseNotRecorded
  | UnknownBatch
  | BatchDisabled
  | InvalidConfig
  | Cause.YieldableError

export class Operator extends Context.Service<Operator, {
  readonly views: Effect.Effect<ReadonlyArray<View>, Failure>
  events(filter: EventFilter): Effect.Effect<ReadonlyArray<EventView>, Failure>
  run(batch: string, request: RunRequest): Effect.Effect<RunView, Failure>
  setPaused(batch: string, action: "pause" | "resume"): Effect.Effect<void, Failure>
}>()("sweeper/runtime/Operator") {}

const actor = () => `cli:${userInfo().username}`

/** The supervisor's API, through the client derived from its definition. */
export const remote = (endpoint: SupervisorEndpoint) =>
  Layer.effect(
    Operator,
    Effect.gen(function*() {
      const client = yield* HttpApiClient.make(SweeperApi, {
        baseUrl: endpoint.url,
        transformClient: HttpClient.mapRequest((request) =>
          request.pipe(
            HttpClientRequest.bearerToken(endpoint.token),
            HttpClientRequest.setHeader("x-sweeper-actor", actor())
          )
        )
      })
      const host = hostOfUrl(endpoint.url)
      /** The API's errors by code: bad input is a refusal (exit 2), the rest "cannot reach" (exit 3). */
      const answered = <A, E, R>(call: Effect.Effect<A, E, R>, onUnavailable?: (message: string) => Failure) =>
        call.pipe(Effect.catchCause((cause): Effect.Effect<never, Failure> => {
          const error = Cause.squash(cause)
          const body = Schema.decodeUnknownOption(AnyApiError)(error)
          const code = Option.isSome(body) ? body.value.error.code : undefined
          const message = Option.isSome(body) ? body.value.error.message : describeError(error)
          if (code === "unknown_batch" || code === "batch_disabled" || code === "bad_request") {
            return Effect.fail(new RemoteRefusal({ message }))
          }
          if (code === "unavailable" && onUnavailable !== undefined) return Effect.fail(onUnavailable(message))
          return Effect.fail(new InfrastructureUnavailable({ service: "Sweeper supervisor", host, detail: message }))
        }))
      return Operator.of({
        views: answered(client.batches.list()),
        events: (filter) =>
          answered(client.batches.events({
            query: {
              ...(filter.stream === undefined ? {} : { stream: filter.stream }),
              ...(filter.type === undefined ? {} : { type: filter.type }),
              ...(filter.runId === undefined ? {} : { run: filter.runId }),
              ...(filter.since === undefined ? {} : { since: filter.since.toISOString() }),
              ...(filter.until === undefined ? {} : { until: filter.until.toISOString() }),
              ...(filter.limit === undefined ? {} : { limit: String(filter.limit) })
            }
          })),
        run: (batch, request) =>
          request.budget !== undefined
            ? Effect.fail(
              new UnsupportedFlag({
                flag: "--budget",
                message: "not available while the supervisor holds the embedded database; stop it, or set DATABASE_URL"
              })
            )
            : answered(client.actions.run({
              params: { name: batch },
              payload: {
                dryRun: request.dryRun,
                force: request.force,
                ...(request.asOf === undefined ? {} : { now: request.asOf.toISOString() })
              }
            })),
        setPaused: (batch, action) =>
          answered(
            action === "pause"
              ? Effect.asVoid(client.actions.pause({ params: { name: batch } }))
              : Effect.asVoid(client.actions.resume({ params: { name: batch } })),
            (detail) => new PauseNotRecorded({ batch, action, detail })
          )
      })
    })
  ).pipe(Layer.provide(FetchHttpClient.layer))

/** The configured database and Redis, through the supervisor's own layers. */
export const local = Layer.succeed(
  Operator,
  Operator.of({
    // Computed here from the database: every batch's folded history, no supervisor involved.
    views: Effect.gen(function*() {
      const settings = yield* SweeperConfig
      const now = new Date(DateTime.toEpochMillis(yield* DateTime.now))
      const events = yield* EventLog
      return yield* Effect.forEach(
        yield* configureBatches(batches),
        ({ batch, cronText, cron, disabled }) =>
          Effect.gen(function*() {
            const history = yield* loadHistory(batch.name)
            // What holds it now, from its stream, so the answer is the same whichever process holds it.
            const recent = yield* events.query({ stream: `batch:${batch.name}`, newestFirst: true, limit: 200 })
            const holds = openHolds([...recent].reverse()).map((hold) => hold.text)
            return {
              ...batchView(
                { batch, cronText, cron, timezone: settings.timezone, running: false, disabled, history },
                now
              ),
              holds
            }
          })
      )
    }).pipe(Effect.provide(ReadOnlyAppLayer)),
    events: (filter) =>
      Effect.flatMap(EventLog, (log) => log.query(filter)).pipe(
        Effect.map((found) => found.map((e) => ({ ...e, occurredAt: e.occurredAt.toISOString() }))),
        Effect.provide(ReadOnlyAppLayer)
      ),
    run: (name, request) =>
      Effect.gen(function*() {
        // Every batch's variables are checked, not only this one's: bad configuration is refused at the edge.
        const configured = yield* configureBatches(batches)
        const batch = configured.find((c) => c.batch.name === name)?.batch ?? (yield* findBatch(name))
        const settings = yield* SweeperConfig
        if (settings.disabledBatches.includes(batch.name) && !request.force) {
          return yield* new BatchDisabled({ name: batch.name })
        }
        yield* Effect.logInfo("Backends", describeBackends(settings))
        return yield* runBatch(batch, {
          trigger: "manual",
          dryRun: request.dryRun,
          budget: request.budget,
          asOf: request.asOf
        })
        // A dry run only reads, so it never migrates.
      }).pipe(Effect.provide(request.dryRun ? ReadOnlyAppLayer : AppLayer)),
    setPaused: (batch, action) => recordPause(batch, action, actor()).pipe(Effect.provide(AppLayer))
  })
)

/** The road configuration picks (see the header). */
export const layer = Layer.unwrap(
  Effect.gen(function*() {
    const settings = yield* SweeperConfig
    if (Option.isSome(settings.databaseUrl)) return local
    return Option.match(yield* findSupervisor(settings.dataDir), { onNone: () => local, onSome: remote })
  }).pipe(Effect.provide(SweeperConfig.layer))
)
