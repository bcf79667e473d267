/**
 * The `sweeper` command line. Every command builds the same AppLayer the supervisor uses, so a
 * one-off run is the scheduled run's program under the same run guard.
 */
import { Cause, ConfigProvider, Console, DateTime, Duration, Effect, Exit, Layer, Option, Schema } from "effect"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir, userInfo } from "node:os"
import { join } from "node:path"
import { BatchDisabled, describeError, hostOfUrl, InfrastructureUnavailable, InvalidConfig, PauseNotRecorded } from "../domain/Errors.ts"
import { BatchPaused, BatchResumed, type StoredEvent } from "../domain/Events.ts"
import { HttpServer } from "effect/http"
import { Argument, Command, Flag } from "effect/cli"
import { AppLayer, databaseClientLayer, describeBackends, ReadOnlyAppLayer } from "../layers/App.ts"
import { configureBatches, redisConfigured, SweeperConfig } from "../layers/Config.ts"
import { cronVariable } from "../domain/Schedule.ts"
import { emptyLedger, ledgerCounts } from "../simulator/Ledger.ts"
import { parseScenarios, type SimulateOptions, simulate, SimulatorLive } from "../simulator/Simulator.ts"
import { detectSchemaMode } from "../layers/DatabaseSchema.ts"
import { migrateWith, pendingMigrations } from "../layers/Migrations.ts"
import { refusesLookAhead } from "../domain/Batch.ts"
import { attachDashedValues, durationFlag, instantFlag, intFlag } from "./CliFlags.ts"
import { doctorCommand } from "./Doctor.ts"
import { batches, batchNames, findBatch } from "../programs/index.ts"
import { PruneEvents } from "../programs/PruneEvents.ts"
import { EventLog } from "../services/EventLog.ts"
import { batchView, type BatchView } from "./BatchView.ts"
import { HttpLive } from "./Http.ts"
import { findSupervisor, publishAddress, type SupervisorEndpoint } from "./SupervisorAddress.ts"
import { type RunResult, runBatch } from "./RunGuard.ts"
import { loadHistory, Scheduler, schedulerLayer } from "./Scheduler.ts"

/** Set once the supervisor is up: an interrupt (SIGTERM/SIGINT) after that is a graceful exit 0. */
export const supervisor = { started: false }

/** The API's own cap on one page of events (Http.ts): the CLI asks for no more, on either road. */
const MAX_EVENTS = 1000
/** The simulator's rate per scenario beyond which a laptop only measures its own queueing. */
const MAX_RATE = 10_000

export class InvalidFlag extends Schema.TaggedError<InvalidFlag>()("InvalidFlag", {
  flag: Schema.String,
  message: Schema.String
}) {}

const json = Flag.Boolean("json").pipe(Flag.withDescription("Print JSON on stdout"), Flag.withDefault(false))
const batchArgument = Argument.String("batch").pipe(Argument.withDescription(`One of: ${batchNames.join(", ")}`))

/**
 * On the embedded default the database belongs to the running supervisor (PGlite is one process's
 * database), so the CLI asks it over HTTP. With DATABASE_URL the CLI reads the database itself.
 */
const remoteSupervisor = Effect.gen(function*() {
  const settings = yield* SweeperConfig
  if (Option.isSome(settings.databaseUrl)) return Option.none<SupervisorEndpoint>()
  return yield* findSupervisor(settings.dataDir)
}).pipe(Effect.provide(SweeperConfig.layer))

/** One call to the supervisor's API; its JSON errors come back as one line, an unreachable supervisor as exit 3. */
const callSupervisor = (endpoint: SupervisorEndpoint, method: "GET" | "POST", path: string, body?: unknown) =>
  Effect.tryPromise({
    try: async () => {
      const response = await fetch(`${endpoint.url}${path}`, {
        method,
        headers: {
          authorization: `Bearer ${endpoint.token}`,
          "x-sweeper-actor": `cli:${userInfo().username}`,
          ...(body === undefined ? {} : { "content-type": "application/json" })
        },
        ...(body === undefined ? {} : { body: JSON.stringify(body) })
      })
      return { status: response.status, body: await response.json() as unknown }
    },
    catch: (cause) => new InfrastructureUnavailable({ service: "Sweeper supervisor", host: hostOfUrl(endpoint.url), detail: describeError(cause) })
  }).pipe(Effect.flatMap(({ status, body }): Effect.Effect<unknown, InfrastructureUnavailable | RemoteRefusal> => {
    if (status < 400) return Effect.succeed(body)
    const error = (body as { error?: { code?: string; message?: string } }).error
    const message = error?.message ?? `HTTP ${status}`
    if (error?.code === "batch_disabled") return Effect.fail(new RemoteRefusal({ message }))
    if (error?.code === "unknown_batch") return Effect.fail(new RemoteRefusal({ message }))
    return Effect.fail(new InfrastructureUnavailable({ service: "Sweeper supervisor", host: hostOfUrl(endpoint.url), detail: message }))
  }))

