/**
 * delete-stale-direct-uploads on a large `pending_direct_uploads` hash: 1,000,000 fields seeded with
 * pipelined HSET by a child process (every 5th one stale, i.e. prepared more than 3 h ago, the rest
 * fresh, every 10,000th a malformed value), then the batch through the run guard with the real layers
 * (PostgreSQL event log, Redis, local object storage) and a budget large enough to finish. The
 * figures to look at: entries scanned per second, and the process's memory, which stays flat while
 * the hash is walked with HSCAN (never loaded whole) compared with the size of the hash itself —
 * sampled every 20 ms, with the peak per tenth of the walk so a trend would show.
 *
 * Object storage: every location is configured (SWEEPER_OBJECT_STORAGE semantics) to a root under a
 * temporary directory; BENCH_OBJECTS stale entries have a real file there (deleted), the others'
 * objects are missing (which counts as deleted), so each stale entry goes through the real
 * filesystem checks. BENCH_OBJECT_STORE=none configures no store: only the Redis fields are removed.
 *
 *   npm run bench -- delete-stale-direct-uploads
 *   BENCH_ENTRIES=200000 BENCH_OBJECT_STORE=none BENCH_SYNCHRONOUS_COMMIT=off npm run bench -- delete-stale-direct-uploads
 *   (BENCH_DATABASE_URL, BENCH_REDIS_URL: admin database and Redis database, defaults …/test and …/12)
 */
import { NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Duration, Effect, Layer, Redacted, Stream } from "effect"
import { execFile } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { performance } from "node:perf_hooks"
import { fileURLToPath } from "node:url"
import { SweeperConfig } from "../../src/config/Config.ts"
import { type Location, PENDING_DIRECT_UPLOADS_KEY, SCAN_PAGE_SIZE } from "../../src/domain/DirectUpload.ts"
import { ObjectStorageLocal } from "../../src/layers/objectStorage/ObjectStorageLocal.ts"
import { EventLogSql } from "../../src/layers/postgres/EventLogSql.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { StaleUploadRepairLive } from "../../src/layers/protocols/StaleUploadRepairLive.ts"
import { LeaseRedis } from "../../src/layers/redis/LeaseRedis.ts"
import { PendingDirectUploadsRedis } from "../../src/layers/redis/PendingDirectUploadsRedis.ts"
import { Redis } from "../../src/layers/redis/Redis.ts"
import {
  DeleteStaleDirectUploads,
  type DeleteStaleDirectUploadsSummary
} from "../../src/programs/DeleteStaleDirectUploads.ts"
import { EventLog } from "../../src/services/EventLog.ts"
import { ObjectStorage } from "../../src/services/ObjectStorage.ts"
import { PendingDirectUploads } from "../../src/services/PendingDirectUploads.ts"
import { runBatch } from "../../src/supervisor/RunGuard.ts"
import {
  adminUrl,
  benchDatabase,
  benchRedis,
  collectGarbage,
  countingRedisCommands,
  envInt,
  fmt,
  formatCommands,
  line,
  maxRss,
  mb,
  memoryNow,
  migratedDatabase,
  redisUrl,
  samplingMemory,
  Stopwatch,
  timed
} from "../support/harness.ts"
import { BenchLogging } from "../support/logging.ts"
import type { SeedCounts, SeedOptions } from "../support/seed-pending-direct-uploads.ts"

const ENTRIES = envInt("BENCH_ENTRIES", 1_000_000)
/** Every STALE_EVERY-th entry is stale (20%). */
const STALE_EVERY = 5
/** Every INVALID_EVERY-th entry (offset 1, never a stale one) has a value that is not a timestamp. */
const INVALID_EVERY = 10_000
const WITH_OBJECT_STORE = process.env.BENCH_OBJECT_STORE !== "none"
/** Stale entries whose object really exists (the rest are missing objects). */
const PRESENT_OBJECTS = WITH_OBJECT_STORE ? envInt("BENCH_OBJECTS", 1_000) : 0
const SYNCHRONOUS_COMMIT = process.env.BENCH_SYNCHRONOUS_COMMIT
/** Fields per HSET, HSETs per pipeline (one round trip). */
const FIELDS_PER_HSET = 1_000
const HSETS_PER_PIPELINE = 10
const BUDGET = Duration.minutes(60)
const SAMPLE_EVERY_MS = 20

const LOCATIONS_USED: ReadonlyArray<Location> = ["artifacts", "lfs", "uploads", "packages"]

/**
 * Seeds in a child process (bench/support/seed-pending-direct-uploads.ts, same Node binary): the
 * seeding's garbage would otherwise stay in this process's RSS and hide whatever the run allocates.
 */
