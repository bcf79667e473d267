/**
 * The `sweeper` command line. Every command builds the same AppLayer the supervisor uses, so a
 * one-off run is the scheduled run's program under the same run guard.
 */
import { Console, DateTime, Duration, Effect, Layer, Option, Schema } from "effect"
import { HARD_TIMEOUT_GRACE } from "../domain/Batch.ts"
import { HttpServer } from "effect/http"
import { Argument, Command, Flag } from "effect/cli"
import { AppLayer, describeBackends } from "../layers/App.ts"
import { configureBatches, SweeperConfig } from "../layers/Config.ts"
import { migrate } from "../layers/Migrations.ts"
import { batches, batchNames, findBatch } from "../programs/index.ts"
import { EventLog } from "../services/EventLog.ts"
import { startingAt } from "./Clocks.ts"
import { HttpLive } from "./Http.ts"
import { runBatch } from "./RunGuard.ts"
import { loadHistory, Scheduler, schedulerLayer } from "./Scheduler.ts"

/** Set once the supervisor is up: an interrupt (SIGTERM/SIGINT) after that is a graceful exit 0. */
export const supervisor = { started: false }

export class InvalidFlag extends Schema.TaggedError<InvalidFlag>()("InvalidFlag", {
  flag: Schema.String,
  message: Schema.String
}) {}

const DURATION = /^(\d+(?:\.\d+)?)\s*(ms|s|m|h)$/

/** `30s`, `250ms`, `5m`, `1h`. */
export const parseDuration = (input: string): Option.Option<Duration.Duration> => {
  const match = DURATION.exec(input.trim())
  if (match === null) return Option.none()
  const amount = Number(match[1])
  switch (match[2]) {
    case "ms":
      return Option.some(Duration.millis(amount))
    case "s":
      return Option.some(Duration.seconds(amount))
    case "m":
      return Option.some(Duration.minutes(amount))
    default:
      return Option.some(Duration.hours(amount))
  }
}

const parseInstant = (flag: string, input: string) => {
  const date = new Date(input)
  return Number.isNaN(date.getTime()) || !/^\d{4}-\d{2}-\d{2}/.test(input)
    ? Effect.fail(new InvalidFlag({ flag, message: `expected an ISO-8601 instant, got "${input}"` }))
    : Effect.succeed(date)
}

const json = Flag.Boolean("json").pipe(Flag.withDescription("Print one JSON object on stdout"), Flag.withDefault(false))

const run = Command.make(
  "run",
  {
    batch: Argument.String("batch").pipe(Argument.withDescription(`One of: ${batchNames.join(", ")}`)),
    dryRun: Flag.Boolean("dry-run").pipe(Flag.withDescription("Report what would change; change nothing"), Flag.withDefault(false)),
    json,
    now: Flag.String("now").pipe(Flag.withDescription("Start this run's clock at an ISO-8601 instant"), Flag.optional),
    budget: Flag.String("budget").pipe(Flag.withDescription("Override the batch's time budget (e.g. 30s, 5m)"), Flag.optional)
  },
  Effect.fn("Cli.run")(function*({ batch: name, dryRun, json, now, budget }) {
    yield* findBatch(name)
    // Every batch's variables are checked, not only this one's: bad configuration is refused at the edge.
    const configured = yield* configureBatches(batches).pipe(Effect.provide(SweeperConfig.layer))
    const batch = configured.find((c) => c.batch.name === name)!.batch
    const budgetOverride = Option.isSome(budget)
      ? yield* Option.match(parseDuration(budget.value), {
        onNone: () => Effect.fail(new InvalidFlag({ flag: "--budget", message: `expected a duration like 30s, got "${budget.value}"` })),
        onSome: Effect.succeed
      })
      : undefined
    const startAt = Option.isSome(now) ? Option.some(yield* parseInstant("--now", now.value)) : Option.none<Date>()

    const execute = Effect.gen(function*() {
      const settings = yield* SweeperConfig
      yield* Effect.logInfo("Backends", describeBackends(settings))
      return yield* runBatch(batch, { trigger: "manual", dryRun, budget: budgetOverride })
    }).pipe(Effect.provide(AppLayer))
    const result = yield* (Option.isSome(startAt) ? startingAt(startAt.value)(execute) : execute)

    if (json) {
      yield* Console.log(JSON.stringify({ batch: result.batch, runId: result.runId, outcome: result.outcome, summary: result.summary }))
    } else {
      yield* Console.log(`${result.batch} ${result.outcome}${result.reason ? ` (${result.reason})` : ""}: ${JSON.stringify(result.summary)}`)
    }
    if (result.outcome === "failed" || result.outcome === "timed_out") process.exitCode = 1
  })
).pipe(Command.withDescription("Run one batch once, now, through the run guard"))