export class RemoteRefusal extends Schema.TaggedError<RemoteRefusal>()("RemoteRefusal", { message: Schema.String }) {}

const printRun = (result: RunResult, asJson: boolean) =>
  Effect.gen(function*() {
    if (asJson) {
      yield* Console.log(JSON.stringify({
        batch: result.batch,
        runId: result.runId,
        outcome: result.outcome,
        dryRun: result.dryRun,
        summary: result.summary,
        ...(result.reason === undefined ? {} : { reason: result.reason }),
        ...(result.error === undefined ? {} : { error: result.error }),
        ...(result.targets === undefined ? {} : { targets: result.targets, targetsTotal: result.targetsTotal })
      }))
    } else {
      const label = result.dryRun ? `${result.batch} (dry run)` : result.batch
      yield* Console.log(`${label} ${result.outcome}${result.reason ? ` (${result.reason})` : ""}: ${JSON.stringify(result.summary)}`)
      if (result.error !== undefined) yield* Console.log(`  error: ${result.error}`)
      if (result.targets !== undefined && result.targets.length > 0) {
        yield* Console.log(`  would change ${result.targetsTotal} (first ${result.targets.length} listed):`)
        for (const target of result.targets) yield* Console.log(`    ${target}`)
      }
    }
    if (result.outcome === "failed" || result.outcome === "timed_out") process.exitCode = 1
  })

const run = Command.make(
  "run",
  {
    batch: batchArgument,
    dryRun: Flag.Boolean("dry-run").pipe(Flag.withDescription("Report what would change (up to 100 targets listed); change nothing"), Flag.withDefault(false)),
    json,
    now: instantFlag("now").pipe(Flag.withDescription("Judge thresholds at this instant: ISO-8601, or a duration ago (1h); a future one only with --dry-run"), Flag.optional),
    budget: durationFlag("budget").pipe(Flag.withDescription("Override the batch's time budget (30s, 5m, \"30 seconds\")"), Flag.optional),
    force: Flag.Boolean("force").pipe(Flag.withDescription("Run a batch listed in SWEEPER_DISABLED_BATCHES"), Flag.withDefault(false))
  },
  Effect.fn("Cli.run")(function*({ batch: name, dryRun, json, now, budget, force }) {
    yield* findBatch(name)
    // Every batch's variables are checked, not only this one's: bad configuration is refused at the edge.
    const configured = yield* configureBatches(batches).pipe(Effect.provide(SweeperConfig.layer))
    const batch = configured.find((c) => c.batch.name === name)!.batch
    const budgetOverride = Option.getOrUndefined(budget)
    const asOf = Option.getOrUndefined(now)
    if (refusesLookAhead(asOf, new Date(DateTime.toEpochMillis(yield* DateTime.now)), dryRun)) {
      return yield* new InvalidFlag({ flag: "--now", message: `${asOf!.toISOString()} is in the future; only a --dry-run may look ahead` })
    }

    const remote = yield* remoteSupervisor
    if (Option.isSome(remote)) {
      if (asOf !== undefined || budgetOverride !== undefined) {
        return yield* new InvalidFlag({
          flag: asOf !== undefined ? "--now" : "--budget",
          message: "not available while the supervisor holds the embedded database; stop it, or set DATABASE_URL"
        })
      }
      const result = yield* callSupervisor(remote.value, "POST", `/api/batches/${encodeURIComponent(name)}/run`, { dryRun, force })
      return yield* printRun(result as RunResult, json)
    }

    const execute = Effect.gen(function*() {
      const settings = yield* SweeperConfig
      if (settings.disabledBatches.includes(batch.name) && !force) return yield* new BatchDisabled({ name: batch.name })
      yield* Effect.logInfo("Backends", describeBackends(settings))
      return yield* runBatch(batch, { trigger: "manual", dryRun, budget: budgetOverride, asOf })
      // A dry run only reads, so it never migrates (SPEC §8.1).
    }).pipe(Effect.provide(dryRun ? ReadOnlyAppLayer : AppLayer))
    yield* printRun(yield* execute, json)
  })
).pipe(Command.withDescription("Run one batch once, now, through the run guard"))

