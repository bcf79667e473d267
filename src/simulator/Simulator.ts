/**
 * Plays the GitLab around Sweeper (`sweeper simulate`, `npm run demo`, the soak test): each tick
 * (one second apart) every selected scenario makes `rate` things, some of them stuck the way GitLab's own failures
 * leave them, some healthy controls beside them that Sweeper must leave alone, and a Sidekiq-style
 * consumer runs what Sweeper enqueues. Everything goes through the platform's own formats, on
 * whichever backends the composition root built, and is written down in a `Ledger`.
 *
 * Scenarios:
 * - `exports`    an export worker: some finish, some die (status key gone, row left `started`),
 *                some are parallel exports that die inside the 6 h grace (must be left alone) or
 *                after it (back-dated), some are still running (status key alive);
 * - `builds`     builds stuck in `canceling` for two hours (back-dated), beside a build canceling
 *                for ten minutes and one running for two hours but updated ten minutes ago; and per
 *                tick, for the rest of the stuck-builds family, a build pending for two days and one
 *                running with no update for two hours, beside one pending for ten minutes; and a
 *                delayed build two hours past its time beside one due in ten minutes;
 * - `uploads`    direct uploads abandoned four hours ago (object written to the configured store:
 *                a local directory, S3 or Azure) beside fresh ones;
 * - `rebalances` issue rebalances whose rebalancer died (project or namespace in the running set,
 *                issues with tied and null positions), at most GitLab's 5 at a time;
 * - `throttled`  bursts of jobs of each concurrency-limited worker (and a few between bursts),
 *                which the consumer's throttling middleware defers once the worker is at its limit
 *                or has jobs deferred already.
 */
import type { PgClient } from "@effect/sql-pg"
import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Schema from "effect/Schema"
import type { SqlError } from "effect/sql/SqlError"
import { randomUUID } from "node:crypto"
import { SweeperConfig } from "../config/Config.ts"
import { workerKeys } from "../domain/ConcurrencyLimit.ts"
import { type Location, LOCATIONS } from "../domain/DirectUpload.ts"
import {
  MAX_NUMBER_OF_CONCURRENT_REBALANCES,
  RebalanceContainer,
  rebalanceMember,
  RUNNING_REBALANCES_KEY
} from "../domain/Rebalancing.ts"
import type { JobStatus } from "../services/JobStatus.ts"
import { runConsumer } from "./Consumer.ts"
import {
  gitlabConcurrencyLimitResume,
  gitlabDeleteStaleDirectUploads,
  gitlabDropCanceling,
  gitlabRescheduleStuckIssueRebalances,
  gitlabStuckCiJobs,
  gitlabStuckExportJobs,
  RefusedDrops
} from "./GitLabWorkers.ts"
import { emptyLedger, type Ledger, ledgerCounts } from "./Ledger.ts"
import { SimulatorObjects, SimulatorObjectsFromConfig } from "./Objects.ts"
import { enqueueBuild, queueTables, seedPipeline, trackRunning } from "./Pipelines.ts"
import {
  AGES,
  buildsTable,
  finishExportJob,
  killExportJob,
  pushJob,
  seedBuild,
  seedExportJob,
  seedIssues,
  seedPendingUpload,
  seedProject,
  stallRebalance
} from "./Seed.ts"
import { SimulatorStores, SimulatorStoresLive } from "./Stores.ts"

export const SCENARIOS = ["exports", "builds", "uploads", "rebalances", "throttled"] as const
export type Scenario = typeof SCENARIOS[number]

export class UnknownScenario extends Schema.TaggedError<UnknownScenario>()("UnknownScenario", {
  name: Schema.String,
  message: Schema.String
}) {}

/** `all`, one name, or a comma list of names. */
export const parseScenarios = (text: string): Effect.Effect<ReadonlyArray<Scenario>, UnknownScenario> => {
  const names = text.split(",").map((name) => name.trim()).filter((name) => name.length > 0)
  if (names.length === 0 || names.includes("all")) return Effect.succeed(SCENARIOS)
  const unknown = names.find((name) => !(SCENARIOS as ReadonlyArray<string>).includes(name))
  return unknown === undefined
    ? Effect.succeed([...new Set(names)] as ReadonlyArray<Scenario>)
    : Effect.fail(
      new UnknownScenario({
        name: unknown,
        message: `unknown scenario "${unknown}"; known: all, ${SCENARIOS.join(", ")}`
      })
    )
}

