/**
 * What the benchmarks share: a throw-away PostgreSQL database (created on the admin URL, migrated,
 * dropped at the end), the benchmark's Redis database (claimed against the test suite, flushed at
 * start and end), memory sampling, Redis command counting and number formatting. Not a benchmark
 * itself (bench/index.ts only lists the .ts files directly under bench/).
 */
import { PgClient } from "@effect/sql-pg"
import { Effect, Layer, Redacted } from "effect"
import { Redis as IORedis } from "ioredis"
import { randomBytes, randomUUID } from "node:crypto"
import { subscribe, unsubscribe } from "node:diagnostics_channel"
import { performance } from "node:perf_hooks"
import { setFlagsFromString } from "node:v8"
import { runInNewContext } from "node:vm"
import { migrate } from "../../src/layers/postgres/Migrations.ts"
import { layerServer } from "../../src/layers/postgres/Postgres.ts"

export const adminUrl = process.env.BENCH_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test"
export const redisUrl = process.env.BENCH_REDIS_URL ?? "redis://127.0.0.1:6379/12"
/** The Redis database number the URL selects (ioredis reads it from the path). */
export const redisDb = Number(new URL(redisUrl).pathname.slice(1) || "0")

/** An integer from the environment, `fallback` when unset. */
export const envInt = (name: string, fallback: number): number => {
  const raw = process.env[name]
  if (raw === undefined || raw === "") return fallback
  const value = Number(raw.replaceAll("_", ""))
  if (!Number.isInteger(value) || value < 0) throw new Error(`${name} must be a non-negative integer, got ${raw}`)
  return value
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL
// ---------------------------------------------------------------------------------------------

const admin = PgClient.layer({ url: Redacted.make(adminUrl), maxConnections: 1 })

const databaseUrl = (name: string) => {
  const url = new URL(adminUrl)
  url.pathname = `/${name}`
  return url.toString()
}

/** A fresh database on the admin URL's server, dropped (WITH FORCE) when the scope closes. */
export const benchDatabase = (synchronousCommit: string | undefined) =>
  Effect.acquireRelease(
    Effect.gen(function*() {
      const name = `sweeper_bench_${randomBytes(4).toString("hex")}`
      const sql = yield* PgClient.PgClient
      yield* sql.unsafe(`CREATE DATABASE ${name}`)
      if (synchronousCommit !== undefined) {
        yield* sql.unsafe(
          `ALTER DATABASE ${name} SET synchronous_commit = '${synchronousCommit.replace(/[^a-z_]/g, "")}'`
        )
      }
      // BENCH_AUTO_EXPLAIN=<ms>: the server logs the plan (with ANALYZE and BUFFERS) of every
      // statement on this database slower than that, for finding where a statement's time goes.
      const explainAbove = process.env.BENCH_AUTO_EXPLAIN
      if (explainAbove !== undefined && /^\d+$/.test(explainAbove)) {
        yield* sql.unsafe(`ALTER DATABASE ${name} SET session_preload_libraries = 'auto_explain'`)
        yield* sql.unsafe(`ALTER DATABASE ${name} SET auto_explain.log_min_duration = ${explainAbove}`)
        yield* sql.unsafe(`ALTER DATABASE ${name} SET auto_explain.log_analyze = on`)
        yield* sql.unsafe(`ALTER DATABASE ${name} SET auto_explain.log_buffers = on`)
        yield* sql.unsafe(`ALTER DATABASE ${name} SET auto_explain.log_nested_statements = on`)
      }
      return { name, url: databaseUrl(name) }
    }).pipe(Effect.provide(admin)),
    ({ name }) =>
      Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        yield* sql.unsafe(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
        console.log(`dropped database ${name}`)
      }).pipe(Effect.provide(admin), Effect.orDie)
  )

/** The production PostgreSQL client (layers/postgres/Postgres.ts) on `url`, migrated. */
export const migratedDatabase = (url: string) =>
  Layer.effectDiscard(migrate).pipe(Layer.provideMerge(layerServer(Redacted.make(url))))

// ---------------------------------------------------------------------------------------------
// Redis
// ---------------------------------------------------------------------------------------------