// --- schema (SPEC §8.1): `migrate` is the one command that always gets a bare client, so that
// `--plan` can list pending migrations without applying any.
const migrateCommand = Command.make(
  "migrate",
  {
    plan: Flag.Boolean("plan").pipe(Flag.withDescription("List pending migrations; apply nothing"), Flag.withDefault(false))
  },
  Effect.fn("Cli.migrate")(function*({ plan }) {
    const settings = yield* SweeperConfig
    const migrateOrPlan = Effect.gen(function*() {
      const { mode, source } = yield* detectSchemaMode(settings.schema)
      const modeNote = `${mode} mode, ${source === "detected" ? "detected" : "from SWEEPER_SCHEMA"}`
      if (plan) {
        const pending = yield* pendingMigrations(mode)
        return yield* Console.log(pending.length === 0 ? `Schema is up to date (${modeNote})` : `Pending (${modeNote}): ${pending.join(", ")}`)
      }
      const applied = yield* migrateWith(settings.schema)
      yield* Console.log(applied.length === 0
        ? `Schema is up to date (${modeNote})`
        : `Applied (${modeNote}): ${applied.map(([id, n]) => `${String(id).padStart(4, "0")}_${n}`).join(", ")}`)
    })
    return yield* Effect.provide(migrateOrPlan, databaseClientLayer(settings))
  }, Effect.provide(SweeperConfig.layer))
).pipe(Command.withDescription("Apply pending database migrations (--plan: only list them)"))

const printEvent = (event: StoredEvent, asJson: boolean) =>
  Console.log(asJson
    ? JSON.stringify(event)
    : `${event.occurredAt.toISOString()} ${event.stream} ${event.type} ${JSON.stringify(event.data)}${event.runId ? ` run=${event.runId}` : ""}`)

const events = Command.make(
  "events",
  {
    stream: Flag.String("stream").pipe(Flag.withDescription("Exact stream, e.g. build:123"), Flag.optional),
    type: Flag.String("type").pipe(Flag.withDescription("Event type, e.g. BuildDropped"), Flag.optional),
    run: Flag.String("run").pipe(Flag.withDescription("Run id"), Flag.optional),
    since: instantFlag("since").pipe(Flag.withDescription("From this instant on: ISO-8601, or a duration ago (1h, 30m, 7d)"), Flag.optional),
    until: instantFlag("until").pipe(Flag.withDescription("Before this instant: ISO-8601, or a duration ago (1h, 30m, 7d)"), Flag.optional),
    limit: intFlag("limit", 1, MAX_EVENTS).pipe(Flag.withDescription(`At most this many, the newest (1 to ${MAX_EVENTS})`), Flag.withDefault(50)),
    json
  },
  Effect.fn("Cli.events")(function*({ stream, type, run, since, until, limit, json }) {
    const sinceDate = Option.getOrUndefined(since)
    const untilDate = Option.getOrUndefined(until)
    const filter = {
      stream: Option.getOrUndefined(stream),
      type: Option.getOrUndefined(type),
      runId: Option.getOrUndefined(run),
      since: sinceDate,
      until: untilDate,
      newestFirst: true,
      limit
    }
    const remote = yield* remoteSupervisor
    const found: ReadonlyArray<StoredEvent> = Option.isSome(remote)
      ? ((yield* callSupervisor(remote.value, "GET", `/api/events?${new URLSearchParams({
        ...(filter.stream === undefined ? {} : { stream: filter.stream }),
        ...(filter.type === undefined ? {} : { type: filter.type }),
        ...(filter.runId === undefined ? {} : { run: filter.runId }),
        ...(sinceDate === undefined ? {} : { since: sinceDate.toISOString() }),
        ...(untilDate === undefined ? {} : { until: untilDate.toISOString() }),
        limit: String(limit)
      })}`)) as Array<StoredEvent & { occurredAt: string }>).map((e) => ({ ...e, occurredAt: new Date(e.occurredAt) }))
      : yield* Effect.gen(function*() {
        const log = yield* EventLog
        return yield* log.query(filter)
      }).pipe(Effect.provide(ReadOnlyAppLayer))
    for (const event of [...found].reverse()) yield* printEvent(event, json)
  })
).pipe(Command.withDescription("Show recorded events, newest last"))

