/**
 * The newcomer's first minute in a real browser: `npm run demo` prints a link that hands the
 * dashboard its token and the commands that reach the demo; the link opens the dashboard with the
 * token taken out of the address bar, "Run now" works without asking for anything, and the run
 * appears on the card without a reload (patched from the shared stream). The batch page opens on
 * the last hour with the runs' marks visible, the buttons stay readable under the pointer, and the
 * page reads at 1400 px and 400 px. SWEEPER_UPDATE_SCREENSHOTS=1 rewrites docs/console-demo-*.png.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { launchChromium } from "../support/browser.ts"
import { startDemo } from "../support/demo.ts"
import { waitFor } from "../support/processes.ts"

const root = fileURLToPath(new URL("../..", import.meta.url))

/** WCAG's contrast ratio of two `rgb(…)` colours. */
const contrast = (a: string, b: string) => {
  const luminance = (rgb: string) => {
    const [r, g, bl] = (rgb.match(/[\d.]+/g) ?? []).slice(0, 3).map((c) => {
      const v = Number(c) / 255
      return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4
    })
    return 0.2126 * r! + 0.7152 * g! + 0.0722 * bl!
  }
  const [hi, lo] = [luminance(a), luminance(b)].sort((x, y) => y - x)
  return (hi! + 0.05) / (lo! + 0.05)
}

describe("npm run demo in a browser", () => {
  it.live(
    "the printed link gives the buttons their token: Run now's run appears on the card",
    () =>
      Effect.promise(async () => {
        // Launched first: a browser that cannot start leaves no demo behind.
        const browser = await launchChromium()
        const demo = startDemo()
        const { dataDir } = demo
        try {
          const link = await waitFor(
            "the dashboard link with the demo's token",
            async () => /(http:\/\/\S+\/#token=[0-9a-f]+)/.exec(demo.stdout())?.[1],
            90_000
          )
          const base = link.slice(0, link.indexOf("#"))
          // The commands that reach this demo, with its data directory.
          for (const command of ["npx sweeper status", "npx sweeper run drop-canceling-builds --dry-run"]) {
            assert.include(demo.stdout(), `SWEEPER_DATA_DIR=${dataDir} ${command}`)
          }
          // The token is needed: without it the write API refuses.
          const refused = await fetch(`${base}api/batches/drop-canceling-builds/pause`, { method: "POST" })
          assert.strictEqual(refused.status, 401)

          const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } })
          const dialogs: Array<string> = []
          page.on("dialog", (dialog) => {
            dialogs.push(dialog.message())
            void dialog.dismiss()
          })
          const errors: Array<string> = []
          page.on("pageerror", (error) => errors.push(error.message))
          await page.goto(link)
          await waitFor("the token's fragment gone", async () =>
            (await page.evaluate("location.hash")) === "" || undefined, 10_000)
          assert.strictEqual(page.url(), base, "the token leaves the address bar")

          const drop = page.locator("section.card[data-batch=drop-canceling-builds]")
          const run = drop.locator("button[data-action=run]")
          // Readable under the pointer: the label keeps a contrast of at least 4.5:1.
          await run.hover()
          // A string, evaluated in the page (this file is compiled without the DOM's types).
          const colours = await page.evaluate(`(() => {
            const style = getComputedStyle(document.querySelector(
              "section.card[data-batch=drop-canceling-builds] button[data-action=run]"))
            return [style.color, style.backgroundColor]
          })()`) as Array<string>
          assert.isAtLeast(contrast(colours[0]!, colours[1]!), 4.5, colours.join(" on "))

          // Gone if the page reloads: the card below must be patched in this document.
          await page.evaluate("window.__sameDocument = true")
          const answered = page.waitForResponse((r) =>
            r.url().endsWith("/api/batches/drop-canceling-builds/run")
          )
          await run.click()
          const response = await answered
          assert.strictEqual(response.status(), 200, await response.text())
          const { runId } = (await response.json()) as { runId: string }
          assert.deepStrictEqual(dialogs, [], "no prompt: the link gave the token")
          // The run appears on the card without a reload. The card shows the batch's last run, and the
          // shared feed looks once a second: a scheduled run (every 5 s here) that finishes within
          // that second after the manual one is the last run by the time it looks. So the card must come
          // to show this run or one that finished no earlier, patched in this same page.
          const runJson = async (id: string) =>
            (await (await fetch(`${base}api/runs/${id}`)).json()) as {
              run: { finishedAt: string; trigger: string | null }
            }
          const manualFinished = Date.parse((await runJson(runId)).run.finishedAt)
          const shown = await waitFor(
            "the card to show the manual run or a later one",
            async () => {
              const id = await drop.getAttribute("data-last-run")
              if (id === runId) return id
              if (id === null || id === "") return undefined
              const other = (await runJson(id)).run
              return Date.parse(other.finishedAt) >= manualFinished ? `${id} (${other.trigger})` : undefined
            },
            15_000
          )
          assert.isTrue(await page.evaluate("window.__sameDocument === true"), `reloaded to show ${shown}`)
          await page.goto(`${base}runs/${runId}`)
          assert.include(await page.locator(".runinfo").textContent(), "manual")

          // The batch page opens on the last hour, with a mark per run.
          await page.goto(`${base}batches/drop-canceling-builds`)
          assert.strictEqual(await page.locator("nav.windows a[aria-current=page]").textContent(), "hour")
          assert.isAtLeast(await page.locator("figure[data-chart=repairs] .mark").count(), 1)
          // What the page re-reads after its batch ran: the charts and runs, rendered once per run for all tabs.
          const live = await fetch(`${base}batches/drop-canceling-builds/live`)
          assert.strictEqual(live.status, 200)
          const fragment = await live.text()
          assert.include(fragment, "Repairs per run")
          assert.include(fragment, runId)
          // The scheduled runs every 5 s join the charts without a reload (the batch's own runs re-read them).
          // Polled from here: the console's content security policy refuses the eval that
          // waitForFunction's in-page polling needs.
          await waitFor(
            "three runs on the repairs chart",
            async () => (await page.locator("figure[data-chart=repairs] .mark").count()) >= 3 || undefined,
            30_000
          )
          const width = await page.locator("figure[data-chart=repairs] .mark").first().getAttribute("width")
          assert.isAtLeast(Number(width), 2)

          const shots = process.env.SWEEPER_UPDATE_SCREENSHOTS === "1" ? join(root, "docs") : tmpdir()
          for (const [w, h] of [[1400, 1000], [400, 900]] as const) {
            await page.setViewportSize({ width: w, height: h })
            await page.goto(base)
            assert.isAtMost(await page.evaluate("document.documentElement.scrollWidth") as number, w)
            await page.screenshot({ path: join(shots, `console-demo-${w}.png`), fullPage: true })
            await page.goto(`${base}batches/drop-canceling-builds`)
            assert.isAtMost(await page.evaluate("document.documentElement.scrollWidth") as number, w)
            await page.screenshot({ path: join(shots, `console-demo-batch-${w}.png`), fullPage: true })
          }
          assert.deepStrictEqual(errors, [])
        } finally {
          await demo.cleanUp()
        }
      }),
    240_000
  )
})