/** The test suite's registry of Redis databases (test/support/redis.ts): key in db 0, SET NX EX. */
const claimKey = (db: number) => `sweeper-test:db:${db}`
const RELEASE_CLAIM = `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`

/**
 * A client on the benchmark's Redis database, flushed (FLUSHDB) when acquired and again when the
 * scope closes. Databases 1–15 are also claimed in the test suite's registry first, so a concurrent
 * `npm test` never gets (and flushes) the database under a running benchmark, nor the reverse.
 */
export const benchRedis = Effect.acquireRelease(
  Effect.promise(async () => {
    const client = new IORedis(redisUrl, { lazyConnect: true, maxRetriesPerRequest: 2 })
    client.on("error", () => {})
    await client.connect()
    const token = randomUUID()
    const claimed = redisDb >= 1 && redisDb <= 15
    if (claimed) {
      const registry = client.duplicate({ db: 0 })
      registry.on("error", () => {})
      const ok = await registry.set(claimKey(redisDb), `bench:${token}`, "EX", 3600, "NX")
      await registry.quit()
      if (ok === null) {
        await client.quit()
        throw new Error(
          `Redis database ${redisDb} is claimed by a running test (${claimKey(redisDb)}); set BENCH_REDIS_URL`
        )
      }
    }
    await client.flushdb()
    return { client, token, claimed }
  }),
  ({ client, token, claimed }) =>
    Effect.promise(async () => {
      await client.flushdb()
      if (claimed) {
        const registry = client.duplicate({ db: 0 })
        registry.on("error", () => {})
        await registry.eval(RELEASE_CLAIM, 1, claimKey(redisDb), `bench:${token}`)
        await registry.quit()
      }
      await client.quit()
      console.log(`flushed redis database ${redisDb}`)
    })
).pipe(Effect.map(({ client }) => client))

export interface CommandStats {
  calls: number
  /** Summed time from sending the command to its reply (round trip + server time). */
  ms: number
}

/** What ioredis's tracing channel hands each subscriber. */
export interface CommandContext {
  readonly command: string
  readonly args: ReadonlyArray<string>
  readonly database: number
}

/**
 * Counts and times the Redis commands sent to the benchmark's database while `effect` runs, by
 * `label` (the command name unless given), through ioredis's `ioredis:command` tracing channel.
 * Outside a pipeline each command is one round trip.
 */
export const countingRedisCommands = <A, E, R>(
  effect: Effect.Effect<A, E, R>,
  label: (context: CommandContext) => string = (context) => context.command
) =>
  Effect.acquireUseRelease(
    Effect.sync(() => {
      const stats = new Map<string, CommandStats>()
      const started = new WeakMap<object, number>()
      const onStart = (message: unknown) => {
        if ((message as CommandContext).database === redisDb) started.set(message as object, performance.now())
      }
      const onEnd = (message: unknown) => {
        // asyncEnd follows both a reply and an error.
        const start = started.get(message as object)
        if (start === undefined) return
        started.delete(message as object)
        const key = label(message as CommandContext)
        const entry = stats.get(key) ?? { calls: 0, ms: 0 }
        entry.calls++
        entry.ms += performance.now() - start
        stats.set(key, entry)
      }
      subscribe("tracing:ioredis:command:start", onStart)
      subscribe("tracing:ioredis:command:asyncEnd", onEnd)
      return { stats, onStart, onEnd }
    }),
    ({ stats }) => Effect.map(effect, (result) => [result, stats as ReadonlyMap<string, CommandStats>] as const),
    ({ onStart, onEnd }) =>
      Effect.sync(() => {
        unsubscribe("tracing:ioredis:command:start", onStart)
        unsubscribe("tracing:ioredis:command:asyncEnd", onEnd)
      })
  )

// ---------------------------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------------------------

/** A full GC, if V8 lets us expose it at run time (it does on Node 24); otherwise a no-op. */
export const collectGarbage: () => void = (() => {
  try {
    setFlagsFromString("--expose-gc")
    const gc = runInNewContext("gc") as unknown
    return typeof gc === "function" ? () => (gc as () => void)() : () => {}
  } catch {
    return () => {}
  }
})()

