/**
 * The console's shadow view through a real supervisor on PostgreSQL: GET /api/batches/:name/shadow
 * answers exactly what the ledger's report (the one `sweeper shadow report` prints) reads for the
 * window; the HTML page shows the agreement, the counts and the disagreements with every hostile
 * string escaped; the batch page of a shadow batch links to it; an acting batch's view says so; a
 * batch without shadow mode and a bad window are refused in the API's one error shape.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { ShadowLedgerSql } from "../../src/layers/postgres/ShadowLedgerSql.ts"
import { ShadowLedger } from "../../src/services/ShadowLedger.ts"
import { PgTest, TestDatabaseUrl } from "../support/postgres.ts"
import { startSweeper } from "../support/processes.ts"
import { RedisTest, TestRedisUrl } from "../support/redis.ts"
import { HOSTILE, HOSTILE_ENTITY, seedShadowLedger } from "../support/shadowLedgerSeed.ts"

const NEVER = "0 0 1 1 *"

const get = (url: string) =>
  Effect.promise(async () => {
    const response = await fetch(url)
    return { status: response.status, text: await response.text() }
  })

describe("console shadow view", () => {
  layer(ShadowLedgerSql.pipe(Layer.provideMerge(Layer.mergeAll(PgTest, RedisTest))), { excludeTestServices: true })(
    "on PostgreSQL",
    (it) => {
      it.effect("the API serves the ledger's report; the page escapes it; acting and unknown batches", () =>
        Effect.gen(function*() {
          yield* seedShadowLedger
          const sweeper = yield* Effect.acquireRelease(
            Effect.gen(function*() {
              return startSweeper("shadow-console", {
                DATABASE_URL: yield* TestDatabaseUrl,
                REDIS_URL: yield* TestRedisUrl,
                SWEEPER_MODE_DROP_CANCELING_BUILDS: "shadow",
                // No shadow run during the test: the ledger holds only what was seeded.
                SWEEPER_CRON_DROP_CANCELING_BUILDS: NEVER,
                SWEEPER_CRON_DROP_PENDING_BUILDS: NEVER,
                SWEEPER_CRON_DROP_RUNNING_BUILDS: NEVER,
                SWEEPER_CRON_DROP_SCHEDULED_BUILDS: NEVER
              })
            }),
            (p) =>
              Effect.promise(async () => {
                p.child.kill("SIGKILL")
                await p.exited
              })
          )
          const base = yield* Effect.promise(() => sweeper.listening)
          const ledger = yield* ShadowLedger

          const week = yield* get(`${base}/api/batches/drop-canceling-builds/shadow`)
          assert.strictEqual(week.status, 200, week.text)
          const weekJson = JSON.parse(week.text)
          const [expected] = yield* ledger.report({
            since: new Date(weekJson.since),
            batches: ["drop-canceling-builds"]
          })
          assert.deepStrictEqual(weekJson, { ...expected, window: "7d", since: weekJson.since })
          assert.include(weekJson, { matched: 4, mismatched: 1, sweeperOnly: 1, gitlabOnly: 0, ignored: 1, waiting: 1 })
          assert.strictEqual(weekJson.agreement, 4 / 6)

          const day = JSON.parse((yield* get(`${base}/api/batches/drop-canceling-builds/shadow?window=24h`)).text)
          assert.include(day, { window: "24h", matched: 3, agreement: 3 / 5 })
          assert.deepStrictEqual(
            day.samples.map((s: { verdict: string; entity: string }) => [s.verdict, s.entity]),
            [["mismatched", "build:9004"], ["sweeperOnly", HOSTILE_ENTITY]],
            "disagreements only, latest first"
          )
          assert.deepStrictEqual(day.samples[1].facts, { status: "canceling", note: HOSTILE })

          const page = yield* get(`${base}/batches/drop-canceling-builds/shadow?window=24h`)
          assert.strictEqual(page.status, 200)
          assert.notInclude(page.text, "<img", "hostile entity and facts escaped")
          assert.notInclude(page.text, "</script><", "no script closed from the data")
          assert.include(page.text, "build:&lt;img src=x onerror=alert(1)&gt;&quot;&#39;&lt;/script&gt;")
          assert.include(page.text, "<strong>60.0%</strong>")
          assert.include(page.text, `<tr data-verdict="matched" data-count="3">`)
          assert.include(page.text, `<tr data-verdict="waiting" data-count="1">`)
          assert.notInclude(page.text, "This batch acts")

          const batchPage = yield* get(`${base}/batches/drop-canceling-builds`)
          assert.include(batchPage.text, `href="/batches/drop-canceling-builds/shadow"`)
          const listed = JSON.parse((yield* get(`${base}/api/batches`)).text) as Array<{ name: string; mode: string }>
          assert.strictEqual(listed.find((b) => b.name === "drop-canceling-builds")?.mode, "shadow")
          assert.strictEqual(listed.find((b) => b.name === "drop-pending-builds")?.mode, "act")

          const acting = yield* get(`${base}/batches/drop-pending-builds/shadow`)
          assert.strictEqual(acting.status, 200)
          assert.include(acting.text, "This batch acts")
          assert.include(acting.text, "SWEEPER_MODE_DROP_PENDING_BUILDS=shadow")

          const none = yield* get(`${base}/api/batches/prune-events/shadow`)
          assert.strictEqual(none.status, 404)
          assert.strictEqual(JSON.parse(none.text).error.code, "unknown_batch")
          assert.strictEqual((yield* get(`${base}/batches/prune-events/shadow`)).status, 404)
          const bad = yield* get(`${base}/api/batches/drop-canceling-builds/shadow?window=1y`)
          assert.strictEqual(bad.status, 400)
          assert.strictEqual(JSON.parse(bad.text).error.code, "bad_request")
        }))
    }
  )
})
