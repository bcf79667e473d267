/**
 * Side-by-side benchmarks (issue 9): for each scenario, the same freshly seeded data is repaired
 * three times in one process — by Sweeper (the real batch through the run guard on the production
 * layers), by a raw set-based/pipelined baseline (the limit of what the servers can do), and by a
 * per-record loop in the style of GitLab's Ruby workers — and the table shows each one's rate and
 * Sweeper's ratio against the raw baseline. Every phase gets its own fresh database and a flushed
 * Redis database, seeded the same way, and checks that it repaired exactly what was stuck.
 * Benchmarks print figures; they never fail on time.
 */
import { PgClient } from "@effect/sql-pg"
import { Effect, Layer, Redacted, Schema } from "effect"
import type { Redis as IORedis } from "ioredis"
import { mkdirSync, writeFileSync } from "node:fs"
import { cpus, totalmem } from "node:os"
import { performance } from "node:perf_hooks"
import type { HealthConfig } from "../../src/domain/Health.ts"
import { HealthJson } from "../../src/domain/HealthConfig.ts"
import { adminUrl, benchDatabase, benchRedis, fmt, migratedDatabase, redisUrl } from "./harness.ts"
import { benchLogLevel, describeLogging, loggedBytes } from "./logging.ts"

export type Scale = "small" | "full"

export interface PhaseResult {
  /** Records repaired by the phase (checked against the scenario's expectation). */
  readonly repaired: number
  /** The phase's own timing when it must leave set-up out (building the production layers). */
  readonly seconds?: number
  /** Extra figures worth printing (pages, round trips, …). */
  readonly notes?: Readonly<Record<string, string | number>>
}

/** What a phase may use: the fresh database's URL and client, and a client on the flushed Redis db. */
export interface PhaseContext {
  readonly databaseUrl: string
  readonly redis: IORedis
  readonly redisUrl: string
  /** The `sweeper+gate` phase: Sweeper's phase again with this SWEEPER_HEALTH (scenarios/platform.ts). */
  readonly health?: HealthConfig | undefined
}

/**
 * The gate as "configured and healthy" for the `sweeper+gate` phase (SPEC §9: the gate must cost
 * nothing measurable): every signal that needs nothing outside the benchmark, thresholds no
 * healthy run reaches. The WAL rate is absolute: a relative one would rightly hold on the
 * benchmark's own burst. No Prometheus rule: the benchmark has no Prometheus to ask.
 */
export const BENCH_HEALTH: HealthConfig = Schema.decodeUnknownSync(HealthJson)(JSON.stringify({
  replicationLag: { stop: "1GB" },
  walRate: { stop: "10GB/s" },
  autovacuum: { stop: true },
  longTransactions: { stop: "1h" },
  redisMemory: { stop: 0.99 },
  queueLatency: { stop: "1h" }
}))

export type Phase = (context: PhaseContext) => Effect.Effect<PhaseResult, unknown, PgClient.PgClient>

export interface Scenario<Size> {
  readonly name: string
  readonly description: string
  readonly sizes: Readonly<Record<Scale, Size>>
  /** One line saying what the size means, for the report. */
  readonly describeSize: (size: Size) => string
  /** Seeds the fresh database and Redis db; returns how many records are stuck (to be repaired). */
  readonly seed: (size: Size, context: PhaseContext) => Effect.Effect<number, unknown, PgClient.PgClient>
  readonly sweeper: (size: Size) => Phase
  /**
   * The raw limit doing the same work: the repair and GitLab's side effects, set-based, plus the
   * same ledger rows Sweeper writes (table, event type, payload shape: support/ledger.ts), with
   * none of Sweeper's guarantees. The phase checks the number of event rows it wrote.
   */
  readonly raw: (size: Size) => Phase
  /** The raw baseline as it was before it wrote the ledger: the repair and side effects only. */
  readonly rawNoLedger: (size: Size) => Phase
  readonly perRecord: (size: Size) => Phase
  /** Extra measurements after the three phases (e.g. the nothing-to-do run), each printed as a line. */
  readonly extras?: (size: Size) => Phase
}

export interface PhaseFigures {
  readonly phase: string
  readonly repaired: number
  readonly seconds: number
  readonly perSecond: number
  readonly notes: Readonly<Record<string, string | number>>
}