/** The worker the `throttled` scenario uses when none is configured. */
export const DEFAULT_THROTTLED_WORKER = "Releases::CreateEvidenceWorker"
/** Its limit, written to Redis as `current_limit` the way GitLab publishes a worker's limit. */
export const DEFAULT_THROTTLED_LIMIT = 2

export interface SimulateOptions {
  readonly scenarios: ReadonlyArray<Scenario>
  /** Things each scenario makes per tick. */
  readonly rate: number
  readonly tick?: Duration.Duration
  /** Stop making things after this long (the consumer keeps running); none: until interrupted. */
  readonly duration?: Duration.Duration
  /** Consumer threads and how long a throttled job runs. */
  readonly threads?: number
  readonly jobDuration?: Duration.Duration
  readonly ledger?: Ledger
  /**
   * Also play GitLab's own workers for every batch shadow mode can judge (GitLabWorkers.ts) this
   * often, for a Sweeper in shadow mode to be judged against; one canceling build made on the third
   * tick is one GitLab's drop refuses every time. None: GitLab's workers are off (Sweeper acts).
   */
  readonly gitlabWorkers?: { readonly every: Duration.Duration } | undefined
  /** The builds GitLab's drop refuses (filled by `produce`, read by GitLab's worker). */
  readonly refusedDrops?: Set<number> | undefined
}

/** Limited workers as the simulated GitLab sees them: configured ones, else the default one (published in Redis). */
const limitedWorkers = Effect.fn("Simulator.limitedWorkers")(function*() {
  const settings = yield* SweeperConfig
  const stores = yield* SimulatorStores
  const configured = Object.entries(settings.concurrencyLimits).filter(([, s]) => s.limit > 0)
  if (configured.length > 0) return Object.fromEntries(configured)
  yield* stores.set(
    "queuesMetadata",
    workerKeys(DEFAULT_THROTTLED_WORKER).currentLimit,
    String(DEFAULT_THROTTLED_LIMIT)
  )
  return { [DEFAULT_THROTTLED_WORKER]: { limit: DEFAULT_THROTTLED_LIMIT, queue: "default" } }
})

/** The location uploads go to: the first with a store configured (objects are written there), else `uploads`. */
const uploadLocation = (objects: SimulatorObjects["Service"]): Location =>
  LOCATIONS.find((location) => objects.hasStore(location)) ?? "uploads"

/** What the simulator needs beyond Sweeper's own services: the Redis stores and the object writer. */
export const SimulatorLive = Layer.mergeAll(SimulatorStoresLive, SimulatorObjectsFromConfig)

/**
 * Makes things each tick for `duration` (or until interrupted), then lets the export jobs of the
 * last tick meet their fate. Returns the ledger. Does not run the consumer (see `simulate`).
 */