/**
 * `sweeper events prune --before T`: the prune-events batch run once, through the run guard (its
 * lease, fence, pages and EventsPruned), with the cutoff at exactly T — i.e. judged at
 * T + SWEEPER_EVENT_RETENTION. A T inside the retention period is refused: the events of the last
 * retention period are never pruned. Runs even when prune-events is in SWEEPER_DISABLED_BATCHES:
 * asking for it by name is the operator's explicit decision.
 */
const eventsPrune = Command.make(
  "prune",
  {
    before: instantFlag("before").pipe(Flag.withDescription("Prune events strictly older than this instant: ISO-8601, or a duration ago (90d); at least SWEEPER_EVENT_RETENTION ago")),
    dryRun: Flag.Boolean("dry-run").pipe(Flag.withDescription("Report how many events would be pruned; delete nothing"), Flag.withDefault(false)),
    json
  },
  Effect.fn("Cli.eventsPrune")(function*({ before, dryRun, json }) {
    const cutoff = before
    const settings = yield* SweeperConfig
    const configured = yield* configureBatches(batches)
    const batch = configured.find((c) => c.batch.name === PruneEvents.name)!.batch
    const retentionMs = Duration.toMillis(settings.eventRetention)
    const newestAllowed = DateTime.toEpochMillis(yield* DateTime.now) - retentionMs
    if (cutoff.getTime() > newestAllowed) {
      return yield* new InvalidFlag({
        flag: "--before",
        message: `${before.toISOString()} is within the retention period (SWEEPER_EVENT_RETENTION ${Duration.format(settings.eventRetention)}): only events before ${new Date(newestAllowed).toISOString()} may be pruned`
      })
    }
    const asOf = new Date(cutoff.getTime() + retentionMs)
    const remote = yield* remoteSupervisor
    if (Option.isSome(remote)) {
      const result = yield* callSupervisor(remote.value, "POST", `/api/batches/${PruneEvents.name}/run`, { dryRun, force: true, now: asOf.toISOString() })
      return yield* printRun(result as RunResult, json)
    }
    const result = yield* runBatch(batch, { trigger: "manual", dryRun, asOf }).pipe(
      // A dry run only counts, so it never migrates (SPEC §8.1).
      Effect.provide(dryRun ? ReadOnlyAppLayer : AppLayer)
    )
    yield* printRun(result, json)
  }, Effect.provide(SweeperConfig.layer))
).pipe(Command.withDescription("Delete events older than --before (outside the retention period), keeping those batch state is folded from"))

/** Every batch's view, computed here from the database (no supervisor involved). */
const localViews = Effect.gen(function*() {
  const settings = yield* SweeperConfig
  const now = new Date(DateTime.toEpochMillis(yield* DateTime.now))
  const views: Array<BatchView> = []
  for (const { batch, cronText, cron, disabled } of yield* configureBatches(batches)) {
    views.push(batchView({
      batch,
      cronText,
      cron,
      timezone: settings.timezone,
      running: false,
      disabled,
      history: yield* loadHistory(batch.name)
    }, now))
  }
  return views
}).pipe(Effect.provide(ReadOnlyAppLayer))

const ago = (iso: string | null, now: number) => {
  if (iso === null) return "never"
  const seconds = Math.max(0, Math.round((now - Date.parse(iso)) / 1000))
  return seconds < 120 ? `${seconds}s ago` : seconds < 7200 ? `${Math.round(seconds / 60)}m ago` : seconds < 172800 ? `${Math.round(seconds / 3600)}h ago` : `${Math.round(seconds / 86400)}d ago`
}

