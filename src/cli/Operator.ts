/**
 * What the CLI asks of Sweeper — the batches' views, events, a run, a pause — behind one contract
 * with two implementations, so each command has one road:
 *
 * - `remote`: a running supervisor that holds the embedded database (PGlite is one process's
 *   database), through a client derived from the API definition the server implements (Api.ts).
 * - `local`: the configured database and Redis, through the same layers the supervisor uses.
 *
 * `layer` picks, and logs which: SWEEPER_URL names a supervisor; with DATABASE_URL the CLI reads
 * the database itself; on the embedded default it asks the supervisor that published its address
 * in the data directory, else opens the embedded database there — but only one that exists or was
 * named, never an empty `./.sweeper` made up on the spot (the REPL takes the same road).
 */
import * as Cause from "effect/Cause"
import * as Config from "effect/Config"
import * as Context from "effect/Context"
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as HttpApiClient from "effect/http-api/HttpApiClient"
import * as HttpClient from "effect/http/HttpClient"
import * as HttpClientRequest from "effect/http/HttpClientRequest"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Redacted from "effect/Redacted"
import * as Schema from "effect/Schema"
import { existsSync } from "node:fs"
import { userInfo } from "node:os"
import { join, resolve } from "node:path"
import { configureBatches, SweeperConfig } from "../config/Config.ts"
import { HARD_TIMEOUT_GRACE } from "../domain/Batch.ts"
import {
  BatchDisabled,
  describeError,
  hostOfUrl,
  InfrastructureUnavailable,
  InvalidConfig,
  PauseNotRecorded,
  type UnknownBatch
} from "../domain/Errors.ts"
import { healthStream } from "../domain/Events.ts"
import { openHolds } from "../domain/Health.ts"
import { redact } from "../domain/Redaction.ts"
import { AnyApiError, type BatchViewSchema, type EventSchema, type RunResultSchema, SweeperApi } from "../http/Api.ts"
import { CiDatabase } from "../layers/postgres/Databases.ts"
import { batches, findBatch } from "../programs/index.ts"
import { type EventFilter, EventLog } from "../services/EventLog.ts"
import { AppLayer, describeBackends, ReadOnlyAppLayer } from "../supervisor/App.ts"
import { recordPause } from "../supervisor/PauseState.ts"
import { runBatch } from "../supervisor/RunGuard.ts"
import { loadHistory } from "../supervisor/Scheduler.ts"
import { findSupervisor, type SupervisorEndpoint } from "../supervisor/SupervisorAddress.ts"
import { batchView } from "../views/BatchView.ts"
import { parseDuration } from "./CliFlags.ts"

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

const NonEmptyText = Schema.String.check(Schema.isNonEmpty({ message: "must not be empty" }))

/** Nothing to talk to: no supervisor runs for the default data directory, and nothing is configured. */
export class NoSupervisor extends Schema.TaggedError<NoSupervisor>()("NoSupervisor", { dataDir: Schema.String }) {
  override get message() {
    return `no Sweeper supervisor is running for ${this.dataDir} and nothing else is configured: ` +
      "start one (npx sweeper start, or npm run demo, which prints how to reach it), or name one with " +
      "SWEEPER_DATA_DIR (its data directory), SWEEPER_URL or DATABASE_URL"
  }
}

/** A command that only reads was pointed (SWEEPER_DATA_DIR) at a directory that holds no Sweeper data. */
export class NoStoreThere extends Schema.TaggedError<NoStoreThere>()("NoStoreThere", { dataDir: Schema.String }) {
  override get message() {
    return `no Sweeper data in ${this.dataDir} (SWEEPER_DATA_DIR): nothing to read there, and a command that ` +
      "only reads creates no store; check the path, or start Sweeper there first (npx sweeper start)"
  }
}

export class Operator extends Context.Service<Operator, {
  /** What this road talks to, in words: "the supervisor at http://… (pid 42, data directory …)". */
  readonly target: string
  readonly views: Effect.Effect<ReadonlyArray<View>, Failure>
  events(filter: EventFilter): Effect.Effect<ReadonlyArray<EventView>, Failure>
  run(batch: string, request: RunRequest): Effect.Effect<RunView, Failure>
  setPaused(batch: string, action: "pause" | "resume"): Effect.Effect<void, Failure>
}>()("sweeper/cli/Operator") {}

