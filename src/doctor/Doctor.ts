/**
 * `sweeper doctor [--json] [--apply-indexes]`: what an operator wants to know before
 * pointing Sweeper at a real GitLab, read-only. Per database connection (main, and ci when GitLab's
 * is separate), what it holds and what its role may write (DoctorDatabases.ts); a layout that cannot
 * work is refused in one line before this runs. Per batch, the plan of its SQL scan on the database
 * holding its table and whether an index serves it, with the exact statements that would build the
 * missing one; each Redis store reachable, single or cluster; clock skew between this process,
 * PostgreSQL and Redis.
 * `--apply-indexes` is the only thing here that writes: it runs the recommended statements one at a
 * time, outside any transaction (CREATE INDEX CONCURRENTLY refuses to run inside one).
 */
import type { PgClient } from "@effect/sql-pg"
import * as Command from "effect/cli/Command"
import * as Flag from "effect/cli/Flag"
import * as Clock from "effect/Clock"
import * as Console from "effect/Console"
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { SweeperConfig } from "../config/Config.ts"
import { type DatabaseName, databaseOfTable } from "../domain/Databases.ts"
import { formatValue, type RedisStoreName } from "../domain/Health.ts"
import { describeReasonSet, type FailureReasonSet } from "../domain/StuckBuilds.ts"
import { describeTransitionQueues, type TransitionQueues } from "../domain/TransitionJobs.ts"
import { writeSetOf } from "../layers/health/HealthGateBatches.ts"
import { HealthSignalsLive } from "../layers/health/HealthSignalsLive.ts"
import { MemoryRedis } from "../layers/memory/MemoryRedis.ts"
import { checkLayout, tableHoldings } from "../layers/postgres/DatabaseLayout.ts"
import { databaseClients, onClient } from "../layers/postgres/Databases.ts"
import { type BuildsTable, detectSchemaMode } from "../layers/postgres/DatabaseSchema.ts"
import { JOB_OUTBOX } from "../layers/postgres/JobOutbox.ts"
import {
  describeTransitionEffects,
  detectTransitionTables,
  TRANSITION_TABLES
} from "../layers/postgres/TransitionsSql.ts"
import { QueuesMetadataRedis, QueuesRedis, type Redis, SharedStateRedis } from "../layers/redis/Redis.ts"
import { batches } from "../programs/index.ts"
import { HealthSignals, HealthStandbys, type StandbyStatus } from "../services/HealthSignals.ts"
import { describeBackends, ReadOnlyAppLayer } from "../supervisor/App.ts"
import {
  type DatabasesReport,
  gatherDatabases,
  privilegeProblems,
  renderDatabases,
  timeoutProblems
} from "./DoctorDatabases.ts"
import { createStatements, judgeScan, partitionsOf, REDIS_ONLY_BATCHES, scans } from "./Indexes.ts"

/** Beyond this, time thresholds (1 h, 3 h, 6 h) compared with other machines' timestamps drift. */
export const CLOCK_SKEW_LIMIT_MS = 1_000

export interface ScanReport {
  readonly batch: string
  readonly table: string
  /** The connection it is explained (and its index built) on: the database holding its table. */
  readonly database: DatabaseName
  readonly description: string
  readonly plan: ReadonlyArray<string>
  readonly served: boolean
  readonly servedBy: ReadonlyArray<string>
  /** The statements that would build the index it wants; empty when served. */
  readonly recommended: ReadonlyArray<string>
}

export interface StoreReport {
  readonly store: "SharedState" | "Queues" | "QueuesMetadata"
  readonly kind: "single" | "cluster" | "in-memory"
  readonly reachable: boolean
  readonly clockSkewMs: number | null
  readonly error?: string
}

/** One health signal as this database and these stores let Sweeper read it now. */
export interface SignalCheck {
  readonly signal: string
  /** What it is read on ("" the database or server as a whole). */
  readonly subject: string
  /** Configured in SWEEPER_HEALTH (an unreadable configured signal is a problem). */
  readonly configured: boolean
  readonly readable: boolean
  /** What it reads now, or why it cannot be read. */
  readonly reading: string
}

