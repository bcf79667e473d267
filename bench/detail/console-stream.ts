/**
 * What open console tabs cost a running supervisor: the real `sweeper start` on a throw-away
 * database, drop-canceling-builds runs of BENCH_BUILDS stuck builds each, alternately with no
 * console client and with BENCH_CLIENTS open `/api/stream` connections (each reading every frame,
 * as a dashboard tab does), and the database's transactions per second while idle with 0 and with
 * BENCH_CLIENTS clients. Ratios are against the no-client rounds of the same run. Prints figures only.
 *
 *   npm run bench -- detail/console-stream
 *   BENCH_BUILDS=5000 BENCH_CLIENTS=50 BENCH_ROUNDS=3 BENCH_REDIS_URL=redis://127.0.0.1:6393/12 npm run bench -- detail/console-stream
 */
import { NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Effect } from "effect"
import { spawn } from "node:child_process"
import { performance } from "node:perf_hooks"
import { fileURLToPath } from "node:url"
import { cronVariable } from "../../src/domain/Schedule.ts"
import { batchNames } from "../../src/programs/index.ts"
import { benchDatabase, benchRedis, envInt, fmt, line, migratedDatabase, redisUrl } from "../support/harness.ts"

const BUILDS = envInt("BENCH_BUILDS", 5000)
const CLIENTS = envInt("BENCH_CLIENTS", 50)
const ROUNDS = envInt("BENCH_ROUNDS", 3)
const IDLE_SECONDS = envInt("BENCH_IDLE_SECONDS", 30)
const SETTLE_SECONDS = 11
const TOKEN = "bench-console-token"
const root = fileURLToPath(new URL("../..", import.meta.url))

const median = (values: ReadonlyArray<number>) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!

