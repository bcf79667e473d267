/**
 * The supervisor's HTTP surface, end to end: a real `sweeper start` process on real PostgreSQL and
 * Redis, every endpoint called over loopback.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Redacted } from "effect"
import { randomUUID } from "node:crypto"
import { layerServer } from "../../src/layers/postgres/Postgres.ts"
import { freshDatabase } from "../support/postgres.ts"
import { scopedSweeper } from "../support/processes.ts"
import { freshRedisUrl } from "../support/redis.ts"

const TOKEN = "test-token"

describe("HTTP", () => {
  it.live(
    "serves health, readiness, metrics, the batch API, the dashboard and guarded actions",
    () =>
      Effect.gen(function*() {
        const db = yield* freshDatabase
        const redisUrl = yield* freshRedisUrl
        const sweeper = yield* scopedSweeper("http", {
          DATABASE_URL: db.url,
          REDIS_URL: redisUrl,
          SWEEPER_HTTP_PORT: "0",
          SWEEPER_API_TOKEN: TOKEN,
          SWEEPER_CRON_STUCK_EXPORT_JOBS: "* * * * * *"
        })
        const base = yield* Effect.promise(() => sweeper.listening)
        const get = (path: string, init: RequestInit = {}) =>
          Effect.promise(async () => {
            const response = await fetch(`${base}${path}`, init)
            return {
              status: response.status,
              type: response.headers.get("content-type") ?? "",
              body: await response.text()
            }
          })
        const post = (path: string, token?: string) =>
          get(path, { method: "POST", headers: token === undefined ? {} : { authorization: `Bearer ${token}` } })

        const health = yield* get("/healthz")
        assert.strictEqual(health.status, 200)
        assert.strictEqual(health.body.trim(), "ok")

        const ready = yield* get("/readyz")
        assert.strictEqual(ready.status, 200)
        assert.deepStrictEqual(JSON.parse(ready.body), {
          ready: true,
          postgres: "ok",
          redis: "ok",
          redisStores: {
            sharedState: { status: "ok", kind: "single" },
            queues: { status: "ok", kind: "single" },
            queuesMetadata: { status: "ok", kind: "single" }
          }
        })

        // Let stuck-export-jobs tick at least once so the metrics have runs in them.
        yield* Effect.sleep("2500 millis")
        const batches = yield* get("/api/batches")
        assert.strictEqual(batches.status, 200)
        const list = JSON.parse(batches.body) as Array<Record<string, unknown>>
        assert.deepStrictEqual(list.map((b) => b.name).sort(), [
          "concurrency-limit-resume",
          "delete-stale-direct-uploads",
          "drop-canceling-builds",
          "drop-pending-builds",
          "drop-running-builds",
          "drop-scheduled-builds",
          "prune-events",
          "reschedule-stuck-issue-rebalances",
          "stuck-export-jobs"
        ])
        assert.strictEqual(list.find((b) => b.name === "prune-events")!.cron, "17 3 * * *")
        // GitLab's stagger of the stuck-builds family, each on its own minute.
        assert.deepStrictEqual(
          ["drop-pending-builds", "drop-running-builds", "drop-scheduled-builds"].map((name) =>
            list.find((b) => b.name === name)!.cron
          ),
          ["0 * * * *", "15 * * * *", "30 * * * *"]
        )
        const exports = list.find((b) => b.name === "stuck-export-jobs")!
        assert.strictEqual(exports.cron, "* * * * * *")
        assert.strictEqual(exports.lastOutcome, "succeeded")
        assert.isString(exports.nextTick)
        assert.strictEqual(list.find((b) => b.name === "drop-canceling-builds")!.cron, "45 * * * *")
        // The rest of the stuck-builds family, on the minutes GitLab staggers them to.
        assert.strictEqual(list.find((b) => b.name === "drop-pending-builds")!.cron, "0 * * * *")
        assert.strictEqual(list.find((b) => b.name === "drop-running-builds")!.cron, "15 * * * *")
        assert.strictEqual(list.find((b) => b.name === "drop-scheduled-builds")!.cron, "30 * * * *")

        const metrics = yield* get("/metrics")
        assert.strictEqual(metrics.status, 200)
        assert.include(metrics.type, "text/plain")
        assert.match(metrics.body, /sweeper_runs_total\{batch="stuck-export-jobs",outcome="succeeded"\} \d+/)
        // prune-events' series exist from start-up, before its first (daily) run.
        assert.match(metrics.body, /sweeper_runs_total\{batch="prune-events",outcome="failed"\} 0/)
        assert.match(metrics.body, /^sweeper_events_pruned_total(\{\})? 0$/m)
        // So is the count of uploads that vanished under a repair (a rate of races needs a series).
        assert.match(metrics.body, /^sweeper_direct_uploads_vanished_total(\{\})? 0$/m)
        assert.match(
          metrics.body,
          /sweeper_run_duration_seconds_bucket\{batch="stuck-export-jobs",outcome="succeeded",le="0.05"\}/
        )
        // Every batch × outcome series is there from start-up, at 0 until its first run of that outcome.
        assert.match(metrics.body, /sweeper_runs_total\{batch="drop-canceling-builds",outcome="failed"\} 0/)
        assert.match(
          metrics.body,
          /sweeper_ticks_missed_total\{batch="drop-canceling-builds",reason="breaker_open"\} 0/
        )
        assert.match(metrics.body, /sweeper_build_info\{version="0\.1\.0",node_version="v\d+[^"]*",node="http"\} 1/)
        assert.match(metrics.body, /sweeper_batch_paused\{batch="stuck-export-jobs"\} 0/)
        assert.match(metrics.body, /sweeper_batch_breaker_open\{batch="stuck-export-jobs"\} 0/)
        assert.match(metrics.body, /process_resident_memory_bytes \d+/)
        assert.match(metrics.body, /nodejs_eventloop_lag_p99_seconds [\d.e-]+/)
        assert.match(metrics.body, /sweeper_last_success_age_seconds\{batch="stuck-export-jobs"\} \d/)

        const dashboard = yield* get("/")
        assert.strictEqual(dashboard.status, 200)
        assert.include(dashboard.type, "text/html")
        assert.include(dashboard.body, "drop-canceling-builds")

        assert.strictEqual((yield* post("/api/batches/drop-canceling-builds/run")).status, 401)
        assert.strictEqual((yield* post("/api/batches/drop-canceling-builds/run", "wrong")).status, 401)
        const ran = yield* post("/api/batches/drop-canceling-builds/run", TOKEN)
        assert.strictEqual(ran.status, 200)
        const result = JSON.parse(ran.body)
        assert.strictEqual(result.outcome, "succeeded")
        assert.deepStrictEqual(result.summary, {
          dropped: 0,
          doomed: 0,
          batches: 0,
          skippedLocked: 0,
          heldMs: 0,
          heldBy: []
        })
        // delete-stale-direct-uploads counts the entries that vanished under it; its card shows the count.
        const uploads = yield* post("/api/batches/delete-stale-direct-uploads/run", TOKEN)
        assert.strictEqual(uploads.status, 200, uploads.body)
        assert.include(JSON.parse(uploads.body).summary, { vanished: 0 })
        const card =
          (yield* get("/")).body.split("data-batch=\"delete-stale-direct-uploads\"")[1]?.split("</section>")[0] ?? ""
        assert.match(card, /vanished\b[^0-9]{0,40}0/, card)
        const unknown = yield* post("/api/batches/nope/run", TOKEN)
        assert.strictEqual(unknown.status, 404)
        assert.deepInclude(JSON.parse(unknown.body).error, { code: "unknown_batch" })
        const wrong = yield* post("/api/batches/drop-canceling-builds/run", "x".repeat(TOKEN.length))
        assert.deepStrictEqual(JSON.parse(wrong.body), {
          error: { code: "unauthorized", message: "missing or wrong bearer token" }
        })

        // A dry run through the API is marked as one and lists its targets.
        const dry = yield* get("/api/batches/drop-canceling-builds/run", {
          method: "POST",
          headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" },
          body: JSON.stringify({ dryRun: true })
        })
        assert.strictEqual(dry.status, 200, dry.body)
        assert.include(JSON.parse(dry.body), { dryRun: true, outcome: "succeeded", targetsTotal: 0 })
        const badBody = yield* get("/api/batches/drop-canceling-builds/run", {
          method: "POST",
          headers: { authorization: `Bearer ${TOKEN}` },
          body: "{\"dryRun\": \"yes\"}"
        })
        assert.strictEqual(badBody.status, 400)
        assert.strictEqual(JSON.parse(badBody.body).error.code, "bad_request")

        // One batch with its runs; runs and events filtered.
        const one = JSON.parse((yield* get("/api/batches/drop-canceling-builds")).body)
        assert.strictEqual(one.name, "drop-canceling-builds")
        assert.deepStrictEqual(one.runs.map((r: { dryRun: boolean; trigger: string }) => [r.dryRun, r.trigger]), [[
          true,
          "manual"
        ], [false, "manual"]])
        assert.strictEqual(one.config.budget, "25m")
        const runs = JSON.parse((yield* get("/api/runs?batch=stuck-export-jobs&limit=2")).body) as Array<
          { batch: string }
        >
        assert.lengthOf(runs, 2)
        assert.isTrue(runs.every((r) => r.batch === "stuck-export-jobs"))
        assert.strictEqual((yield* get("/api/runs?batch=nope")).status, 404)
        const finished = JSON.parse(
          (yield* get("/api/events?stream=batch:drop-canceling-builds&type=RunFinished")).body
        ) as Array<{ type: string }>
        assert.lengthOf(finished, 2)
        assert.deepStrictEqual(JSON.parse((yield* get("/api/events?since=2999-01-01T00:00:00Z")).body), [])
        assert.strictEqual(JSON.parse((yield* get("/api/events?since=yesterday")).body).error.code, "bad_request")

        assert.strictEqual((yield* post("/api/batches/stuck-export-jobs/pause", TOKEN)).status, 200)
        yield* Effect.sleep("300 millis")
        const paused = JSON.parse((yield* get("/api/batches")).body) as Array<Record<string, unknown>>
        assert.strictEqual(paused.find((b) => b.name === "stuck-export-jobs")!.state, "paused")
        assert.match((yield* get("/metrics")).body, /sweeper_batch_paused\{batch="stuck-export-jobs"\} 1/)
        assert.strictEqual((yield* post("/api/batches/stuck-export-jobs/resume", TOKEN)).status, 200)
        yield* Effect.sleep("300 millis")
        const resumed = JSON.parse((yield* get("/api/batches")).body) as Array<Record<string, unknown>>
        assert.notStrictEqual(resumed.find((b) => b.name === "stuck-export-jobs")!.state, "paused")

        sweeper.child.kill("SIGTERM")
        assert.strictEqual(yield* Effect.promise(() => sweeper.exited), 0)
      }).pipe(Effect.scoped),
    150_000
  )

  it.live("without SWEEPER_API_TOKEN the mutating actions are refused", () =>
    Effect.gen(function*() {
      const sweeper = yield* scopedSweeper("no-token", {
        SWEEPER_HTTP_PORT: "0",
        SWEEPER_DATA_DIR: `/tmp/sweeper-http-${process.pid}`
      })
      const base = yield* Effect.promise(() => sweeper.listening)
      const response = yield* Effect.promise(() =>
        fetch(`${base}/api/batches/drop-canceling-builds/run`, { method: "POST" })
      )
      assert.strictEqual(response.status, 403)
      assert.strictEqual(
        (yield* Effect.promise(() => response.json() as Promise<{ error: { code: string } }>)).error.code,
        "api_disabled"
      )
    }).pipe(Effect.scoped), 150_000)

  it.live(
    "a run through the API that closed an abandoned run answers with it (its finishedAt a date)",
    () =>
      Effect.gen(function*() {
        const db = yield* freshDatabase
        const redisUrl = yield* freshRedisUrl
        const sweeper = yield* scopedSweeper("http-abandoned", {
          DATABASE_URL: db.url,
          REDIS_URL: redisUrl,
          SWEEPER_HTTP_PORT: "0",
          SWEEPER_API_TOKEN: TOKEN
        })
        const base = yield* Effect.promise(() => sweeper.listening)
        // A run killed three hours ago: started, never finished, long past its budget.
        const abandoned = randomUUID()
        yield* Effect.gen(function*() {
          const sql = yield* PgClient.PgClient
          yield* sql`INSERT INTO sweeper_events (stream, type, data, run_id, occurred_at)
          VALUES ('batch:stuck-export-jobs', 'RunStarted', ${
            sql.json({
              batch: "stuck-export-jobs",
              run_id: abandoned,
              node: "gone",
              trigger: "schedule",
              dryRun: false
            })
          }, ${abandoned}, now() - interval '3 hours')`
        }).pipe(Effect.provide(layerServer(Redacted.make(db.url))))

        const response = yield* Effect.promise(async () => {
          const answer = await fetch(`${base}/api/batches/stuck-export-jobs/run`, {
            method: "POST",
            headers: { authorization: `Bearer ${TOKEN}` }
          })
          return { status: answer.status, body: await answer.text() }
        })
        assert.strictEqual(response.status, 200, response.body)
        const result = JSON.parse(response.body) as {
          outcome: string
          closed: ReadonlyArray<{ runId: string; outcome: string; finishedAt: string }>
        }
        assert.strictEqual(result.outcome, "succeeded")
        assert.deepStrictEqual(result.closed.map((run) => [run.runId, run.outcome]), [[abandoned, "abandoned"]])
        assert.isFalse(Number.isNaN(Date.parse(result.closed[0]!.finishedAt)))
      }).pipe(Effect.scoped),
    150_000
  )
})