export interface HealthCheck {
  readonly role: string
  readonly superuser: boolean
  /** pg_read_all_stats (pg_monitor includes it): other backends' rows in the statistics views. */
  readonly readAllStats: boolean
  readonly inRecovery: boolean
  readonly signals: ReadonlyArray<SignalCheck>
}

export interface DoctorReport {
  readonly ok: boolean
  readonly problems: ReadonlyArray<string>
  readonly postgres: {
    readonly backend: string
    readonly schemaMode: "gitlab" | "standalone"
    readonly schemaModeSource: "SWEEPER_SCHEMA" | "detected"
    readonly buildsTable: string
    readonly partitions: ReadonlyArray<string>
    readonly columnsChecked: number
    readonly clockSkewMs: number
  }
  /** Each connection (main, and ci when it is a database of its own) and the layout verdict. */
  readonly databases: DatabasesReport
  /** `SWEEPER_FAILURE_REASONS`: which GitLab's failure reasons the build drops write. */
  readonly failureReasons: { readonly set: FailureReasonSet; readonly description: string }
  /** What a drop does beside the build's row on the database holding the builds, and where its jobs go. */
  readonly transitions: TransitionsReport
  readonly scans: ReadonlyArray<ScanReport>
  readonly redisOnlyBatches: ReadonlyArray<string>
  readonly redis: ReadonlyArray<StoreReport>
  readonly health: HealthCheck
  readonly applied: ReadonlyArray<string>
}

export interface TransitionsReport {
  /** The database holding the builds, where the side tables and the job outbox must be. */
  readonly database: DatabaseName
  /** GitLab's tables a drop touches, the pipelines and Sweeper's job outbox: held there or not. */
  readonly tables: ReadonlyArray<{ readonly table: string; readonly held: boolean }>
  /** One line per effect a drop produces here (or does without). */
  readonly effects: ReadonlyArray<string>
  /** `SWEEPER_TRANSITION_QUEUES`: worker class → queue. */
  readonly queues: TransitionQueues
}

/**
 * The transition side of a drop on the database holding the builds: which of GitLab's tables it
 * holds (the drop touches only those), whether the job outbox is there, what a drop produces.
 */
const transitionsCheck = (
  client: PgClient.PgClient,
  database: DatabaseName,
  builds: BuildsTable,
  queues: TransitionQueues
) =>
  Effect.gen(function*() {
    const side = yield* onClient(client)(detectTransitionTables)
    const pipelines = builds.partitioned ? "p_ci_pipelines" : "ci_pipelines"
    const others = yield* onClient(client)(tableHoldings([pipelines, JOB_OUTBOX]))
    const heldHere = (table: string) => others.some((h) => h.table === table && h.exists && !h.writeLocked)
    return {
      database,
      tables: [
        ...TRANSITION_TABLES.map((table) => ({
          table,
          held: {
            ci_pending_builds: side.pendingBuilds,
            ci_running_builds: side.runningBuilds,
            ci_builds_runner_session: side.runnerSessions,
            ci_resources: side.resources
          }[table]
        })),
        { table: pipelines, held: heldHere(pipelines) },
        { table: JOB_OUTBOX, held: heldHere(JOB_OUTBOX) }
      ],
      effects: describeTransitionEffects(side),
      queues
    } satisfies TransitionsReport
  })