const migrateCommand = Command.make(
  "migrate",
  {},
  Effect.fn("Cli.migrate")(function*() {
    const applied = yield* migrate
    yield* Console.log(applied.length === 0 ? "Schema is up to date" : `Applied: ${applied.map(([id, n]) => `${id}_${n}`).join(", ")}`)
  }, Effect.provide(AppLayer))
).pipe(Command.withDescription("Apply pending database migrations"))

const events = Command.make(
  "events",
  {
    stream: Flag.String("stream").pipe(Flag.withDescription("Exact stream, e.g. build:123"), Flag.optional),
    type: Flag.String("type").pipe(Flag.withDescription("Event type, e.g. BuildDropped"), Flag.optional),
    run: Flag.String("run").pipe(Flag.withDescription("Run id"), Flag.optional),
    since: Flag.String("since").pipe(Flag.withDescription("ISO-8601 instant"), Flag.optional),
    limit: Flag.Int("limit").pipe(Flag.withDefault(50)),
    json
  },
  Effect.fn("Cli.events")(function*({ stream, type, run, since, limit, json }) {
    const log = yield* EventLog
    const found = yield* log.query({
      stream: Option.getOrUndefined(stream),
      type: Option.getOrUndefined(type),
      runId: Option.getOrUndefined(run),
      since: Option.isSome(since) ? yield* parseInstant("--since", since.value) : undefined,
      newestFirst: true,
      limit
    })
    for (const event of [...found].reverse()) {
      yield* Console.log(json
        ? JSON.stringify(event)
        : `${event.occurredAt.toISOString()} ${event.stream} ${event.type} ${JSON.stringify(event.data)}${event.runId ? ` run=${event.runId}` : ""}`)
    }
  }, Effect.provide(AppLayer))
).pipe(Command.withDescription("Show recorded events, newest last"))

const status = Command.make(
  "status",
  { json },
  Effect.fn("Cli.status")(function*({ json }) {
    const rows = []
    const now = DateTime.toDateUtc(yield* DateTime.now)
    for (const batch of batches) {
      const history = yield* loadHistory(batch.name)
      const open = history.openRun
      rows.push({
        batch: batch.name,
        state: history.paused ? "paused" : "active",
        lastOutcome: history.lastRun?.outcome ?? null,
        lastRunAt: history.lastRun?.finishedAt.toISOString() ?? null,
        lastSuccessAt: history.lastSuccessAt?.toISOString() ?? null,
        consecutiveFailures: history.consecutiveFailures,
        lastSummary: history.lastRun?.summary ?? null,
        // A run with a RunStarted and no RunFinished: running, or killed (the next run closes it as
        // abandoned). Overdue once its budget + grace has passed: then it is certainly dead.
        openRun: open === undefined ? null : {
          runId: open.runId,
          startedAt: open.startedAt.toISOString(),
          node: open.node,
          overdue: now.getTime() - open.startedAt.getTime() > Duration.toMillis(Duration.sum(batch.budget, HARD_TIMEOUT_GRACE))
        }
      })
    }
    if (json) return yield* Console.log(JSON.stringify(rows))
    for (const row of rows) {
      yield* Console.log(
        `${row.batch.padEnd(36)} ${row.state.padEnd(7)} ${(row.lastOutcome ?? "never run").padEnd(10)} ${row.lastRunAt ?? ""}` +
          (row.consecutiveFailures > 0 ? `  (${row.consecutiveFailures} consecutive failures)` : "") +
          (row.openRun === null ? "" : row.openRun.overdue
            ? `  [run ${row.openRun.runId} started ${row.openRun.startedAt} on ${row.openRun.node} never finished: killed; the next run closes it as abandoned]`
            : `  [run ${row.openRun.runId} started ${row.openRun.startedAt} on ${row.openRun.node}: running, or killed]`)
      )
    }
  }, Effect.provide(AppLayer))
).pipe(Command.withDescription("Each batch's last run and outcome, folded from its events"))

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
  yield* Effect.logInfo(`HTTP listening on ${HttpServer.formatAddress(server.address)}`, {
    endpoints: ["/healthz", "/readyz", "/metrics", "/api/batches", "/"]
  })
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
    const embedded = Option.isNone(settings.databaseUrl) && Option.isNone(settings.redisUrl)
    yield* Effect.logInfo(
      embedded
        ? "Sweeper starting on the embedded default (no DATABASE_URL / REDIS_URL): PGlite + in-memory Redis"
        : "Sweeper starting",
      describeBackends(settings)
    )
    return yield* Layer.launch(Supervisor)
  }, Effect.provide(SweeperConfig.layer))
).pipe(Command.withDescription("Run the supervisor: every batch on its schedule, plus the HTTP server"))

export const sweeper = Command.make("sweeper").pipe(
  Command.withDescription("Finds and repairs stuck state in a GitLab-style platform"),
  Command.withSubcommands([start, run, status, migrateCommand, events])
)

export const cli = Command.run(sweeper, { version: "0.1.0" })