/** The supervisor as operators run it, every batch's cron far away so only the bench's runs happen. */
const startSupervisor = (databaseUrl: string) =>
  Effect.acquireRelease(
    Effect.promise(async () => {
      const quiet = Object.fromEntries(batchNames.map((name) => [cronVariable(name), "0 0 1 1 *"]))
      const child = spawn(process.execPath, ["src/main.ts", "start"], {
        cwd: root,
        env: {
          PATH: process.env.PATH ?? "",
          HOME: process.env.HOME ?? "/tmp",
          DATABASE_URL: databaseUrl,
          REDIS_URL: redisUrl,
          SWEEPER_HTTP_PORT: "0",
          SWEEPER_API_TOKEN: TOKEN,
          SWEEPER_LOG_LEVEL: "Info",
          ...quiet
        },
        stdio: ["ignore", "pipe", "pipe"]
      })
      let output = ""
      const url = await new Promise<string>((resolve, reject) => {
        const look = (chunk: Buffer) => {
          output += chunk
          const match = /HTTP listening on (http:\/\/[^\s"\\]+)/.exec(output)
          if (match) resolve(match[1]!)
        }
        child.stdout.on("data", look)
        child.stderr.on("data", look)
        child.on("exit", (code) => reject(new Error(`supervisor exited ${code}: ${output.slice(-2000)}`)))
      })
      return { child, url }
    }),
    ({ child }) =>
      Effect.promise(() =>
        new Promise<void>((resolve) => {
          child.on("exit", () => resolve())
          child.kill("SIGTERM")
        })
      )
  )

/** `count` SSE clients that read every frame until closed; returns how to close them and the bytes read. */
const openClients = async (url: string, count: number) => {
  const controller = new AbortController()
  let bytes = 0
  let frames = 0
  await Promise.all(Array.from({ length: count }, async () => {
    const response = await fetch(`${url}/api/stream`, { signal: controller.signal })
    if (response.status !== 200) throw new Error(`/api/stream answered ${response.status}`)
    const reader = response.body!.getReader()
    void (async () => {
      try {
        for (;;) {
          const { done, value } = await reader.read()
          if (done) return
          bytes += value.byteLength
          frames += new TextDecoder().decode(value).split("event: page").length - 1
        }
      } catch {
        // Aborted at the end of the phase.
      }
    })()
  }))
  return { close: () => controller.abort(), read: () => ({ bytes, frames }) }
}

const measure = (name: string, url: string) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    // Autovacuum's transactions count in pg_stat_database too, and a drop run wakes it: off on this
    // throw-away database, so the counts below are the supervisor's own.
    yield* sql.unsafe(`DO $$ DECLARE t record; BEGIN
    FOR t IN SELECT schemaname, tablename FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')
    LOOP EXECUTE format('ALTER TABLE %I.%I SET (autovacuum_enabled = false)', t.schemaname, t.tablename); END LOOP;
  END $$`)
    const { url: base } = yield* startSupervisor(url)
    let nextId = 1
    const seed = () =>
      sql`
    INSERT INTO ci_builds (id, project_id, status, created_at, updated_at)
    SELECT i, 1 + i % 50, 'canceling', (now() AT TIME ZONE 'UTC') - interval '2 hours',
      (now() AT TIME ZONE 'UTC') - interval '2 hours'
    FROM generate_series(${nextId}::bigint, ${nextId + BUILDS - 1}::bigint) AS i`
    /** Transactions committed or rolled back in the bench database so far (every session's). */
    const transactions = Effect.gen(function*() {
      yield* sql`SELECT pg_stat_clear_snapshot()`
      const [row] = yield* sql<{ n: string }>`
      SELECT xact_commit + xact_rollback AS n FROM pg_stat_database WHERE datname = ${name}`
      return Number(row!.n)
    })
    const dropRun = Effect.gen(function*() {
      yield* seed()
      nextId += BUILDS
      const started = performance.now()
      const answer = yield* Effect.promise(() =>
        fetch(`${base}/api/batches/drop-canceling-builds/run`, {
          method: "POST",
          headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" },
          body: "{}"
        }).then((r) => r.json() as Promise<{ outcome: string; summary: { dropped?: number } }>)
      )
      const ms = performance.now() - started
      if (answer.outcome !== "succeeded") throw new Error(JSON.stringify(answer))
      return (answer.summary.dropped ?? 0) / (ms / 1000)
    })
    const withClients = <A, E, R>(count: number, effect: Effect.Effect<A, E, R>) =>
      Effect.acquireUseRelease(
        Effect.promise(() => openClients(base, count)),
        () => effect,
        (clients) => Effect.sync(() => clients.close())
      )
    // A backend sends its statistics when idle for up to 10 s (PGSTAT_IDLE_INTERVAL): every count waits that
    // long first, so what it reads includes the window's own transactions.
    const settled = Effect.andThen(Effect.sleep(`${SETTLE_SECONDS} seconds`), transactions)
    const idleRate = (count: number) =>
      withClients(
        count,
        Effect.gen(function*() {
          const before = yield* settled
          yield* Effect.sleep(`${IDLE_SECONDS} seconds`)
          // The count's own two statements are left out.
          return ((yield* settled) - before - 2) / (IDLE_SECONDS + SETTLE_SECONDS)
        })
      )
    const perRun = (count: number) =>
      withClients(
        count,
        Effect.gen(function*() {
          const before = yield* settled
          yield* dropRun
          return (yield* settled) - before - 2
        })
      )

    yield* dropRun // warm-up: compiled code, connections, plans
    const alone: Array<number> = []
    const watched: Array<number> = []
    // Which goes first alternates, so a warming cache or a growing table favours neither side.
    for (let round = 0; round < ROUNDS; round++) {
      if (round % 2 === 0) {
        alone.push(yield* dropRun)
        watched.push(yield* withClients(CLIENTS, dropRun))
      } else {
        watched.push(yield* withClients(CLIENTS, dropRun))
        alone.push(yield* dropRun)
      }
    }
    const idleAlone = yield* idleRate(0)
    const idleWatched = yield* idleRate(CLIENTS)
    const runAlone = yield* perRun(0)
    const runWatched = yield* perRun(CLIENTS)
    console.log(`console stream: ${CLIENTS} SSE clients, drop runs of ${BUILDS} stuck builds, ${ROUNDS} rounds`)
    line("drop throughput, no clients (builds/s, median)", fmt(median(alone)))
    line(`drop throughput, ${CLIENTS} clients (builds/s, median)`, fmt(median(watched)))
    line("throughput ratio (clients / none)", (median(watched) / median(alone)).toFixed(3))
    line("database transactions/s idle, no clients", idleAlone.toFixed(2))
    line(`database transactions/s idle, ${CLIENTS} clients`, idleWatched.toFixed(2))
    line("database transactions per drop run, no clients", fmt(runAlone))
    line(`database transactions per drop run, ${CLIENTS} clients`, fmt(runWatched))
  }).pipe(Effect.scoped)

const program = Effect.gen(function*() {
  const { name, url } = yield* benchDatabase(undefined)
  yield* benchRedis
  yield* measure(name, url).pipe(Effect.provide(migratedDatabase(url)))
}).pipe(Effect.scoped)

NodeRuntime.runMain(program.pipe(Effect.orDie))