/** Every signal the health gate knows, read once on what the registered batches write, configured or not. */
const healthCheck = Effect.gen(function*() {
  const settings = yield* SweeperConfig
  const signals = yield* HealthSignals
  const configured = new Set(
    Option.match(settings.health, { onNone: () => [], onSome: (health) => health.rules.map((rule) => rule.signal) })
  )
  const limitQueues = [...new Set(Object.values(settings.concurrencyLimits).map((setting) => setting.queue))]
  const writes = batches.map((batch) => writeSetOf(batch, limitQueues))
  const tables = [...new Set(writes.flatMap((w) => w.tables))]
  const stores = [...new Set(writes.flatMap((w) => w.redisStores))] as Array<RedisStoreName>
  const queues = [...new Set(writes.flatMap((w) => w.queues))]
  const check = <A>(
    signal: string,
    subject: string,
    read: Effect.Effect<A, { readonly message: string }>,
    show: (a: A) => string
  ) =>
    read.pipe(Effect.match({
      // The reason alone: the line already names the signal and its subject.
      onFailure: (error): SignalCheck => ({
        signal,
        subject,
        configured: configured.has(signal),
        readable: false,
        reading: "reason" in error && typeof error.reason === "string" ? error.reason : error.message
      }),
      onSuccess: (a): SignalCheck => ({
        signal,
        subject,
        configured: configured.has(signal),
        readable: true,
        reading: show(a)
      })
    }))
  const privileges = yield* signals.privileges.pipe(
    Effect.orElseSucceed(() => ({ role: "?", superuser: false, readAllStats: false, inRecovery: false }))
  )
  const checks: Array<SignalCheck> = [
    yield* check(
      "replicationLag",
      "",
      signals.replicationLag,
      (lag) =>
        `${lag.standbys} standby${lag.standbys === 1 ? "" : "s"}; largest replay lag ${
          formatValue("bytes", lag.bytes)
        }, ${formatValue("seconds", lag.seconds)}`
    ),
    // Each standby on its own line: which the gate watches, and why a delayed or ignored one is not.
    ...(yield* signals.standbys.pipe(Effect.orElseSucceed((): ReadonlyArray<StandbyStatus> => []))).map((
      standby
    ): SignalCheck => ({
      signal: "replicationLag",
      subject: `standby ${standby.name}`,
      configured: configured.has("replicationLag"),
      readable: true,
      reading: `${standby.watched ? "watched" : "NOT watched"} (${standby.reason}); replay ${
        formatValue("bytes", standby.bytes)
      } behind`
    })),
    yield* check(
      "walRate",
      "",
      signals.walPosition,
      (position) => `WAL position ${formatValue("bytes", position)} (the rate is two samples a second apart)`
    ),
    yield* check(
      "autovacuum",
      tables.join(", "),
      signals.vacuuming(tables),
      (vacuumed) => vacuumed.length === 0 ? "no vacuum on these tables" : `vacuum running on ${vacuumed.join(", ")}`
    ),
    yield* check(
      "longTransactions",
      "",
      signals.oldestTransaction,
      (seconds) =>
        seconds === 0 ? "no other transaction open" : `oldest other transaction open ${formatValue("seconds", seconds)}`
    )
  ]
  for (const store of stores) {
    checks.push(
      yield* check(
        "redisMemory",
        store,
        signals.redisMemory(store),
        (ratio) => `${Math.round(ratio * 1000) / 10}% of maxmemory`
      )
    )
  }
  for (const queue of queues) {
    checks.push(
      yield* check(
        "queueLatency",
        queue,
        signals.queueLatency(queue),
        (seconds) => `latency ${formatValue("seconds", seconds)}`
      )
    )
  }
  if (Option.isSome(settings.health)) {
    for (const rule of settings.health.value.rules) {
      if (rule.source._tag !== "Prometheus") continue
      checks.push(
        yield* check(
          rule.signal,
          rule.source.query,
          signals.prometheus(rule.source.url, rule.source.query),
          (v) => `${v} (stop ${rule.stop.text})`
        )
      )
    }
  }
  return { ...privileges, signals: checks } satisfies HealthCheck
}).pipe(
  Effect.provide(HealthSignalsLive),
  // The operator's named standbys, read when the signals' layer is built.
  Effect.provideServiceEffect(HealthStandbys, Effect.map(SweeperConfig, (s) => s.healthStandbys))
)