export interface MemoryFigures {
  readonly rss: number
  readonly heapUsed: number
}

export const memoryNow = (): MemoryFigures => {
  const { rss, heapUsed } = process.memoryUsage()
  return { rss, heapUsed }
}

export interface MemoryPeaks extends MemoryFigures {
  readonly samples: number
  /** Peaks per bucket, when a `bucket` function was given (e.g. the tenth of the work done). */
  readonly byBucket: ReadonlyMap<number, MemoryFigures>
}

/**
 * Samples RSS and used heap every `everyMs` while `effect` runs; returns the peaks, overall and per
 * `bucket()` (read at each sample) so a trend over the run shows.
 */
export const samplingMemory = (everyMs: number, bucket?: () => number) => <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.acquireUseRelease(
    Effect.sync(() => {
      const byBucket = new Map<number, { rss: number; heapUsed: number }>()
      const peak = { rss: 0, heapUsed: 0, samples: 0, byBucket }
      const sample = () => {
        const now = memoryNow()
        peak.rss = Math.max(peak.rss, now.rss)
        peak.heapUsed = Math.max(peak.heapUsed, now.heapUsed)
        peak.samples++
        if (bucket !== undefined) {
          const key = bucket()
          const current = byBucket.get(key) ?? { rss: 0, heapUsed: 0 }
          byBucket.set(key, { rss: Math.max(current.rss, now.rss), heapUsed: Math.max(current.heapUsed, now.heapUsed) })
        }
      }
      sample()
      const timer = setInterval(sample, everyMs)
      return { peak, sample, timer }
    }),
    ({ peak }) => Effect.map(effect, (result) => [result, peak as MemoryPeaks] as const),
    ({ sample, timer }) =>
      Effect.sync(() => {
        clearInterval(timer)
        sample()
      })
  )

// ---------------------------------------------------------------------------------------------
// Timing and formatting
// ---------------------------------------------------------------------------------------------

/** Accumulated time and calls of one instrumented operation. */
export class Stopwatch {
  calls = 0
  totalMs = 0
  readonly samples: Array<number> = []
  readonly keepSamples: boolean
  constructor(keepSamples = false) {
    this.keepSamples = keepSamples
  }
  /** Times every evaluation of `effect` (success or failure). */
  time<A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> {
    return Effect.suspend(() => {
      const start = performance.now()
      return Effect.ensuring(effect, Effect.sync(() => this.record(performance.now() - start)))
    })
  }
  record(ms: number) {
    this.calls++
    this.totalMs += ms
    if (this.keepSamples) this.samples.push(ms)
  }
}

export const timed = <A, E, R>(label: string, effect: Effect.Effect<A, E, R>) =>
  Effect.gen(function*() {
    const start = performance.now()
    const result = yield* effect
    console.log(`${label.padEnd(46)} ${((performance.now() - start) / 1000).toFixed(2)} s`)
    return result
  })

export const line = (label: string, value: string | number) =>
  console.log(`${label.padEnd(46)} ${typeof value === "number" ? fmt(value) : value}`)

export const fmt = (n: number, digits = 0) =>
  n.toLocaleString("en", { minimumFractionDigits: digits, maximumFractionDigits: digits })

export const mb = (bytes: number) => `${(bytes / 1024 / 1024).toFixed(1)} MB`

/** Peak resident set size of the whole process so far (getrusage ru_maxrss). */
export const maxRss = () => process.resourceUsage().maxRSS * 1024

export const percentile = (sorted: ReadonlyArray<number>, p: number) =>
  sorted.length === 0 ? Number.NaN : sorted[Math.min(sorted.length - 1, Math.floor((sorted.length - 1) * p))]!

/** `hdel 10,000 (0.21 ms avg), hscan 499 (…)`, most frequent first. */
export const formatCommands = (stats: ReadonlyMap<string, CommandStats>) =>
  [...stats.entries()].sort((a, b) => b[1].calls - a[1].calls)
    .map(([command, { calls, ms }]) => `${command} ${fmt(calls)} (${(ms / calls).toFixed(2)} ms avg)`).join(", ")