export interface ScenarioFigures {
  readonly scenario: string
  readonly size: string
  readonly stuck: number
  readonly phases: ReadonlyArray<PhaseFigures>
  /** Sweeper's rate over the raw baseline's (the raw baseline writing the same ledger rows). */
  readonly ratio: number
  /** Sweeper's rate over the ledger-less raw baseline's. */
  readonly ratioNoLedger: number
  readonly perRecordRatio: number
  /** Sweeper's rate with the health gate configured and healthy over the raw baseline's. */
  readonly gatedRatio: number
  readonly extras: Readonly<Record<string, string | number>>
}

/** A fresh migrated database and a flushed Redis database, seeded, for one phase. */
const withFreshData = <A>(
  seed: (context: PhaseContext) => Effect.Effect<number, unknown, PgClient.PgClient>,
  use: (context: PhaseContext, stuck: number) => Effect.Effect<A, unknown, PgClient.PgClient>,
  health?: HealthConfig
) =>
  Effect.scoped(Effect.gen(function*() {
    const database = yield* benchDatabase(process.env.BENCH_SYNCHRONOUS_COMMIT)
    const redis = yield* benchRedis
    const context: PhaseContext = { databaseUrl: database.url, redis, redisUrl, health }
    return yield* Effect.gen(function*() {
      const stuck = yield* seed(context)
      const sql = yield* PgClient.PgClient
      yield* sql`ANALYZE`
      return yield* use(context, stuck)
    }).pipe(Effect.provide(Layer.orDie(migratedDatabase(database.url))))
  }))

const timePhase = (name: string, phase: Phase, context: PhaseContext, stuck: number) =>
  Effect.gen(function*() {
    const start = performance.now()
    const logged = loggedBytes()
    const result = yield* phase(context)
    const seconds = result.seconds ?? (performance.now() - start) / 1000
    // Sweeper logs as in production (support/logging.ts): say at which level, and how much.
    const notes = name.startsWith("sweeper")
      ? { ...result.notes, log: describeLogging(loggedBytes() - logged) }
      : result.notes ?? {}
    if (result.repaired !== stuck) {
      console.log(`  !! ${name} repaired ${fmt(result.repaired)} of ${fmt(stuck)} stuck records`)
    }
    const figures: PhaseFigures = {
      phase: name,
      repaired: result.repaired,
      seconds,
      perSecond: result.repaired / seconds,
      notes
    }
    console.log(
      `  ${name.padEnd(11)} ${fmt(result.repaired).padStart(10)} in ${seconds.toFixed(2).padStart(8)} s  ` +
        `${fmt(figures.perSecond).padStart(10)}/s  ${
          Object.entries(figures.notes).map(([k, v]) => `${k}=${v}`).join(" ")
        }`
    )
    return figures
  })

/** The phases the regression benchmark alternates (support/regress.ts). */
export type RegressPhase = "sweeper" | "sweeper+gate" | "raw" | "raw-no-ledger"

const phaseOf = <Size>(scenario: Scenario<Size>, size: Size, name: RegressPhase | "per-record"): Phase => {
  switch (name) {
    case "sweeper":
    case "sweeper+gate":
      return scenario.sweeper(size)
    case "raw":
      return scenario.raw(size)
    case "raw-no-ledger":
      return scenario.rawNoLedger(size)
    case "per-record":
      return scenario.perRecord(size)
  }
}

/**
 * One phase of a scenario on its own freshly seeded data (`sweeper+gate`: Sweeper with the health
 * gate configured and healthy, BENCH_HEALTH): what the regression benchmark alternates.
 */
export const runPhase = <Size>(scenario: Scenario<Size>, size: Size, name: RegressPhase) =>
  withFreshData(
    (context) => scenario.seed(size, context),
    (context, stuck) =>
      Effect.map(timePhase(name, phaseOf(scenario, size, name), context, stuck), (phase) => ({ stuck, phase })),
    name === "sweeper+gate" ? BENCH_HEALTH : undefined
  )

export interface RunOptions {
  /**
   * Run the per-record baseline too (default). CI's smoke run leaves it out: one transaction or
   * round trip per record is the slow phase by design (over a minute of CI time at small scale),
   * and Sweeper's ratio is against the raw baseline, which always runs.
   */
  readonly perRecord?: boolean
}