/** The state with its detail: who paused and when, until when the breaker stays open. */
export const stateDetail = (view: BatchView) => {
  switch (view.state) {
    case "paused":
      return `paused${view.paused?.by ? ` by ${view.paused.by}` : ""}${view.paused?.at ? ` at ${view.paused.at}` : ""}`
    case "breaker_open":
      return `breaker open until ${view.breaker.until}`
    case "disabled":
      return "disabled (SWEEPER_DISABLED_BATCHES)"
    default:
      return view.state
  }
}

const status = Command.make(
  "status",
  { json },
  Effect.fn("Cli.status")(function*({ json }) {
    const remote = yield* remoteSupervisor
    const views = Option.isSome(remote)
      ? (yield* callSupervisor(remote.value, "GET", "/api/batches")) as ReadonlyArray<BatchView>
      : yield* localViews
    if (json) return yield* Console.log(JSON.stringify(views))
    const now = DateTime.toEpochMillis(yield* DateTime.now)
    const rows = [
      ["BATCH", "STATE", "SCHEDULE", "NEXT TICK", "LAST RUN", "OUTCOME", "FAILURES"],
      ...views.map((v) => [
        v.name,
        stateDetail(v),
        `${v.cronInWords} (${v.timezone})`,
        v.nextTick ?? "-",
        ago(v.lastRun?.finishedAt ?? null, now),
        v.lastOutcome ?? "-",
        String(v.consecutiveFailures)
      ])
    ]
    const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)))
    for (const row of rows) yield* Console.log(row.map((cell, i) => cell.padEnd(widths[i]!)).join("  ").trimEnd())
    for (const v of views) {
      if (v.lastRun?.error) yield* Console.log(`${v.name}: last error: ${v.lastRun.error}`)
      // A RunStarted with no RunFinished: running, or killed (the next run closes it as abandoned).
      if (v.openRun !== null) {
        yield* Console.log(`${v.name}: run ${v.openRun.runId} started ${v.openRun.startedAt} on ${v.openRun.node} ${v.openRun.overdue ? "never finished: killed; the next run closes it as abandoned" : "has not finished: running, or killed"}`)
      }
    }
  })
).pipe(Command.withDescription("Each batch's state, schedule, next tick and last run"))

const pauseOrResume = (action: "pause" | "resume") =>
  Command.make(
    action,
    { batch: batchArgument },
    Effect.fn(`Cli.${action}`)(function*({ batch: name }) {
      const batch = yield* findBatch(name)
      const by = `cli:${userInfo().username}`
      const remote = yield* remoteSupervisor
      if (Option.isSome(remote)) {
        yield* callSupervisor(remote.value, "POST", `/api/batches/${encodeURIComponent(batch.name)}/${action}`)
      } else {
        // The event is the state: every supervisor folds it (a running one on its next start).
        yield* Effect.gen(function*() {
          const log = yield* EventLog
          yield* log.append(action === "pause" ? new BatchPaused({ batch: batch.name, by }) : new BatchResumed({ batch: batch.name, by })).pipe(
            Effect.catchCause((cause) => Effect.fail(new PauseNotRecorded({ batch: batch.name, action, detail: describeError(Cause.squash(cause)) })))
          )
        }).pipe(Effect.provide(AppLayer))
      }
      yield* Console.log(`${batch.name} ${action === "pause" ? "paused" : "resumed"}`)
    })
  ).pipe(Command.withDescription(action === "pause" ? "Stop a batch's scheduled ticks until resumed (manual runs still go)" : "Let a paused batch's ticks run again"))

/** Logs the schedule table and where the HTTP server listens, once everything is up. */
const Announce = Layer.effectDiscard(Effect.gen(function*() {
  const scheduler = yield* Scheduler
  const server = yield* HttpServer.HttpServer
  for (const batch of yield* scheduler.snapshots) {
    yield* Effect.logInfo(`Scheduled ${batch.name}`, {
      cron: batch.cron,
      timezone: batch.timezone,
      state: batch.status,
      nextTick: batch.nextTick?.toISOString() ?? null,
      lastOutcome: batch.history.lastRun?.outcome ?? null
    })
  }
  const url = HttpServer.formatAddress(server.address)
  yield* Effect.logInfo(`HTTP listening on ${url}`, {
    endpoints: ["/healthz", "/readyz", "/metrics", "/api/batches", "/api/runs", "/api/events", "/"]
  })
  // The CLI on the embedded default cannot open the database this process holds; it finds the
  // supervisor here and asks it over HTTP instead.
  const settings = yield* SweeperConfig
  if (Option.isNone(settings.databaseUrl)) yield* publishAddress(settings.dataDir, url)
  yield* Effect.addFinalizer(() => Effect.logInfo("Shutting down"))
  supervisor.started = true
}))