const seed = (roots: Readonly<Record<string, string>>) =>
  Effect.tryPromise(() => {
    const options: SeedOptions = {
      redisUrl,
      key: PENDING_DIRECT_UPLOADS_KEY,
      entries: ENTRIES,
      staleEvery: STALE_EVERY,
      invalidEvery: INVALID_EVERY,
      locations: LOCATIONS_USED,
      roots,
      presentObjects: PRESENT_OBJECTS,
      fieldsPerHset: FIELDS_PER_HSET,
      hsetsPerPipeline: HSETS_PER_PIPELINE
    }
    const script = fileURLToPath(new URL("../support/seed-pending-direct-uploads.ts", import.meta.url))
    return new Promise<SeedCounts>((resolve, reject) =>
      execFile(process.execPath, [script, JSON.stringify(options)], (error, stdout, stderr) =>
        error === null
          ? resolve(JSON.parse(stdout) as SeedCounts)
          : reject(new Error(`seeder failed: ${stderr || error.message}`)))
    )
  })

/** Instrumentation around the real layers: counts the entries HSCAN returns and times each step of a stale entry. */
const scanned = { entries: 0 }
const removeTime = new Stopwatch()
const storageTime = new Stopwatch()
const appendTime = new Stopwatch()

const InstrumentedPending = Layer.effect(
  PendingDirectUploads,
  Effect.gen(function*() {
    const real = yield* PendingDirectUploads
    return PendingDirectUploads.of({
      ...real,
      scan: (options) => real.scan(options).pipe(Stream.tap(() => Effect.sync(() => scanned.entries++))),
      remove: (field) => removeTime.time(real.remove(field))
    })
  })
).pipe(Layer.provide(PendingDirectUploadsRedis))

const InstrumentedStorage = (roots: Partial<Record<Location, string>>) =>
  Layer.effect(
    ObjectStorage,
    Effect.gen(function*() {
      const real = yield* ObjectStorage
      return ObjectStorage.of({ ...real, delete: (location, path) => storageTime.time(real.delete(location, path)) })
    })
  ).pipe(Layer.provide(ObjectStorageLocal(roots)))

const InstrumentedEventLog = Layer.effect(
  EventLog,
  Effect.gen(function*() {
    const real = yield* EventLog
    return EventLog.of({ ...real, append: (event) => appendTime.time(real.append(event)) })
  })
).pipe(Layer.provide(EventLogSql))

const objectRoots = Effect.acquireRelease(
  Effect.sync(() => {
    const dir = mkdtempSync(join(tmpdir(), "sweeper-bench-objects-"))
    const roots: Partial<Record<Location, string>> = {}
    if (WITH_OBJECT_STORE) { for (const location of LOCATIONS_USED) roots[location] = join(dir, location) }
    return { dir, roots }
  }),
  ({ dir }) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
)

const startRss = memoryNow().rss