/** Single server or cluster, as Redis.ts built the store's connection (its URL had commas or not). */
export const storeKind = (redis: Redis["Service"]): "single" | "cluster" => redis.kind

/** `server − this process` in ms, read at the midpoint of the round trip. */
const skewOf = <E, R>(serverMillis: Effect.Effect<number, E, R>) =>
  Effect.gen(function*() {
    const before = yield* Clock.currentTimeMillis
    const server = yield* serverMillis
    const after = yield* Clock.currentTimeMillis
    return Math.round(server - (before + after) / 2)
  })

const storeReport = (store: StoreReport["store"], redis: Option.Option<Redis["Service"]>, inMemory: boolean) =>
  Effect.gen(function*() {
    if (Option.isNone(redis)) {
      return {
        store,
        kind: inMemory ? "in-memory" as const : "single" as const,
        reachable: inMemory,
        clockSkewMs: null
      }
    }
    const kind = storeKind(redis.value)
    return yield* redis.value.use("doctor.ping", (client) => client.ping()).pipe(
      Effect.andThen(skewOf(
        redis.value.use("doctor.time", (client) => client.time()).pipe(
          Effect.map(([seconds, micros]) => Number(seconds) * 1000 + Number(micros) / 1000)
        )
      )),
      Effect.map((clockSkewMs): StoreReport => ({ store, kind, reachable: true, clockSkewMs })),
      Effect.catch((error) =>
        Effect.succeed<StoreReport>({
          store,
          kind,
          reachable: false,
          clockSkewMs: null,
          error: String(error.cause ?? error.message)
        })
      )
    )
  })

const gather = (applied: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const settings = yield* SweeperConfig
    const clients = yield* databaseClients
    const sql = clients.main
    const { mode, source } = yield* detectSchemaMode(settings.schema)
    const { checked, builds, survey } = yield* checkLayout
    const databases = yield* gatherDatabases(settings, clients, survey)
    const databaseOf = (table: string) => databaseOfTable(table, survey.decomposed)
    const partitions = yield* partitionsOf(clients[databaseOf(builds.name)], builds.name)
    const now = yield* DateTime.now
    const scanReports: Array<ScanReport> = []
    for (const scan of scans(builds)) {
      const scanPartitions = scan.table === builds.name ? partitions : []
      const relations = [scan.table, ...scanPartitions.map((p) => p.name)]
      const verdict = yield* judgeScan(clients[databaseOf(scan.table)], scan, now, relations)
      scanReports.push({
        batch: scan.batch,
        table: scan.table,
        database: databaseOf(scan.table),
        description: scan.description,
        plan: verdict.plan,
        served: verdict.served,
        servedBy: verdict.servedBy,
        recommended: verdict.served
          ? []
          : Option.match(scan.wants, { onNone: () => [], onSome: (spec) => createStatements(spec, scanPartitions) })
      })
    }
    const pgSkew = yield* skewOf(Effect.map(
      sql<{ ms: number | string }>`SELECT (extract(epoch FROM now()) * 1000)::float8 AS ms`,
      (rows) => Number(rows[0]!.ms)
    ))
    const inMemory = Option.isSome(yield* Effect.serviceOption(MemoryRedis))
    const redis = [
      yield* storeReport("SharedState", yield* Effect.serviceOption(SharedStateRedis), inMemory),
      yield* storeReport("Queues", yield* Effect.serviceOption(QueuesRedis), inMemory),
      yield* storeReport("QueuesMetadata", yield* Effect.serviceOption(QueuesMetadataRedis), inMemory)
    ]
    const health = yield* healthCheck
    const transitions = yield* transitionsCheck(
      clients[databaseOf(builds.name)],
      databaseOf(builds.name),
      builds,
      settings.transitionQueues
    )
    // GitLab always has these beside its builds: missing there, this is not the database that holds them.
    const missing = transitions.tables.filter((t) => !t.held && (mode === "gitlab" || t.table === JOB_OUTBOX))
    const problems = [
      ...privilegeProblems(databases),
      ...timeoutProblems(databases),
      ...missing.map((t) =>
        `${t.table} is not held by ${transitions.database}, where the builds are: a drop cannot ${
          t.table === JOB_OUTBOX ? "owe GitLab its jobs (run `sweeper migrate`)" : "do what GitLab's drop! does there"
        }`
      ),
      ...health.signals.filter((s) => s.configured && !s.readable).map((s) =>
        `SWEEPER_HEALTH ${s.signal} cannot be read: ${s.reading}`
      ),
      ...redis.filter((r) => !r.reachable).map((r) =>
        `Redis store ${r.store} unreachable${r.error ? `: ${r.error}` : ""}`
      ),
      ...(Math.abs(pgSkew) > CLOCK_SKEW_LIMIT_MS ? [`PostgreSQL clock is ${pgSkew} ms off this process`] : []),
      ...redis.filter((r) => r.clockSkewMs !== null && Math.abs(r.clockSkewMs) > CLOCK_SKEW_LIMIT_MS)
        .map((r) => `Redis store ${r.store} clock is ${r.clockSkewMs} ms off this process`)
    ]
    return {
      ok: problems.length === 0,
      problems,
      postgres: {
        backend: describeBackends(settings).postgres,
        schemaMode: mode,
        schemaModeSource: source,
        buildsTable: builds.name,
        partitions: partitions.map((p) => p.qualified),
        columnsChecked: checked,
        clockSkewMs: pgSkew
      },
      databases,
      failureReasons: {
        set: settings.failureReasons,
        description: describeReasonSet(settings.failureReasons, settings.runnerProvisioningTimeoutReason)
      },
      transitions,
      scans: scanReports,
      redisOnlyBatches: [...REDIS_ONLY_BATCHES],
      redis,
      health,
      applied
    } satisfies DoctorReport
  })