export const Supervisor = Announce.pipe(
  Layer.provideMerge(HttpLive),
  Layer.provideMerge(schedulerLayer(batches)),
  Layer.provideMerge(AppLayer)
)

const start = Command.make(
  "start",
  {},
  Effect.fn("Cli.start")(function*() {
    const settings = yield* SweeperConfig
    // Refuse bad per-batch variables before opening any database (the scheduler checks them the same way).
    yield* configureBatches(batches)
    const embedded = Option.isNone(settings.databaseUrl) && !redisConfigured(settings)
    yield* Effect.logInfo(
      embedded
        ? "Sweeper starting on the embedded default (no DATABASE_URL / REDIS_URL): PGlite + in-memory Redis"
        : "Sweeper starting",
      describeBackends(settings)
    )
    return yield* Layer.launch(Supervisor)
  }, Effect.provide(SweeperConfig.layer))
).pipe(Command.withDescription("Run the supervisor: every batch on its schedule, plus the HTTP server"))

// --- the simulator (src/simulator): `simulate` against the configured backends, `demo` for a newcomer.

/** The supervisor with the simulator running inside it, printing the dashboard's URL on stdout. */
const superviseWithSimulator = (options: SimulateOptions) =>
  Layer.effectDiscard(Effect.gen(function*() {
    const server = yield* HttpServer.HttpServer
    yield* Console.log(`Dashboard: ${HttpServer.formatAddress(server.address)}/`)
    yield* Effect.forkScoped(simulate(options).pipe(Effect.provide(SimulatorLive)))
  })).pipe(Layer.provide(Supervisor))

const simulationFlags = {
  rate: intFlag("rate", 1, MAX_RATE).pipe(Flag.withDescription(`Things each scenario makes per second (1 to ${MAX_RATE})`), Flag.withDefault(1)),
  scenario: Flag.String("scenario").pipe(
    Flag.withDescription("all, or a comma list of: exports, builds, uploads, rebalances, throttled"),
    Flag.withDefault("all")
  ),
  duration: durationFlag("duration").pipe(Flag.withDescription("Stop making things after this long (30s, 5m); default: until stopped"), Flag.optional)
}

const simulationOptions = Effect.fn("Cli.simulationOptions")(function*(flags: { rate: number; scenario: string; duration: Option.Option<Duration.Duration> }) {
  const scenarios = yield* parseScenarios(flags.scenario).pipe(Effect.mapError((e) => new InvalidFlag({ flag: "--scenario", message: e.message })))
  const duration = Option.getOrUndefined(flags.duration)
  return { scenarios, rate: flags.rate, ...(duration === undefined ? {} : { duration }) } satisfies SimulateOptions
})

/**
 * The simulator writes GitLab's tables and consumes its queues: never on a real GitLab's database.
 * Asked before anything migrates, so a refused run leaves no table behind.
 */
const refuseGitLabDatabase = Effect.gen(function*() {
  const settings = yield* SweeperConfig
  if (Option.isNone(settings.databaseUrl)) return
  const { mode } = yield* detectSchemaMode(settings.schema).pipe(Effect.provide(databaseClientLayer(settings)))
  if (mode === "gitlab") {
    return yield* new InvalidConfig({
      variable: "DATABASE_URL",
      message: "this database's platform tables belong to a GitLab (gitlab schema mode); the simulator only plays GitLab on a standalone database"
    })
  }
})