const actor = () => `cli:${userInfo().username}`

/** A remote run silent for this long is said to be awaited (once). */
const REMIND_AFTER = Duration.seconds(10)

/** Room for the request itself and the actor's turn, beyond the runs' own deadlines. */
const RUN_WAIT_SLACK = Duration.seconds(30)

/**
 * How long a remote run may take before its answer: the run ahead of it in the batch's mailbox and
 * its own, each at most its budget plus the hard-timeout grace (the run guard ends a run there).
 * Past that the supervisor is not merely busy.
 */
export const runWait = (budget: Duration.Duration): Duration.Duration =>
  Duration.sum(Duration.times(Duration.sum(budget, HARD_TIMEOUT_GRACE), 2), RUN_WAIT_SLACK)

/** A budget as the API writes it (Duration.format: `25m`, `1h 30m`, `55s 500ms`). */
export const parseBudget = (text: string): Option.Option<Duration.Duration> => {
  if (text.trim() === "0") return Option.some(Duration.zero)
  const pieces = text.trim().split(/\s+/).map(parseDuration)
  return pieces.length === 0 || pieces.some(Option.isNone)
    ? Option.none()
    : Option.some(
      pieces.reduce((sum: Duration.Duration, piece) => Duration.sum(sum, Option.getOrThrow(piece)), Duration.zero)
    )
}

/** The supervisor's API, through the client derived from its definition. */
export const remote = (endpoint: SupervisorEndpoint, target: string) =>
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
          if (
            code === "unknown_batch" || code === "batch_disabled" || code === "bad_request" ||
            code === "unauthorized" || code === "api_disabled"
          ) {
            return Effect.fail(new RemoteRefusal({ message }))
          }
          if (code === "unavailable" && onUnavailable !== undefined) return Effect.fail(onUnavailable(message))
          return Effect.fail(new InfrastructureUnavailable({ service: "Sweeper supervisor", host, detail: message }))
        }))
      return Operator.of({
        target,
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
            : Effect.gen(function*() {
              // The answer comes when the run ends, which may be long after any fixed HTTP patience
              // (a held run, a 25-minute budget): wait as long as this batch's run may take.
              const views = yield* answered(client.batches.list())
              const budget = Option.flatMap(
                Option.fromNullishOr(views.find((view) => view.name === batch)),
                (view) => parseBudget(view.config.budget)
              )
              const wait = runWait(Option.getOrElse(budget, () => Duration.hours(1)))
              // A run held by the health gate, or a long one, is silent here: say once that it is awaited.
              const reminder = yield* Effect.forkChild(
                Effect.logInfo(
                  `Waiting for the run of ${batch} (up to ${Duration.format(wait)}); sweeper status shows what holds it`
                ).pipe(Effect.delay(REMIND_AFTER))
              )
              return yield* answered(client.actions.run({
                params: { name: batch },
                payload: {
                  dryRun: request.dryRun,
                  force: request.force,
                  ...(request.asOf === undefined ? {} : { now: request.asOf.toISOString() })
                }
              })).pipe(
                // Giving up cancels the request: the supervisor withdraws it if it has not started.
                Effect.timeoutOrElse({
                  duration: wait,
                  orElse: () =>
                    Effect.fail(
                      new InfrastructureUnavailable({
                        service: "Sweeper supervisor",
                        host,
                        detail: `no answer to run ${batch} within ${
                          Duration.format(wait)
                        }, longer than such a run may take (see sweeper status)`
                      })
                    )
                }),
                Effect.ensuring(Fiber.interrupt(reminder))
              )
            }),
        setPaused: (batch, action) =>
          answered(
            action === "pause"
              ? Effect.asVoid(client.actions.pause({ params: { name: batch } }))
              : Effect.asVoid(client.actions.resume({ params: { name: batch } })),
            (detail) => new PauseNotRecorded({ batch, action, detail })
          )
      })
    })
    // node:http, not fetch: fetch gives up on headers after five minutes, and a run's answer may take longer.
    // Imported when a command asks a supervisor: the supervisor itself never does (idle RSS).
  ).pipe(Layer.provide(Layer.unwrap(Effect.promise(async () =>
    (await import("@effect/platform-node/NodeHttpClient")).layerNodeHttp
  ))))