/**
 * `statement` alone on a connection of its own with no statement timeout: an index build on a large
 * table takes far longer than the timeout Sweeper's sessions carry (SWEEPER_PG_STATEMENT_TIMEOUT),
 * and CREATE INDEX CONCURRENTLY refuses to share a query string (an implicit transaction) with a SET.
 */
const withoutStatementTimeout = (sql: PgClient.PgClient, statement: string) =>
  Effect.scoped(Effect.gen(function*() {
    const connection = yield* sql.reserve
    yield* connection.executeRaw("SET statement_timeout = 0", [])
    yield* connection.executeRaw(statement, []).pipe(
      Effect.ensuring(Effect.ignore(connection.executeRaw("RESET statement_timeout", [])))
    )
  }))

/** Runs every recommended statement, one at a time, each in its own implicit transaction. */
const applyRecommended = (report: DoctorReport) =>
  Effect.gen(function*() {
    const clients = yield* databaseClients
    const applied: Array<string> = []
    for (const scan of report.scans) {
      for (const statement of scan.recommended) {
        yield* Effect.logInfo("Applying index statement", { statement, database: scan.database })
        yield* withoutStatementTimeout(clients[scan.database], statement)
        applied.push(statement)
      }
    }
    return applied
  })

const sign = (ms: number) => `${ms >= 0 ? "+" : ""}${ms} ms`

