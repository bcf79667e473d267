/**
 * The composition root of the long-running process: the platform's backends (supervisor/App.ts, which
 * chooses them by configuration), the scheduler over the batch registry, the HTTP server, and the
 * announcement that they are up — once, here, for `start`, `simulate --supervise` and `demo`. The
 * CLI's one-off commands take the same backends through Operator.ts.
 */
import * as Console from "effect/Console"
import * as Effect from "effect/Effect"
import * as HttpServer from "effect/http/HttpServer"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import { createServer } from "node:net"
import { join } from "node:path"
import { SweeperConfig } from "../config/Config.ts"
import { InvalidConfig } from "../domain/Errors.ts"
import { cronVariable } from "../domain/Schedule.ts"
import { HttpLive } from "../http/Http.ts"
import { detectCiSchemaMode, detectSchemaMode } from "../layers/postgres/DatabaseSchema.ts"
import { batches } from "../programs/index.ts"
import type { SimulateOptions } from "../simulator/Simulator.ts"
import { AppLayer, databaseClientLayer } from "../supervisor/App.ts"
import { Scheduler, schedulerLayer } from "../supervisor/Scheduler.ts"
import { publishAddress } from "../supervisor/SupervisorAddress.ts"

/** Set once the supervisor is up: an interrupt (SIGTERM/SIGINT) after that is a graceful exit 0. */
export const supervisor = { started: false }

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

/** The HTTP port is taken by another process: said before anything opens or migrates, exit 2. */
export class PortInUse extends Schema.TaggedError<PortInUse>()("PortInUse", {
  address: Schema.String,
  port: Schema.Number,
  /** The system's refusal: EADDRINUSE, or e.g. EACCES for a privileged port. */
  code: Schema.String
}) {
  override get message() {
    return `${this.address} ${
      this.code === "EADDRINUSE" ? "is already in use" : `cannot be listened on (${this.code})`
    } ` +
      `(SWEEPER_HTTP_PORT=${this.port}): stop what listens there, or set SWEEPER_HTTP_PORT to a free port (0: any free one)`
  }
}

/**
 * Tries the configured address once and lets it go. The server binds it only after the databases
 * are open and migrated: a taken port found then cost every migration and ended in effect's
 * ServeError with an empty message. (Another process may still take it in between; that is rare.)
 */
const PortFree = Layer.effectDiscard(Effect.gen(function*() {
  const { httpHost: host, httpPort: port } = yield* SweeperConfig
  if (port === 0) return
  const refused = yield* Effect.callback<string | undefined>((resume) => {
    const probe = createServer()
    probe.once("error", (error: NodeJS.ErrnoException) => resume(Effect.succeed(error.code ?? error.message)))
    probe.listen({ host, port, exclusive: true }, () => probe.close(() => resume(Effect.succeed(undefined))))
  })
  if (refused !== undefined) {
    const address = host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`
    return yield* new PortInUse({ address, port, code: refused })
  }
}))

export const Supervisor = Announce.pipe(
  Layer.provideMerge(HttpLive),
  Layer.provideMerge(schedulerLayer(batches)),
  Layer.provideMerge(AppLayer),
  Layer.provideMerge(PortFree)
)

/** The supervisor with the simulator running inside it, printing the dashboard's URL on stdout. */
export const superviseWithSimulator = (
  options: SimulateOptions,
  announce: (url: string) => Effect.Effect<void> = () => Effect.void
) =>
  Layer.effectDiscard(Effect.gen(function*() {
    const server = yield* HttpServer.HttpServer
    const url = `${HttpServer.formatAddress(server.address)}/`
    yield* Console.log(`Dashboard: ${url}`)
    yield* announce(url)
    // Imported here, not at the top: `start` never runs it, and its modules would stay loaded (idle RSS).
    const { simulate, SimulatorLive } = yield* Effect.promise(() => import("../simulator/Simulator.ts"))
    yield* Effect.forkScoped(simulate(options).pipe(Effect.provide(SimulatorLive)))
  })).pipe(Layer.provide(Supervisor))

/**
 * The simulator writes GitLab's tables and consumes its queues: never on a real GitLab's database,
 * main or ci (GitLab's ci database is told by its builds table). Asked before anything migrates, so
 * a refused run leaves no table behind.
 */
export const refuseGitLabDatabase = Effect.gen(function*() {
  const settings = yield* SweeperConfig
  if (Option.isNone(settings.databaseUrl)) return
  const databases = [
    { variable: "DATABASE_URL", client: databaseClientLayer(settings), detect: detectSchemaMode },
    ...Option.toArray(settings.ciDatabaseUrl).map((url) => ({
      variable: "CI_DATABASE_URL",
      client: databaseClientLayer({ ...settings, databaseUrl: Option.some(url) }),
      detect: detectCiSchemaMode
    }))
  ]
  for (const { client, detect, variable } of databases) {
    const { mode } = yield* detect(settings.schema).pipe(Effect.provide(client))
    if (mode === "gitlab") {
      return yield* new InvalidConfig({
        variable,
        message:
          "this database's platform tables belong to a GitLab (gitlab schema mode); the simulator only plays GitLab on a standalone database"
      })
    }
  }
})

/**
 * What `npm run demo` sets unless the environment already does: every batch every few seconds, a
 * local object store and a concurrency limit for the simulated worker, a fresh data directory, any
 * free port. The stuck things themselves are back-dated by the simulator, so GitLab's own thresholds hold.
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
  [cronVariable("drop-pending-builds")]: "*/5 * * * * *",
  [cronVariable("drop-running-builds")]: "*/5 * * * * *",
  [cronVariable("drop-scheduled-builds")]: "*/5 * * * * *",
  [cronVariable("delete-stale-direct-uploads")]: "*/5 * * * * *",
  [cronVariable("reschedule-stuck-issue-rebalances")]: "*/5 * * * * *",
  [cronVariable("concurrency-limit-resume")]: "*/2 * * * * *"
})
