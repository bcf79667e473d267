/**
 * The console in a real browser (Debian's chromium driven by playwright-core) against a real
 * supervisor on PostgreSQL and Redis, walking what a newcomer would: the overview shows
 * each batch's backlog with its oldest age; a batch leads to its history charts (one mark per run in
 * the window) and its runs; a run leads to exactly the builds it dropped, each to its history; a run
 * of 10 000 repairs pages; no page logs a console error or fails a request (favicon included); every
 * control is reachable by keyboard with a visible focus and has an accessible name.
 * With SWEEPER_UPDATE_SCREENSHOTS=1 it rewrites docs/console-batch.png and docs/console-run.png.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it as plain, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { Redis as IORedis } from "ioredis"
import { randomUUID } from "node:crypto"
import { mkdirSync, mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import type { Page } from "playwright-core"
import { launchChromium } from "../support/browser.ts"
import { PgTest, TestDatabaseUrl } from "../support/postgres.ts"
import { startSweeper, waitFor } from "../support/processes.ts"
import { RedisTest, TestRedisUrl } from "../support/redis.ts"

const TOKEN = "console-token"
const root = fileURLToPath(new URL("../..", import.meta.url))
const HOUR = 3600_000

const browser = Effect.acquireRelease(
  Effect.promise(async () => {
    return launchChromium()
  }),
  (instance) => Effect.promise(() => instance.close())
)

/** Every console error, uncaught exception and failed or 4xx/5xx request of a page. */
const watchErrors = (page: Page) => {
  const errors: Array<string> = []
  page.on("console", (message) => {
    if (message.type() === "error") errors.push(`console: ${message.text()} (${page.url()})`)
  })
  page.on("pageerror", (error) => errors.push(`pageerror: ${error.message}`))
  page.on("requestfailed", (request) => {
    // A navigation aborts what the page still loads (the SSE stream, a favicon not yet fetched):
    // not an error of the page. A missing resource still shows, as its 4xx response below.
    if (request.failure()?.errorText !== "net::ERR_ABORTED") {
      errors.push(`requestfailed: ${request.url()} ${request.failure()?.errorText}`)
    }
  })
  page.on("response", (response) => {
    if (response.status() >= 400) errors.push(`HTTP ${response.status()}: ${response.url()}`)
  })
  return errors
}

/** Tabs through the page: every stop has a visible focus ring and an accessible name; returns the stops. */
const tabThrough = async (page: Page, max = 80) => {
  const stops: Array<string> = []
  await page.locator("body").focus()
  for (let i = 0; i < max; i++) {
    await page.keyboard.press("Tab")
    // A string, evaluated in the page (this file is compiled without the DOM's types).
    const info = await page.evaluate(`(() => {
      const el = document.activeElement
      if (el === null || el === document.body) return null
      const style = getComputedStyle(el)
      const label = el.id ? document.querySelector('label[for="' + el.id + '"]') : null
      const name = el.getAttribute("aria-label") ?? (label ? label.textContent : null) ?? el.textContent ?? ""
      return { tag: el.tagName, name: name.trim(), outline: style.outlineStyle, outlineWidth: style.outlineWidth, key: el.outerHTML.slice(0, 160) }
    })()`) as { tag: string; name: string; outline: string; outlineWidth: string; key: string } | null
    if (info === null) break
    if (stops.includes(info.key)) break
    stops.push(info.key)
    assert.isAbove(info.name.length, 0, `no accessible name: ${info.key}`)
    assert.notStrictEqual(info.outline, "none", `no visible focus: ${info.key}`)
    assert.notStrictEqual(info.outlineWidth, "0px", `no visible focus: ${info.key}`)
  }
  return stops
}