export const runScenario = <Size>(scenario: Scenario<Size>, scale: Scale, options: RunOptions = {}) =>
  Effect.gen(function*() {
    const size = scenario.sizes[scale]
    console.log(`\n${scenario.name} (${scale}): ${scenario.describeSize(size)}`)
    const seed = (context: PhaseContext) => scenario.seed(size, context)
    const phases: Array<PhaseFigures> = []
    let stuck = 0
    // sweeper+gate: the same Sweeper phase with the health gate configured and healthy.
    const chosen = (["sweeper", "sweeper+gate", "raw", "raw-no-ledger", "per-record"] as const)
      .map((name) => [name, phaseOf(scenario, size, name)] as const)
    for (
      const [name, phase] of chosen.filter(([phaseName]) => phaseName !== "per-record" || options.perRecord !== false)
    ) {
      phases.push(
        yield* withFreshData(seed, (context, n) => {
          stuck = n
          return timePhase(name, phase, context, n)
        }, name === "sweeper+gate" ? BENCH_HEALTH : undefined)
      )
    }
    let extras: Record<string, string | number> = {}
    if (scenario.extras !== undefined) {
      const extraPhase = scenario.extras(size)
      extras = yield* withFreshData(
        seed,
        (context) => Effect.map(extraPhase(context), (result) => ({ ...result.notes }))
      )
      for (const [key, value] of Object.entries(extras)) console.log(`  ${key.padEnd(46)} ${value}`)
    }
    const rate = (name: string) => phases.find((p) => p.phase === name)?.perSecond ?? Number.NaN
    return {
      scenario: scenario.name,
      size: scenario.describeSize(size),
      stuck,
      phases,
      ratio: rate("sweeper") / rate("raw"),
      ratioNoLedger: rate("sweeper") / rate("raw-no-ledger"),
      perRecordRatio: rate("per-record") / rate("raw"),
      gatedRatio: rate("sweeper+gate") / rate("raw"),
      extras
    } satisfies ScenarioFigures
  })

export const machine = () => ({
  cpus: `${cpus().length} × ${cpus()[0]?.model ?? "unknown"}`,
  memory: `${Math.round(totalmem() / 2 ** 30)} GiB`,
  node: process.version,
  logLevel: benchLogLevel,
  postgres: new URL(adminUrl).host,
  redis: new URL(redisUrl).host
})

/** The ratio table, as printed and as pasted into BENCHMARKS.md. */
export const markdownTable = (all: ReadonlyArray<ScenarioFigures>) => {
  const rows = all.map((s) => {
    const cell = (name: string) => {
      const phase = s.phases.find((p) => p.phase === name)
      return phase === undefined ? "not run" : `${phase.seconds.toFixed(2)} s (${fmt(phase.perSecond)}/s)`
    }
    const ratio = (value: number) => Number.isNaN(value) ? "–" : value.toFixed(3)
    return `| ${s.scenario} | ${s.size} | ${cell("sweeper")} | ${cell("raw")} | ${cell("raw-no-ledger")} | ${
      cell("per-record")
    } | **${ratio(s.ratio)}** | ${ratio(s.ratioNoLedger)} | ${ratio(s.gatedRatio)} | ${ratio(s.perRecordRatio)} |`
  })
  return [
    "| scenario | data | Sweeper | raw baseline (with ledger) | raw, no ledger | per-record baseline | Sweeper / raw " +
    "| Sweeper / raw no ledger | with health gate / raw | per-record / raw |",
    "|---|---|---|---|---|---|---|---|---|---|",
    ...rows
  ].join("\n")
}

/** Writes bench/results/<date>-<scale>.json and returns its path. */
export const writeResults = (
  scale: Scale,
  all: ReadonlyArray<ScenarioFigures>,
  idle?: { readonly rssBytes: number; readonly peakBytes: number }
) => {
  const dir = new URL("../results/", import.meta.url)
  mkdirSync(dir, { recursive: true })
  const stamp = new Date().toISOString().slice(0, 19).replace(/[:T]/g, "-")
  const file = new URL(`${stamp}-${scale}.json`, dir)
  writeFileSync(
    file,
    JSON.stringify({ date: new Date().toISOString(), scale, machine: machine(), scenarios: all, idle }, null, 2) + "\n"
  )
  return file.pathname
}

/** The real Redis URL as a Redacted, for the production layers. */
export const benchRedisUrl = Redacted.make(redisUrl)
