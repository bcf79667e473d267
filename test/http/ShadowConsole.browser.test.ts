/**
 * The shadow view in a real browser (chromium) against a real supervisor on PostgreSQL and Redis,
 * drop-canceling-builds in shadow mode: its card wears a shadow badge that leads to the view; the
 * view shows the ledger's agreement and counts and the disagreements, a hostile entity shown as
 * text (no dialog opens, the CSP reports nothing); "Run now" on the card makes a shadow run whose
 * proposal the view then counts as waiting, while GitLab's build stays as it was; no page logs a
 * console error or fails a request; every control is reachable by keyboard with an accessible name.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import type { Page } from "playwright-core"
import { launchChromium } from "../support/browser.ts"
import { PgTest, TestDatabaseUrl } from "../support/postgres.ts"
import { startSweeper, waitFor } from "../support/processes.ts"
import { RedisTest, TestRedisUrl } from "../support/redis.ts"
import { HOSTILE_ENTITY, seedShadowLedger } from "../support/shadowLedgerSeed.ts"

const TOKEN = "shadow-console-token"
const NEVER = "0 0 1 1 *"

const browser = Effect.acquireRelease(
  Effect.promise(() => launchChromium()),
  (instance) => Effect.promise(() => instance.close())
)

/** Every console error (a CSP violation is one), uncaught exception and failed or 4xx/5xx request. */
const watchErrors = (page: Page) => {
  const errors: Array<string> = []
  page.on("console", (message) => {
    if (message.type() === "error") errors.push(`console: ${message.text()} (${page.url()})`)
  })
  page.on("pageerror", (error) => errors.push(`pageerror: ${error.message}`))
  page.on("requestfailed", (request) => {
    if (request.failure()?.errorText !== "net::ERR_ABORTED") {
      errors.push(`requestfailed: ${request.url()} ${request.failure()?.errorText}`)
    }
  })
  page.on("response", (response) => {
    if (response.status() >= 400) errors.push(`HTTP ${response.status()}: ${response.url()}`)
  })
  return errors
}

/** Tabs through the page: every stop has an accessible name and a visible focus; returns the stops. */
const tabThrough = async (page: Page, max = 80) => {
  const stops: Array<string> = []
  await page.locator("body").focus()
  for (let i = 0; i < max; i++) {
    await page.keyboard.press("Tab")
    const info = await page.evaluate(`(() => {
      const el = document.activeElement
      if (el === null || el === document.body) return null
      const style = getComputedStyle(el)
      const name = el.getAttribute("aria-label") ?? el.textContent ?? ""
      return { name: name.trim(), outline: style.outlineStyle, key: el.outerHTML.slice(0, 160) }
    })()`) as { name: string; outline: string; key: string } | null
    if (info === null || stops.includes(info.key)) break
    stops.push(info.key)
    assert.isAbove(info.name.length, 0, `no accessible name: ${info.key}`)
    assert.notStrictEqual(info.outline, "none", `no visible focus: ${info.key}`)
  }
  return stops
}

layer(Layer.mergeAll(PgTest, RedisTest), { excludeTestServices: true })("shadow view in a browser", (it) => {
  it.effect("card badge → shadow view; hostile entity as text; Run now proposes, GitLab's build untouched", () =>
    Effect.gen(function*() {
      const sql = yield* PgClient.PgClient
      yield* seedShadowLedger
      // A build stuck in canceling for two hours: the shadow run proposes it and leaves it as it is.
      // The seeded waiting proposal's build, as it was read (a build gone would be judged ignored).
      yield* sql`INSERT INTO ci_builds (id, project_id, status, created_at, updated_at) VALUES
        (7201, 1, 'canceling', (now() AT TIME ZONE 'UTC') - interval '2 hours', (now() AT TIME ZONE 'UTC') - interval '2 hours'),
        (9007, 1, 'canceling', '2026-11-20T09:00:00', '2026-11-20T10:00:00')`
      const sweeper = yield* Effect.acquireRelease(
        Effect.gen(function*() {
          return startSweeper("shadow-browser", {
            DATABASE_URL: yield* TestDatabaseUrl,
            REDIS_URL: yield* TestRedisUrl,
            SWEEPER_API_TOKEN: TOKEN,
            SWEEPER_MODE_DROP_CANCELING_BUILDS: "shadow",
            // Only "Run now" runs it.
            SWEEPER_CRON_DROP_CANCELING_BUILDS: NEVER
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

      yield* Effect.promise(async () => {
        const page = await instance.newPage({ viewport: { width: 1400, height: 1000 } })
        const errors = watchErrors(page)
        const dialogs: Array<string> = []
        page.on("dialog", (dialog) => {
          dialogs.push(`${dialog.type()}: ${dialog.message()}`)
          void dialog.accept(TOKEN)
        })

        await page.goto(base)
        const drop = page.locator("section.card[data-batch=drop-canceling-builds]")
        assert.strictEqual(await page.locator("section.card .mode-shadow").count(), 1, "one batch in shadow mode")
        await drop.locator("a.mode-shadow").click()
        await page.waitForURL(/\/batches\/drop-canceling-builds\/shadow$/)

        const count = (verdict: string) =>
          page.locator(`table.verdicts tr[data-verdict=${verdict}]`).getAttribute("data-count")
        assert.strictEqual(await count("matched"), "4")
        assert.strictEqual(await count("mismatched"), "1")
        assert.strictEqual(await count("sweeperOnly"), "1")
        assert.strictEqual(await count("ignored"), "1")
        assert.strictEqual(await count("waiting"), "1")
        assert.include(await page.locator(".agreement strong").textContent(), "66.7%")
        const entities = await page.locator("table.samples a.entity").allTextContents()
        assert.deepStrictEqual(entities, ["build:9004", HOSTILE_ENTITY], "the hostile entity is text")
        assert.strictEqual(await page.locator("table.samples img").count(), 0)
        assert.isAbove((await tabThrough(page)).length, 5)

        // The day's window: the matched verdict of two days ago is out.
        await page.locator("nav.windows a", { hasText: "24 hours" }).click()
        await page.waitForURL(/window=24h/)
        assert.strictEqual(await count("matched"), "3")
        assert.include(await page.locator(".agreement strong").textContent(), "60.0%")

        // Run now from the card: a shadow run, whose proposal the view counts as waiting.
        await page.goto(base)
        await drop.locator("button[data-action=run]").click()
        await page.locator("#flash", { hasText: "drop-canceling-builds succeeded" }).waitFor({ timeout: 30_000 })
        await waitFor(
          "the shadow run's proposal in the view",
          async () => {
            await page.goto(`${base}/batches/drop-canceling-builds/shadow`)
            return (await count("waiting")) === "2" ? true : undefined
          },
          15_000,
          500
        )

        assert.deepStrictEqual(dialogs.filter((d) => !d.startsWith("prompt")), [], "no alert from the data")
        assert.deepStrictEqual(errors, [])
        await page.close()
      })
      const [build] = yield* sql<{ status: string }>`SELECT status FROM ci_builds WHERE id = 7201`
      assert.strictEqual(build?.status, "canceling", "a shadow run writes nothing of GitLab's")
      const open = yield* sql<{ entity: string }>`SELECT entity FROM sweeper_shadow_candidates
        WHERE verdict IS NULL ORDER BY entity`
      assert.deepStrictEqual(open.map((r) => r.entity), ["build:7201", "build:9007"])
    }))
})
