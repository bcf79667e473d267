/**
 * The dashboard in a real browser (Debian's chromium driven by playwright-core) against a real
 * supervisor on real PostgreSQL and Redis: it loads, "Run now" asks for the token and the new run
 * appears, an entity search shows that build's history, "Pause" shows the batch paused by the
 * dashboard, the page reads at 1400 px and at 400 px (no sideways scrolling), and nothing it
 * loads is refused by its content security policy. With SWEEPER_UPDATE_SCREENSHOTS=1 it also
 * rewrites the README's screenshot, docs/dashboard.png.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { mkdirSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { launchChromium } from "../support/browser.ts"
import { PgTest, TestDatabaseUrl } from "../support/postgres.ts"
import { startSweeper } from "../support/processes.ts"
import { RedisTest, TestRedisUrl } from "../support/redis.ts"

const TOKEN = "dashboard-token"
const root = fileURLToPath(new URL("../..", import.meta.url))

const browser = Effect.acquireRelease(
  Effect.promise(async () => {
    // playwright gives every launch a fresh temporary profile (the fresh --user-data-dir STACK.md asks for).
    const instance = await launchChromium()
    return instance
  }),
  (instance) => Effect.promise(() => instance.close())
)

layer(Layer.mergeAll(PgTest, RedisTest), { excludeTestServices: true })("dashboard in a browser", (it) => {
  it.effect(
    "load, run now with the token, see the run, search an entity, pause, screenshot",
    () =>
      Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        // One build stuck in canceling for two hours: "Run now" drops it, so build:7001 gets a history.
        yield* sql`INSERT INTO ci_builds (id, project_id, status, created_at, updated_at)
        VALUES (7001, 1, 'canceling', now() - interval '2 hours', now() - interval '2 hours')`
        const process = yield* Effect.acquireRelease(
          Effect.gen(function*() {
            return startSweeper("dashboard", {
              DATABASE_URL: yield* TestDatabaseUrl,
              REDIS_URL: yield* TestRedisUrl,
              SWEEPER_API_TOKEN: TOKEN
            })
          }),
          (p) =>
            Effect.promise(async () => {
              p.child.kill("SIGKILL")
              await p.exited
            })
        )
        const base = yield* Effect.promise(() => process.listening)
        const instance = yield* browser

        yield* Effect.promise(async () => {
          const page = await instance.newPage({ viewport: { width: 1400, height: 1000 } })
          // The pages' content security policy must not refuse anything they use.
          const refused: Array<string> = []
          page.on("console", (message) => {
            if (/Content Security Policy|Refused to/i.test(message.text())) refused.push(message.text())
          })
          const prompts: Array<string> = []
          page.on("dialog", (dialog) => {
            prompts.push(dialog.message())
            void dialog.accept(TOKEN)
          })

          // Load: one card per batch, schedule in words, three upcoming fire times.
          await page.goto(base)
          // The eight GitLab batches and Sweeper's own prune-events.
          assert.strictEqual(await page.locator("section.card").count(), 9)
          assert.include(await page.locator("section.card[data-batch=prune-events]").textContent(), "03:17")
          const drop = page.locator("section.card[data-batch=drop-canceling-builds]")
          assert.include(await drop.textContent(), "hourly at :45")
          assert.strictEqual(await drop.locator(".ticks > div").count(), 3)
          assert.include(await drop.locator(".last-run").textContent(), "never run")

          // Run now: asks for the token once, then the new run shows on the card.
          await drop.locator("button[data-action=run]").click()
          await page.locator("#flash", { hasText: "drop-canceling-builds succeeded" }).waitFor({ timeout: 30_000 })
          assert.lengthOf(prompts, 1)
          await page.locator("section.card[data-batch=drop-canceling-builds] .last-run .outcome-succeeded").waitFor({
            timeout: 15_000
          })
          assert.include(
            await page.locator("section.card[data-batch=drop-canceling-builds]").textContent(),
            "dropped 1"
          )

          // The batch page lists that run with its trigger and node.
          await page.goto(`${base}/batches/drop-canceling-builds`)
          const row = page.locator(".runs tbody tr").first()
          assert.include(await row.textContent(), "manual")
          assert.include(await row.textContent(), "dashboard")
          assert.include(await page.locator(".config").textContent(), "ci/stuck_builds/drop_canceling_worker")

          // Entity search: the dropped build's history.
          await page.goto(base)
          await page.fill("#stream", "build:7001")
          await page.click("form.search button[type=submit]")
          await page.locator("#history").waitFor()
          assert.include(await page.locator("#history").textContent(), "BuildDropped")

          // Pause: the card says paused, by the dashboard, and the button offers Resume.
          await page.goto(base)
          await page.locator("section.card[data-batch=stuck-export-jobs] button[data-action=pause]").click()
          const paused = page.locator("section.card[data-batch=stuck-export-jobs] [data-state=paused]")
          await paused.waitFor({ timeout: 15_000 })
          assert.include(
            await page.locator("section.card[data-batch=stuck-export-jobs] header").textContent(),
            "by dashboard"
          )
          assert.strictEqual(
            await page.locator("section.card[data-batch=stuck-export-jobs] button[data-action=resume]").count(),
            1
          )

          // Readable at 1400 px. The README's screenshot is rewritten only when asked
          // (SWEEPER_UPDATE_SCREENSHOTS=1), so a test run leaves the working tree clean.
          const screenshotDir = globalThis.process.env.SWEEPER_UPDATE_SCREENSHOTS === "1"
            ? join(root, "docs")
            : tmpdir()
          mkdirSync(screenshotDir, { recursive: true })
          await page.screenshot({ path: join(screenshotDir, "dashboard.png"), fullPage: true })

          // And at 400 px: nothing wider than the screen.
          await page.setViewportSize({ width: 400, height: 900 })
          await page.goto(base)
          const overflow = await page.evaluate("document.documentElement.scrollWidth") as number
          assert.isAtMost(overflow, 400)
          await page.screenshot({ path: join(tmpdir(), "sweeper-dashboard-400.png"), fullPage: true })
          assert.deepStrictEqual(refused, [])
          await page.close()
        })
      }).pipe(Effect.scoped),
    180_000
  )
})