const simulateCommand = Command.make(
  "simulate",
  {
    ...simulationFlags,
    supervise: Flag.Boolean("supervise").pipe(Flag.withDescription("Also run the supervisor in this process (always so on the embedded default)"), Flag.withDefault(false))
  },
  Effect.fn("Cli.simulate")(function*(flags) {
    const options = yield* simulationOptions(flags)
    const settings = yield* SweeperConfig
    yield* configureBatches(batches)
    yield* refuseGitLabDatabase
    // The embedded database and Redis live in one process: the simulator must be that process.
    if ((Option.isNone(settings.databaseUrl) && !redisConfigured(settings)) || flags.supervise) {
      yield* Effect.logInfo("Simulating with the supervisor in this process", describeBackends(settings))
      return yield* Layer.launch(superviseWithSimulator(options))
    }
    yield* Effect.logInfo("Simulating against the configured backends", describeBackends(settings))
    // What was made goes to stdout also when stopped by a signal, not only after --duration.
    const ledger = emptyLedger()
    yield* simulate({ ...options, ledger }).pipe(
      Effect.provide(SimulatorLive),
      Effect.provide(AppLayer),
      Effect.onExit((exit) =>
        Exit.isSuccess(exit) || Cause.hasInterruptsOnly(exit.cause) ? Console.log(JSON.stringify(ledgerCounts(ledger))) : Effect.void)
    )
  }, Effect.provide(SweeperConfig.layer))
).pipe(Command.withDescription("Play the GitLab around Sweeper: stuck exports, builds, uploads, rebalances, throttled jobs"))

/**
 * What `npm run demo` sets unless the environment already does: every batch every few seconds, a
 * local object store and a concurrency limit for the simulated worker, a fresh data directory, any
 * free port. The stuck things themselves are back-dated by the simulator, so SPEC's thresholds hold.
 */
export const demoEnvironment = (dataDir: string): Record<string, string> => ({
  SWEEPER_DATA_DIR: dataDir,
  SWEEPER_HTTP_PORT: "0",
  // Ctrl-C should end a demo promptly; concurrency-limit-resume is nearly always mid-run in it.
  SWEEPER_SHUTDOWN_GRACE: "5 seconds",
  SWEEPER_OBJECT_STORAGE: JSON.stringify({ uploads: join(dataDir, "objects", "uploads") }),
  SWEEPER_CONCURRENCY_LIMITS: JSON.stringify({ "Releases::CreateEvidenceWorker": { limit: 2 } }),
  [cronVariable("stuck-export-jobs")]: "*/5 * * * * *",
  [cronVariable("drop-canceling-builds")]: "*/5 * * * * *",
  [cronVariable("delete-stale-direct-uploads")]: "*/5 * * * * *",
  [cronVariable("reschedule-stuck-issue-rebalances")]: "*/5 * * * * *",
  [cronVariable("concurrency-limit-resume")]: "*/2 * * * * *"
})

const demo = Command.make(
  "demo",
  { rate: simulationFlags.rate },
  Effect.fn("Cli.demo")(function*({ rate }) {
    // A fresh directory per demo unless one is given; ours is removed when the demo stops.
    const own = process.env.SWEEPER_DATA_DIR === undefined ? mkdtempSync(join(tmpdir(), "sweeper-demo-")) : undefined
    const env = { ...demoEnvironment(own ?? process.env.SWEEPER_DATA_DIR!), ...process.env } as Record<string, string>
    const options = yield* simulationOptions({ rate, scenario: "all", duration: Option.none() })
    yield* Console.log(`Sweeper demo: the supervisor and a simulated GitLab in one process, data under ${env.SWEEPER_DATA_DIR}`)
    return yield* Effect.gen(function*() {
      const settings = yield* SweeperConfig
      yield* configureBatches(batches)
      yield* refuseGitLabDatabase
      if (Option.isSome(settings.databaseUrl) || redisConfigured(settings)) {
        yield* Effect.logInfo("Demo on the configured backends", describeBackends(settings))
      }
      return yield* Layer.launch(superviseWithSimulator(options))
    }).pipe(
      Effect.provide(SweeperConfig.layer),
      Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromEnv({ env, preserveEmptyStrings: true })),
      Effect.ensuring(Effect.sync(() => {
        if (own !== undefined) rmSync(own, { recursive: true, force: true })
      }))
    )
  })
).pipe(Command.withDescription("The supervisor plus a simulated GitLab, fast crons: watch all five repairs on the dashboard"))

export const sweeper = Command.make("sweeper").pipe(
  Command.withDescription("Finds and repairs stuck state in a GitLab-style platform"),
  Command.withSubcommands([start, run, status, pauseOrResume("pause"), pauseOrResume("resume"), migrateCommand, events.pipe(Command.withSubcommands([eventsPrune])), doctorCommand, simulateCommand, demo])
)

export const cli = Effect.suspend(() => Command.runWith(sweeper, { version: "0.1.0" })(attachDashedValues(process.argv.slice(2))))