const program = Effect.gen(function*() {
  const database = yield* benchDatabase(SYNCHRONOUS_COMMIT)
  const redis = yield* benchRedis
  const { dir, roots } = yield* objectRoots
  console.log(
    `database ${database.name} on ${new URL(adminUrl).host}, redis ${redisUrl}, ${fmt(ENTRIES)} entries` +
      `${SYNCHRONOUS_COMMIT === undefined ? "" : `, synchronous_commit=${SYNCHRONOUS_COMMIT}`}`
  )
  console.log(
    WITH_OBJECT_STORE
      ? `object storage: ${LOCATIONS_USED.join(", ")} under ${dir} (${
        fmt(PRESENT_OBJECTS)
      } stale objects exist, the rest are missing)\n`
      : "object storage: none configured (only the Redis fields of stale entries are removed)\n"
  )

  const Platform = StaleUploadRepairLive.pipe(
    Layer.provideMerge(Layer.mergeAll(InstrumentedPending, InstrumentedStorage(roots), LeaseRedis, MetricsPrometheus)),
    Layer.provideMerge(InstrumentedEventLog),
    Layer.provideMerge(Layer.mergeAll(
      migratedDatabase(database.url),
      Redis.layerSingle(Redacted.make(redisUrl)),
      SweeperConfig.layerWith({ node: "bench", objectStorage: { _tag: "Local", roots } })
    ))
  )

  line("process RSS at start (after imports)", mb(startRss))
  const seeded = yield* timed(
    `seed (child process, pipelined HSET ${FIELDS_PER_HSET} fields × ${HSETS_PER_PIPELINE})`,
    seed(roots)
  )
  const hlen = yield* Effect.promise(() => redis.hlen(PENDING_DIRECT_UPLOADS_KEY))
  const encoding = yield* Effect.promise(() => redis.object("ENCODING", PENDING_DIRECT_UPLOADS_KEY))
  const hashBytes = yield* Effect.promise(() => redis.memory("USAGE", PENDING_DIRECT_UPLOADS_KEY, "SAMPLES", 0))
  line("pending_direct_uploads HLEN", hlen)
  line("  stale / fresh / invalid", `${fmt(seeded.stale)} / ${fmt(seeded.fresh)} / ${fmt(seeded.invalid)}`)
  line("  MEMORY USAGE (Redis, exact)", `${mb(Number(hashBytes))} (${encoding} encoding)`)
  line("  fields + values as raw bytes", mb(seeded.bytes))
  line("seeder process peak RSS", mb(seeded.seederPeakRss))
  line("this process's peak RSS so far", mb(maxRss()))

  yield* Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    collectGarbage()
    const before = memoryNow()
    const cpu = process.cpuUsage()
    const start = performance.now()
    const [[result, commands], peak] = yield* runBatch(DeleteStaleDirectUploads, { trigger: "manual", budget: BUDGET })
      .pipe(
        countingRedisCommands,
        // Bucket = which tenth of the hash the walk is in.
        samplingMemory(SAMPLE_EVERY_MS, () => Math.min(9, Math.floor((scanned.entries * 10) / Math.max(hlen, 1))))
      )
    const seconds = (performance.now() - start) / 1000
    const cpuUsed = process.cpuUsage(cpu)
    const after = memoryNow()
    collectGarbage()
    const afterGc = memoryNow()

    const summary = result.summary as DeleteStaleDirectUploadsSummary | null
    const events = yield* sql<{ n: string }>`
      SELECT count(*) AS n FROM sweeper_events WHERE run_id = ${result.runId} AND type = 'StaleDirectUploadDeleted'`
    const left = yield* Effect.promise(() => redis.hlen(PENDING_DIRECT_UPLOADS_KEY))

    console.log(
      `\nrun ${result.runId}: ${result.outcome}${result.reason ? ` (${result.reason})` : ""}${
        result.error ? ` ${result.error}` : ""
      }`
    )
    line("summary", JSON.stringify(summary))
    line("wall time", `${seconds.toFixed(2)} s`)
    line("entries scanned (HSCAN)", scanned.entries)
    line("entries scanned/s", fmt(scanned.entries / seconds))
    line("stale deleted", summary?.totalDeletedStaleEntries ?? 0)
    line("stale deleted/s", fmt((summary?.totalDeletedStaleEntries ?? 0) / seconds))
    line("entries left in the hash", `${fmt(left)} (fresh + invalid seeded: ${fmt(seeded.fresh + seeded.invalid)})`)
    line("StaleDirectUploadDeleted events", Number(events[0]!.n))
    line(`Redis commands (HSCAN COUNT ${SCAN_PAGE_SIZE})`, formatCommands(commands))
    line(
      "time per stale entry: object delete",
      `${(storageTime.totalMs / Math.max(storageTime.calls, 1)).toFixed(3)} ms (${
        (storageTime.totalMs / 1000).toFixed(1)
      } s total)`
    )
    line(
      "                      HDEL",
      `${(removeTime.totalMs / Math.max(removeTime.calls, 1)).toFixed(3)} ms (${
        (removeTime.totalMs / 1000).toFixed(1)
      } s total)`
    )
    line(
      "                      event INSERT",
      `${(appendTime.totalMs / Math.max(appendTime.calls, 1)).toFixed(3)} ms (${
        (appendTime.totalMs / 1000).toFixed(1)
      } s total)`
    )
    line("process CPU (user+sys)", `${((cpuUsed.user + cpuUsed.system) / 1e6).toFixed(2)} s`)
    console.log("\nmemory (Node process)                      RSS          heap used")
    console.log(`  before the run (after GC)                ${mb(before.rss).padEnd(12)} ${mb(before.heapUsed)}`)
    console.log(
      `  peak during the run (${fmt(peak.samples)} samples)${" ".repeat(Math.max(0, 13 - fmt(peak.samples).length))}${
        mb(peak.rss).padEnd(12)
      } ${mb(peak.heapUsed)}`
    )
    console.log(`  after the run                            ${mb(after.rss).padEnd(12)} ${mb(after.heapUsed)}`)
    console.log(`  after the run (after GC)                 ${mb(afterGc.rss).padEnd(12)} ${mb(afterGc.heapUsed)}`)
    line(
      "  peak growth during the run",
      `RSS +${mb(peak.rss - before.rss)}, heap +${mb(peak.heapUsed - before.heapUsed)}`
    )
    console.log("  peak per tenth of the walk (entries scanned → RSS / heap used):")
    for (const [tenth, figures] of [...peak.byBucket.entries()].sort((a, b) => a[0] - b[0])) {
      console.log(
        `    ${`${tenth * 10}–${tenth * 10 + 10}%`.padEnd(10)} ${mb(figures.rss).padEnd(12)} ${mb(figures.heapUsed)}`
      )
    }
    line("  hash in Redis, for comparison", mb(Number(hashBytes)))
    line("  process peak RSS (whole process)", mb(maxRss()))
    console.log("")
  }).pipe(Effect.provide(Platform))
})

program.pipe(
  Effect.scoped,
  // Sweeper logs as in production (Info, JSON lines into a scratch file: support/logging.ts).
  Effect.provide(BenchLogging),
  Effect.timeout(Duration.minutes(90)),
  NodeRuntime.runMain
)