/** The configured database and Redis, through the supervisor's own layers. */
export const local = (target: string) =>
  Layer.succeed(
    Operator,
    Operator.of({
      target,
      // Computed here from the database: every batch's folded history, no supervisor involved.
      views: Effect.gen(function*() {
        const settings = yield* SweeperConfig
        const now = new Date(DateTime.toEpochMillis(yield* DateTime.now))
        const events = yield* EventLog
        const { decomposed } = yield* CiDatabase
        return yield* Effect.forEach(
          yield* configureBatches(batches),
          ({ batch, cronText, cron, disabled }) =>
            Effect.gen(function*() {
              const history = yield* loadHistory(batch.name)
              // What holds it now, from its health stream (whichever process holds it).
              const gate = yield* events.query({ stream: healthStream(batch.name), newestFirst: true, limit: 200 })
              const finished = yield* events.query({
                stream: `batch:${batch.name}`,
                type: "RunFinished",
                newestFirst: true,
                limit: 20
              })
              const recent = [...gate, ...finished].sort((a, b) => a.id - b.id)
              const holds = openHolds(recent).map((hold) => hold.text)
              return {
                ...batchView(
                  { batch, cronText, cron, timezone: settings.timezone, running: false, disabled, history, decomposed },
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
          // A dry run only reads: it gets the read-only layers, which never migrate.
        }).pipe(Effect.provide(request.dryRun ? ReadOnlyAppLayer : AppLayer)),
      setPaused: (batch, action) => recordPause(batch, action, actor()).pipe(Effect.provide(AppLayer))
    })
  )

/**
 * The road configuration picks (see the header), said once in the log: which supervisor, or which
 * database. A command that only `reads` never creates the embedded store it would read from.
 */
const layerFor = (access: "reads" | "writes") =>
  Layer.unwrap(
    Effect.gen(function*() {
      const settings = yield* SweeperConfig
      const explicitUrl = yield* Config.option(Config.schema(NonEmptyText, "SWEEPER_URL"))
      if (Option.isSome(explicitUrl)) {
        const token = Option.match(settings.apiToken, { onNone: () => "", onSome: Redacted.value })
        const target = `the supervisor at ${redact(explicitUrl.value)} (SWEEPER_URL)`
        yield* Effect.logInfo(`Talking to ${target}`)
        return remote({ url: explicitUrl.value, token }, target)
      }
      if (Option.isSome(settings.databaseUrl)) return local(`the database at ${describeBackends(settings).postgres}`)
      const found = yield* findSupervisor(settings.dataDir)
      if (Option.isSome(found)) {
        const { url, pid } = found.value
        const target = `the supervisor at ${url} (pid ${pid}, data directory ${resolve(settings.dataDir)})`
        yield* Effect.logInfo(`Talking to ${target}`)
        return remote(found.value, target)
      }
      // Nothing named and nothing there: opening the default directory would create an empty store
      // and answer from it as if it were Sweeper's state.
      const named = Option.isSome(yield* Config.option(Config.schema(Schema.String, "SWEEPER_DATA_DIR")))
      const hasStore = existsSync(join(settings.dataDir, "pgdata"))
      if (!named && !hasStore) return yield* new NoSupervisor({ dataDir: settings.dataDir })
      if (access === "reads" && !hasStore) return yield* new NoStoreThere({ dataDir: resolve(settings.dataDir) })
      const target = `the embedded database in ${resolve(settings.dataDir)} (no supervisor is running there)`
      // Found by default rather than named: say where the answers come from, as for a supervisor.
      if (!named) yield* Effect.logInfo(`Reading ${target}`)
      return local(target)
    }).pipe(Effect.provide(SweeperConfig.layer))
  )

export const layer = layerFor("writes")
export const readingLayer = layerFor("reads")