export const produce = Effect.fn("Simulator.produce")(function*(options: SimulateOptions, ledger: Ledger) {
  const stores = yield* SimulatorStores
  const on = (scenario: Scenario) => options.scenarios.includes(scenario)
  const run = randomUUID().slice(0, 8)
  const home = yield* seedProject(`simulator-${run}`)
  const table = yield* buildsTable()
  const sides = on("builds")
    ? yield* queueTables()
    : { pending: false, running: false, sessions: false, pipelines: false }
  const limited = on("throttled") ? yield* limitedWorkers() : {}
  const location = uploadLocation(yield* SimulatorObjects)
  let n = 0
  /** Export jobs started last tick, to finish or kill this tick (a worker runs a while first). */
  let fates: Array<Effect.Effect<void, SqlError, PgClient.PgClient | JobStatus>> = []

  const exports = Effect.fn("Simulator.exports")(function*(now: number) {
    const due = fates
    fates = []
    for (const fate of due) yield* fate
    for (let i = 0; i < options.rate; i++) {
      // The first job of a run is one that dies, so a demo shows a failed export on its first run.
      const kind = n++ % 5
      switch (kind) {
        case 1: {
          const job = yield* seedExportJob({ projectId: home.projectId, createdAtMillis: now })
          fates.push(
            finishExportJob(job).pipe(Effect.tap(() => Effect.sync(() => ledger.exports.healthy.push(job.id))))
          )
          break
        }
        case 0: {
          const job = yield* seedExportJob({ projectId: home.projectId, createdAtMillis: now })
          fates.push(killExportJob(job).pipe(Effect.tap(() => Effect.sync(() => ledger.exports.stuck.push(job.id)))))
          break
        }
        case 2: {
          // Parallel, dies inside the 6 h grace: its relation exports may still be running.
          const job = yield* seedExportJob({
            projectId: home.projectId,
            createdAtMillis: now,
            relations: ["issues", "merge_requests"]
          })
          fates.push(killExportJob(job).pipe(Effect.tap(() => Effect.sync(() => ledger.exports.healthy.push(job.id)))))
          break
        }
        case 3: {
          const job = yield* seedExportJob({
            projectId: home.projectId,
            createdAtMillis: now - Duration.toMillis(AGES.oldParallelExport),
            relations: ["issues", "merge_requests"]
          })
          fates.push(killExportJob(job).pipe(Effect.tap(() => Effect.sync(() => ledger.exports.stuck.push(job.id)))))
          break
        }
        default: {
          // Still running: its status key stays.
          const job = yield* seedExportJob({ projectId: home.projectId, createdAtMillis: now })
          ledger.exports.healthy.push(job.id)
        }
      }
    }
  })

  /**
   * One build in its pipeline, with the rows GitLab gives it beside: a pending build its runner-queue
   * row, a running one its running-build row and runner session (when the ci database has them).
   */
  const build = Effect.fn("Simulator.build")(function*(spec: {
    readonly status: string
    readonly now: number
    readonly age: Duration.Duration
    readonly updatedAge?: Duration.Duration
    readonly scheduledAgeMillis?: number
    readonly pipelineId: number
  }) {
    const id = yield* seedBuild({
      projectId: home.projectId,
      status: spec.status,
      nowMillis: spec.now,
      ageMillis: Duration.toMillis(spec.age),
      ...(spec.updatedAge === undefined ? {} : { updatedAgeMillis: Duration.toMillis(spec.updatedAge) }),
      ...(spec.scheduledAgeMillis === undefined ? {} : { scheduledAgeMillis: spec.scheduledAgeMillis }),
      pipelineId: spec.pipelineId,
      table
    })
    if (spec.status === "pending" && sides.pending) yield* enqueueBuild(id, home.projectId)
    if (spec.status === "running" && sides.running && sides.sessions) yield* trackRunning(id, home.projectId, 7)
    return id
  })

  /**
   * Each tick's builds in two pipelines: one holding every stuck build (and a finished one), which
   * GitLab can finish only once Sweeper has dropped them all, and one holding the healthy controls,
   * which must stay running.
   */
  const builds = Effect.fn("Simulator.builds")(function*(now: number) {
    const stuckPipeline = sides.pipelines
      ? yield* seedPipeline({ projectId: home.projectId, nowMillis: now, builds: table })
      : 1
    const healthyPipeline = sides.pipelines
      ? yield* seedPipeline({ projectId: home.projectId, nowMillis: now, builds: table })
      : 1
    if (sides.pipelines) {
      ledger.pipelines.stuck.push(stuckPipeline)
      ledger.pipelines.healthy.push(healthyPipeline)
      ledger.builds.healthy.push(
        yield* build({ status: "success", now, age: AGES.stuckBuild, pipelineId: stuckPipeline })
      )
    }
    const stuck = (id: number) => Effect.sync(() => ledger.builds.stuck.push(id))
    const healthy = (id: number) => Effect.sync(() => ledger.builds.healthy.push(id))
    for (let i = 0; i < options.rate; i++) {
      const canceling = yield* build({ status: "canceling", now, age: AGES.stuckBuild, pipelineId: stuckPipeline })
      // GitLab's loop stops at this one for good (GitLab #590004): every canceling build after it
      // stays stuck for GitLab's worker, and only Sweeper's keyset walk passes it.
      if (tickNumber === 2 && i === 0) options.refusedDrops?.add(canceling)
      yield* stuck(canceling)
      if (i % 2 === 0) {
        yield* healthy(yield* build({ status: "canceling", now, age: AGES.recentBuild, pipelineId: healthyPipeline }))
      } else {
        // Running for two hours but still sending updates: drop-running-builds must leave it.
        yield* healthy(
          yield* build({
            status: "running",
            now,
            age: AGES.stuckBuild,
            updatedAge: AGES.recentBuild,
            pipelineId: healthyPipeline
          })
        )
      }
    }
    yield* stuck(yield* build({ status: "pending", now, age: AGES.outdatedPendingBuild, pipelineId: stuckPipeline }))
    yield* stuck(yield* build({ status: "running", now, age: AGES.stuckBuild, pipelineId: stuckPipeline }))
    yield* healthy(yield* build({ status: "pending", now, age: AGES.recentBuild, pipelineId: healthyPipeline }))
    // Delayed builds: one whose time came two hours ago (stale_schedule), one due in ten minutes.
    yield* stuck(
      yield* build({
        status: "scheduled",
        now,
        age: AGES.outdatedPendingBuild,
        scheduledAgeMillis: Duration.toMillis(AGES.stuckBuild),
        pipelineId: stuckPipeline
      })
    )
    yield* healthy(
      yield* build({
        status: "scheduled",
        now,
        age: AGES.outdatedPendingBuild,
        scheduledAgeMillis: -Duration.toMillis(AGES.recentBuild),
        pipelineId: healthyPipeline
      })
    )
  })

  const uploads = Effect.fn("Simulator.uploads")(function*(now: number) {
    for (let i = 0; i < options.rate; i++) {
      const stale = yield* seedPendingUpload({
        location,
        path: `tmp/uploads/${randomUUID()}`,
        preparedAtMillis: now - Duration.toMillis(AGES.staleUpload)
      })
      ledger.uploads.stuck.push(stale.field)
      if (stale.object !== undefined) ledger.uploads.objects.push(stale.object)
      const fresh = yield* seedPendingUpload({
        location,
        path: `tmp/uploads/${randomUUID()}`,
        preparedAtMillis: now - Duration.toMillis(AGES.freshUpload)
      })
      ledger.uploads.healthy.push(fresh.field)
    }
  })

  let rebalanceCount = 0
  const rebalances = Effect.fn("Simulator.rebalances")(function*() {
    for (let i = 0; i < options.rate; i++) {
      // GitLab's rebalancer refuses to run more than 5 at once, so a stalled set never holds more.
      const running = yield* stores.smembers("sharedState", RUNNING_REBALANCES_KEY)
      if (running.length >= MAX_NUMBER_OF_CONCURRENT_REBALANCES) return
      const name = `simulator-${run}-r${rebalanceCount}`
      if (rebalanceCount++ % 3 === 2) {
        const group = yield* seedProject(name)
        const sibling = yield* seedProject(`${name}-b`, group.namespaceId)
        yield* seedIssues(group.projectId, 8)
        yield* seedIssues(sibling.projectId, 8)
        yield* stallRebalance(RebalanceContainer.namespace, group.namespaceId)
        ledger.rebalances.stalled.push(rebalanceMember(RebalanceContainer.namespace, group.namespaceId))
      } else {
        const project = yield* seedProject(name)
        yield* seedIssues(project.projectId, 12)
        yield* stallRebalance(RebalanceContainer.project, project.projectId)
        ledger.rebalances.stalled.push(rebalanceMember(RebalanceContainer.project, project.projectId))
      }
    }
  })

  let tickNumber = 0
  const throttled = Effect.fn("Simulator.throttled")(function*(now: number) {
    // Every fifth tick a burst over the limit, and a few more jobs two ticks later while the
    // deferred ones are being resumed, so resumed and fresh jobs compete for the same slots. On
    // average fewer than `limit` a second arrive (what resuming drains at one pass a second), so
    // the deferred list empties between bursts and resume runs finish.
    for (const [worker, { limit, queue }] of Object.entries(limited)) {
      const phase = tickNumber % 5
      const count = phase === 0 ? options.rate * (limit + 2) : phase === 2 ? options.rate : 0
      for (let i = 0; i < count; i++) {
        const id = ledger.throttled.pushed.length + 1
        ledger.throttled.pushed.push(id)
        yield* pushJob({ workerClass: worker, args: [id], queue, nowMillis: now })
      }
    }
  })

  // Each scenario's failure is its own: builds that cannot be written (a ci database without its
  // tables) must not keep this tick's exports, uploads and jobs from being made.
  const scenario = <E, R>(name: Scenario, make: Effect.Effect<void, E, R>) =>
    on(name)
      ? make.pipe(Effect.catchCause((cause) => Effect.logWarning(`Simulator ${name} failed this tick`, cause)))
      : Effect.void
  const tick = Effect.gen(function*() {
    const now = yield* Clock.currentTimeMillis
    yield* scenario("exports", exports(now))
    yield* scenario("builds", builds(now))
    yield* scenario("uploads", uploads(now))
    yield* scenario("rebalances", rebalances())
    yield* scenario("throttled", throttled(now))
    tickNumber++
    ledger.ticks++
  })

  const every = options.tick ?? Duration.seconds(1)
  const started = yield* Clock.currentTimeMillis
  const until = options.duration === undefined ? Infinity : started + Duration.toMillis(options.duration)
  while ((yield* Clock.currentTimeMillis) < until) {
    yield* tick
    yield* Effect.sleep(every)
  }
  for (const fate of fates) yield* fate.pipe(Effect.orDie)
  fates = []
  return ledger
})