export const renderReport = (report: DoctorReport): string => {
  const lines: Array<string> = []
  const pg = report.postgres
  lines.push(`PostgreSQL  ${pg.backend}`)
  lines.push(
    `  schema: ${pg.schemaMode} (${
      pg.schemaModeSource === "detected" ? "detected" : "SWEEPER_SCHEMA"
    }); migrations up to date; ${pg.columnsChecked} columns checked, all present`
  )
  lines.push(
    `  builds: ${pg.buildsTable}${pg.partitions.length > 0 ? ` (partitions: ${pg.partitions.join(", ")})` : ""}`
  )
  lines.push(`  clock: ${sign(pg.clockSkewMs)} from this process`)
  lines.push(`  ${report.failureReasons.description} (SWEEPER_FAILURE_REASONS)`)
  for (const statement of report.applied) lines.push(`  applied: ${statement}`)
  lines.push(...renderDatabases(report.databases))
  const t = report.transitions
  lines.push(`Transitions on ${t.database} (what a drop does beside the build's row, as GitLab's drop!)`)
  lines.push(`  tables: ${t.tables.map((table) => `${table.table} ${table.held ? "held" : "NOT HELD"}`).join(", ")}`)
  for (const effect of t.effects) lines.push(`  - ${effect}`)
  lines.push("  jobs (SWEEPER_TRANSITION_QUEUES):")
  for (const line of describeTransitionQueues(t.queues)) lines.push(`    ${line}`)
  lines.push("Scans")
  for (const scan of report.scans) {
    // Which database it was explained on, when there are two.
    const where = report.databases.decomposed ? ` (${scan.database})` : ""
    lines.push(`  ${scan.batch}: ${scan.table}${where}, ${scan.description}`)
    lines.push(scan.served ? `    served by ${scan.servedBy.join(", ")}` : `    NOT served by an index`)
    for (const line of scan.plan) lines.push(`    | ${line}`)
    if (scan.recommended.length > 0) {
      lines.push("    recommended (run with `sweeper doctor --apply-indexes`):")
      for (const statement of scan.recommended) lines.push(`      ${statement};`)
    }
  }
  for (const batch of report.redisOnlyBatches) lines.push(`  ${batch}: Redis only, no SQL scan`)
  lines.push("Redis")
  for (const store of report.redis) {
    lines.push(
      `  ${store.store.padEnd(15)} ${store.kind.padEnd(9)} ${store.reachable ? "reachable" : "UNREACHABLE"}` +
        (store.clockSkewMs === null ? "" : `, clock ${sign(store.clockSkewMs)}`) +
        (store.error ? ` (${store.error})` : "")
    )
  }
  const h = report.health
  lines.push(
    `Health signals as role ${h.role}: ${
      h.superuser
        ? "superuser"
        : h.readAllStats
        ? "pg_read_all_stats"
        : "WITHOUT pg_read_all_stats (GRANT pg_monitor TO " + h.role + " to read other backends' statistics)"
    }${h.inRecovery ? "; a standby: no WAL position" : ""}`
  )
  for (const signal of h.signals) {
    lines.push(
      `  ${signal.signal.padEnd(17)}${signal.configured ? "configured  " : "            "}${
        signal.readable ? "readable    " : "UNREADABLE  "
      }${signal.subject === "" ? "" : `${signal.subject}: `}${signal.reading}`
    )
  }
  const recommended = report.scans.filter((s) => s.recommended.length > 0).length
  lines.push(
    report.ok
      ? `OK${recommended > 0 ? ` (${recommended} index${recommended === 1 ? "" : "es"} recommended)` : ""}`
      : `PROBLEMS:\n${report.problems.map((p) => `  - ${p}`).join("\n")}`
  )
  return lines.join("\n")
}

export const doctorCommand = Command.make(
  "doctor",
  {
    json: Flag.Boolean("json").pipe(Flag.withDescription("Print one JSON object on stdout"), Flag.withDefault(false)),
    applyIndexes: Flag.Boolean("apply-indexes").pipe(
      Flag.withDescription("Build the recommended indexes (CONCURRENTLY, one at a time, outside a transaction)"),
      Flag.withDefault(false)
    )
  },
  Effect.fn("Cli.doctor")(function*({ json, applyIndexes }) {
    let report = yield* gather([])
    if (applyIndexes) report = yield* gather(yield* applyRecommended(report))
    yield* Console.log(json ? JSON.stringify(report) : renderReport(report))
    if (!report.ok) process.exitCode = 1
  }, Effect.provide(ReadOnlyAppLayer))
).pipe(
  Command.withDescription(
    "Check each database and Redis: which tables each connection holds, scans and their indexes, stores, clock skew, which health signals can be read (read-only)"
  )
)