layer(Layer.mergeAll(PgTest, RedisTest), { excludeTestServices: true })("console in a browser", (it) => {
  it.effect(
    "overview backlog → batch history charts → run → the builds it dropped; paging; no console error; keyboard",
    () =>
      Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        const redisUrl = yield* TestRedisUrl
        // Three builds stuck in canceling for two hours, one fresh: "Run now" drops exactly the three.
        yield* sql`INSERT INTO ci_builds (id, project_id, status, created_at, updated_at) VALUES
        (7101, 1, 'canceling', (now() AT TIME ZONE 'UTC') - interval '2 hours', (now() AT TIME ZONE 'UTC') - interval '2 hours'),
        (7102, 1, 'canceling', (now() AT TIME ZONE 'UTC') - interval '3 hours', (now() AT TIME ZONE 'UTC') - interval '3 hours'),
        (7103, 2, 'canceling', (now() AT TIME ZONE 'UTC') - interval '2 hours', (now() AT TIME ZONE 'UTC') - interval '2 hours'),
        (7104, 2, 'canceling', (now() AT TIME ZONE 'UTC') - interval '5 minutes', (now() AT TIME ZONE 'UTC') - interval '5 minutes')`
        // Earlier runs of drop-canceling-builds: 3 in the last day (one of 10 000 repairs), 2 more this week.
        const past = [2, 5, 9, 50, 100].map((hours) => ({ runId: randomUUID(), hours }))
        for (const [i, run] of past.entries()) {
          const finished = new Date(Date.now() - run.hours * HOUR)
          const repairs = i === 0 ? 10_000 : i
          yield* sql`INSERT INTO sweeper_events (stream, type, data, run_id, occurred_at) VALUES ('batch:drop-canceling-builds', 'RunStarted',
          ${
            sql.json({
              batch: "drop-canceling-builds",
              run_id: run.runId,
              scheduled_at: null,
              node: "earlier",
              trigger: "schedule",
              dryRun: false
            })
          }, ${run.runId}, ${new Date(finished.getTime() - 2000)})`
          yield* sql`INSERT INTO sweeper_events (stream, type, data, run_id, occurred_at)
          SELECT 'build:' || (${(i + 1) * 100_000}::bigint + g), 'BuildDropped', jsonb_build_object('id', ${
            (i + 1) * 100_000
          }::bigint + g, 'project_id', 1, 'runner_id', null, 'failure_reason', 3),
            ${run.runId}::uuid, ${new Date(finished.getTime() - 1000)}::timestamptz
          FROM generate_series(1, ${repairs}) g`
          yield* sql`INSERT INTO sweeper_events (stream, type, data, run_id, occurred_at) VALUES ('batch:drop-canceling-builds', 'RunFinished',
          ${
            sql.json({
              batch: "drop-canceling-builds",
              outcome: "succeeded",
              summary: { dropped: repairs, doomed: 0 },
              // As a real run writes it: the items repaired, which history and charts count.
              repaired: repairs,
              duration_ms: 1500 + i * 700,
              dryRun: false
            })
          }, ${run.runId}, ${finished})`
        }
        // A stale direct upload (prepared 5 h ago: due for 2 h) and a fresh one, in GitLab's Redis.
        yield* Effect.promise(async () => {
          const redis = new IORedis(redisUrl)
          const now = Math.floor(Date.now() / 1000)
          await redis.hset("pending_direct_uploads", {
            "uploads:tmp/old": String(now - 5 * 3600),
            "uploads:tmp/new": String(now - 60)
          })
          redis.disconnect()
        })

        const sweeper = yield* Effect.acquireRelease(
          Effect.gen(function*() {
            return startSweeper("console", {
              DATABASE_URL: yield* TestDatabaseUrl,
              REDIS_URL: redisUrl,
              SWEEPER_API_TOKEN: TOKEN,
              // No tick (and no start-up catch-up of a missed one) during the test: only "Run now"
              // repairs, so the run it makes is the one that dropped the three builds.
              SWEEPER_CRON_DROP_CANCELING_BUILDS: "0 0 1 1 *",
              SWEEPER_CRON_DELETE_STALE_DIRECT_UPLOADS: "0 0 1 1 *"
            })
          }),
          (p) =>
            Effect.promise(async () => {
              p.child.kill("SIGKILL")
              await p.exited
            })
        )
        const base = yield* Effect.promise(() => sweeper.listening)
        const instance = yield* browser
        const shots = globalThis.process.env.SWEEPER_UPDATE_SCREENSHOTS === "1" ? join(root, "docs") : tmpdir()
        mkdirSync(shots, { recursive: true })

        yield* Effect.promise(async () => {
          const page = await instance.newPage({ viewport: { width: 1400, height: 1000 } })
          const errors = watchErrors(page)
          page.on("dialog", (dialog) => void dialog.accept(TOKEN))

          // Overview: each card says what waits and how old the oldest is (sampled at start-up).
          await page.goto(base)
          const drop = page.locator("section.card[data-batch=drop-canceling-builds]")
          // The first sample runs beside start-up (nine batches' reads, three at a time) and a read
          // over 5 s shows as an error until the next sample 30 s on: on a loaded machine the page may
          // open before a good sample, which the shared stream then patches in. One sample sets every card.
          await page.locator("section.card[data-batch=delete-stale-direct-uploads] .backlog[data-backlog='1']")
            .waitFor({ timeout: 45_000 })
          assert.strictEqual(await drop.locator(".backlog").getAttribute("data-backlog"), "3")
          assert.include(await drop.locator(".backlog").textContent(), "canceling builds past the 1 h cutoff")
          assert.strictEqual(
            await drop.locator(".backlog time").first().textContent(),
            "2h ago",
            "oldest: 3 h old, due after 1 h"
          )
          const uploads = page.locator("section.card[data-batch=delete-stale-direct-uploads] .backlog")
          assert.strictEqual(await uploads.getAttribute("data-backlog"), "1")
          assert.include(
            await page.locator("section.card[data-batch=prune-events] .backlog").textContent(),
            "nothing waits"
          )
          assert.strictEqual(await page.locator("section.card .backlog .error").count(), 0, "every backlog read")
          assert.isAbove((await tabThrough(page)).length, 15)

          // Run now: the card changes without a reload (SSE), then the batch page has it.
          await drop.locator("button[data-action=run]").click()
          await page.locator("#flash", { hasText: "drop-canceling-builds succeeded" }).waitFor({ timeout: 30_000 })
          await drop.locator("dd", { hasText: "dropped 3" }).waitFor({ timeout: 15_000 })
          // The run emptied the backlog: sampled again after it, and the card follows without a reload.
          await drop.locator(".backlog[data-backlog='0']").waitFor({ timeout: 15_000 })

          // Batch → history: one mark per run in the window, numbers in each mark's <title>.
          await drop.locator("h2 a").click()
          await page.waitForURL(/\/batches\/drop-canceling-builds$/)
          for (const chart of ["repairs", "duration", "outcomes"]) {
            assert.strictEqual(
              await page.locator(`figure[data-chart=${chart}] .mark`).count(),
              4,
              `${chart}: 3 earlier runs in 24 h + the new one`
            )
          }
          const titles = await page.locator("figure[data-chart=repairs] .mark title").allTextContents()
          assert.isTrue(titles.some((t) => t.includes("10000 repairs")), titles.join("\n"))
          assert.isTrue(titles.some((t) => t.includes("· 3 repairs")), titles.join("\n"))
          await page.locator("nav.windows a", { hasText: "7 days" }).click()
          await page.waitForURL(/window=7d/)
          assert.strictEqual(await page.locator("figure[data-chart=repairs] .mark").count(), 6)
          assert.strictEqual(await page.locator("nav.windows a[aria-current=page]").textContent(), "7 days")
          await tabThrough(page)
          await page.screenshot({ path: join(shots, "console-batch.png"), fullPage: true })

          // Batch → its newest run (the one just made) → exactly the three builds it dropped.
          await page.locator(".runs tbody tr").first().locator("a.run-link").click()
          await page.waitForURL(/\/runs\/[0-9a-f-]{36}$/)
          assert.include(await page.locator(".runinfo").textContent(), "manual")
          assert.strictEqual(await page.locator(".runinfo [data-repairs]").getAttribute("data-repairs"), "3")
          const entities = await page.locator("#repairs tbody a.entity").allTextContents()
          assert.deepStrictEqual([...entities].sort(), ["build:7101", "build:7102", "build:7103"])
          assert.strictEqual(await page.locator("nav.pager a").count(), 0, "three repairs: one page")
          await tabThrough(page)
          await page.screenshot({ path: join(shots, "console-run.png"), fullPage: true })

          // Filter by type: none of this run's repairs is a doomed build.
          await page.selectOption("#type", "BuildDoomed")
          await page.locator("form.filter button[type=submit]").click()
          await page.waitForURL(/type=BuildDoomed/)
          assert.strictEqual(await page.locator("#repairs tbody tr[data-event]").count(), 0)

          // A repair links to its entity's history.
          await page.goBack()
          await page.locator("#repairs tbody a.entity", { hasText: "build:7102" }).click()
          await page.locator("#history").waitFor()
          assert.include(await page.locator("#history").textContent(), "BuildDropped")

          // The run of 10 000 repairs: 100 a page, the next page continues where the first stopped.
          await page.goto(`${base}/runs/${past[0]!.runId}`)
          assert.strictEqual(await page.locator("#repairs tbody tr[data-event]").count(), 100)
          const first = await page.locator("#repairs tbody a.entity").allTextContents()
          assert.strictEqual(first[0], "build:100001")
          await page.locator("nav.pager a[rel=next]").click()
          await page.waitForURL(/after=\d+/)
          const second = await page.locator("#repairs tbody a.entity").allTextContents()
          assert.strictEqual(second[0], "build:100101")
          assert.lengthOf(second, 100)

          // The same through the JSON API, errors in the API's one shape.
          const json = async (path: string) => {
            const response = await page.request.get(`${base}${path}`)
            return { status: response.status(), body: await response.json() as Record<string, any> }
          }
          const apiRun = await json(`/api/runs/${past[0]!.runId}?limit=1000`)
          assert.strictEqual(apiRun.status, 200)
          assert.strictEqual(apiRun.body.run.repairs, 10_000)
          assert.lengthOf(apiRun.body.repairs.events, 1000)
          const nextPage = await json(`/api/runs/${past[0]!.runId}?limit=1000&after=${apiRun.body.repairs.next}`)
          assert.strictEqual(nextPage.body.repairs.events[0].stream, "build:101001")
          const missing = randomUUID()
          assert.deepStrictEqual(await json(`/api/runs/${missing}`), {
            status: 404,
            body: { error: { code: "not_found", message: `no run ${missing}` } }
          })
          assert.deepInclude((await json(`/api/runs/${past[0]!.runId}?after=x`)).body.error, { code: "bad_request" })
          assert.deepStrictEqual((await json("/api/batches/drop-canceling-builds/history?window=2d")).status, 400)
          assert.deepInclude((await json("/api/batches/no-such/history")).body.error, { code: "unknown_batch" })
          const week = await json("/api/batches/drop-canceling-builds/history?window=7d")
          assert.lengthOf(week.body.runs, 6)
          const backlog = await json("/api/backlog")
          assert.strictEqual(
            backlog.body.batches.find((b: { batch: string }) => b.batch === "delete-stale-direct-uploads").count,
            1
          )

          // The favicon is served (the browser asks for it on every page).
          const icon = await page.request.get(`${base}/favicon.ico`)
          assert.strictEqual(icon.status(), 200)

          // Narrow screens: the batch and run pages scroll down, never sideways.
          await page.setViewportSize({ width: 400, height: 900 })
          for (const path of ["/batches/drop-canceling-builds?window=7d", `/runs/${past[0]!.runId}`]) {
            await page.goto(`${base}${path}`)
            assert.isAtMost(await page.evaluate("document.documentElement.scrollWidth") as number, 400, path)
          }

          assert.deepStrictEqual(errors, [])
          await page.close()
        })
      }).pipe(Effect.scoped),
    240_000
  )
})