/** The consumer for whatever the selected scenarios need run (rebalances, throttled jobs). */
export const consume = Effect.fn("Simulator.consume")(function*(options: SimulateOptions, ledger: Ledger) {
  const limited = options.scenarios.includes("throttled") ? yield* limitedWorkers() : {}
  yield* runConsumer({
    ledger,
    limited,
    transitionQueues: (yield* SweeperConfig).transitionQueues,
    builds: yield* buildsTable(),
    threads: options.threads ?? 8,
    jobMillis: Duration.toMillis(options.jobDuration ?? Duration.millis(500))
  })
})

/**
 * GitLab's own workers (every batch shadow mode can judge), each `every`, their drops refused for
 * `refused`, the resume over `limited`; a failed turn is logged, not fatal.
 */
const playGitLabWorkers = (
  every: Duration.Duration,
  refused: ReadonlySet<number>,
  limited: Readonly<Record<string, { readonly limit: number; readonly queue: string }>>
) =>
  Effect.gen(function*() {
    const now = yield* Clock.currentTimeMillis
    const turn = {
      droppedCanceling: (yield* gitlabDropCanceling(now)).length,
      droppedStuck: (yield* gitlabStuckCiJobs(now)).length,
      failedExports: (yield* gitlabStuckExportJobs(now)).length,
      removedUploads: yield* gitlabDeleteStaleDirectUploads(now),
      rescheduledRebalances: yield* gitlabRescheduleStuckIssueRebalances(),
      resumedJobs: yield* gitlabConcurrencyLimitResume(limited, now)
    }
    if (Object.values(turn).some((n) => n > 0)) yield* Effect.logInfo("GitLab's workers", turn)
  }).pipe(
    Effect.provideService(RefusedDrops, refused),
    Effect.catchCause((cause) => Effect.logWarning("GitLab's workers failed this turn", cause)),
    Effect.delay(every),
    Effect.forever
  )

/**
 * The whole simulation: the consumer in the background, things made each tick, the ledger's
 * counts logged every 10 s. Runs until interrupted, or for `duration` (then returns the ledger,
 * stopping the consumer).
 */
export const simulate = Effect.fn("Simulator.simulate")(function*(options: SimulateOptions) {
  const ledger = options.ledger ?? emptyLedger()
  yield* Effect.logInfo("Simulator starting", { scenarios: options.scenarios, rate: options.rate })
  yield* Effect.forkScoped(consume(options, ledger))
  yield* Effect.forkScoped(
    Effect.suspend(() => Effect.logInfo("Simulator", ledgerCounts(ledger))).pipe(
      Effect.delay("10 seconds"),
      Effect.forever
    )
  )
  const refusedDrops = options.refusedDrops ?? new Set<number>()
  if (options.gitlabWorkers !== undefined) {
    const limited = options.scenarios.includes("throttled") ? yield* limitedWorkers() : {}
    yield* Effect.forkScoped(playGitLabWorkers(options.gitlabWorkers.every, refusedDrops, limited))
  }
  yield* produce({ ...options, refusedDrops }, ledger)
  yield* Effect.logInfo("Simulator finished", ledgerCounts(ledger))
  return ledger
}, Effect.scoped)