describe("console in a browser, on `npm run demo`", () => {
  plain.live(
    "a newcomer goes from the batch to one of its runs to the builds it dropped; charts and backlog; no console error",
    () =>
      Effect.gen(function*() {
        const dataDir = mkdtempSync(join(tmpdir(), "sweeper-console-demo-"))
        yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(dataDir, { recursive: true, force: true })))
        const demo = yield* Effect.acquireRelease(
          Effect.sync(() => startSweeper("console-demo", { SWEEPER_DATA_DIR: dataDir }, ["demo"])),
          (p) =>
            Effect.promise(async () => {
              p.child.kill("SIGKILL")
              await p.exited
            })
        )
        const base = yield* Effect.promise(() => demo.listening)
        const instance = yield* browser
        yield* Effect.promise(async () => {
          // The simulated GitLab leaves builds stuck in canceling: wait for a run that dropped some.
          const dropped = await waitFor(
            "a BuildDropped event",
            async () => {
              // The family's drops carry their rule; drop-canceling's do not.
              const events = await (await fetch(`${base}/api/events?type=BuildDropped&limit=100`))
                .json() as ReadonlyArray<{ runId: string; data: { rule?: string } }>
              return events.find((event) => event.data.rule === undefined)
            },
            90_000,
            500
          )
          const runId = dropped.runId
          const run = await (await fetch(`${base}/api/runs/${runId}?limit=1000`)).json() as {
            run: { batch: string; repairs: number }
            repairs: { events: ReadonlyArray<{ stream: string; type: string }>; next: number | null }
          }
          assert.strictEqual(run.run.batch, "drop-canceling-builds")
          // The run has finished (its RunFinished is in) once its row is on the batch page.
          await waitFor("the run's RunFinished", async () => {
            const body = await (await fetch(`${base}/api/runs/${runId}`)).json() as { run: { outcome: string | null } }
            return body.run.outcome ?? undefined
          }, 30_000)

          const page = await instance.newPage({ viewport: { width: 1400, height: 1000 } })
          const errors = watchErrors(page)
          await page.goto(base)
          // Every card says what waits (or that nothing does).
          assert.strictEqual(await page.locator("section.card .backlog").count(), 9)
          assert.strictEqual(await page.locator("section.card .backlog .error").count(), 0, "every backlog read")
          // Without a reload, some batch is caught running with its progress line (units done so far;
          // that the units and repairs count up is LiveProgress.test.ts).
          const progress = page.locator("section.card .progress")
          await progress.first().waitFor({ timeout: 60_000 })
          console.log(`demo: caught running: ${await progress.first().textContent()}`)

          await page.locator("section.card[data-batch=drop-canceling-builds] h2 a").click()
          await page.waitForURL(/\/batches\/drop-canceling-builds$/)
          const history = await (await fetch(`${base}/api/batches/drop-canceling-builds/history?window=24h`))
            .json() as { runs: ReadonlyArray<unknown> }
          // Both charts counted in one read: the page re-renders them live when a run finishes, and two
          // reads apart can straddle that.
          const [marks, outcomeMarks] = await page.evaluate(
            "['repairs', 'outcomes'].map((chart) => " +
              "document.querySelectorAll('figure[data-chart=' + chart + '] .mark').length)"
          ) as [number, number]
          // A run may finish between the page and the API read: the page has the runs of its moment.
          assert.isAtLeast(marks, 1)
          assert.isAtMost(Math.abs(marks - history.runs.length), 1)
          assert.strictEqual(outcomeMarks, marks)

          await page.locator(`.runs tr[data-run="${runId}"] a.run-link`).click()
          await page.waitForURL(new RegExp(`/runs/${runId}$`))
          const builds = (await page.locator("#repairs tbody a.entity").allTextContents()).filter((s) =>
            s.startsWith("build:")
          )
          const expected = run.repairs.events.filter((e) => e.type === "BuildDropped").map((e) => e.stream).slice(
            0,
            100
          )
          assert.isAbove(builds.length, 0)
          assert.deepStrictEqual(builds.slice(0, expected.length), expected)

          await page.locator("#repairs tbody a.entity").first().click()
          await page.locator("#history").waitFor()
          assert.include(await page.locator("#history").textContent(), "BuildDropped")
          assert.deepStrictEqual(errors, [])
          await page.close()
        })
      }).pipe(Effect.scoped),
    240_000
  )
})
