/**
 * The console on a 400 px phone, against `npm run demo` in a real browser: a run's event types
 * keep their words whole, every date stays on one line, the charts' axis labels are drawn at a
 * readable size, the runs table shows its summary without scrolling sideways, and searching an
 * entity brings its history into view rather than below the nine cards.
 * Measured in the page with strings evaluated there (this file is compiled without the DOM's types);
 * polled from here, since the console's content security policy refuses waitForFunction's eval.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import type { Page } from "playwright-core"
import { launchChromium } from "../support/browser.ts"
import { startDemo } from "../support/demo.ts"
import { waitFor } from "../support/processes.ts"

const WIDTH = 400

/** Each element of `selector` drawn on more than one line or wider than its table cell. */
const brokenOrOverflowing = (page: Page, selector: string) =>
  page.evaluate(`(() => {
    const bad = []
    for (const el of document.querySelectorAll(${JSON.stringify(selector)})) {
      const lines = el.getClientRects().length
      const box = el.getBoundingClientRect()
      const cell = el.closest("td, dd") ?? el.parentElement
      const room = cell.getBoundingClientRect()
      if (lines !== 1 || box.right > room.right + 1 || box.left < room.left - 1) {
        bad.push(el.textContent + ": " + lines + " lines, " + Math.round(box.width) + " px in " + Math.round(room.width) + " px")
      }
    }
    return bad
  })()`) as Promise<Array<string>>

const documentWidth = (page: Page) => page.evaluate("document.documentElement.scrollWidth") as Promise<number>

describe("the console at 400 px", () => {
  it.live(
    "whole words, one-line dates, readable chart labels, the runs' summary in view, a searched history in view",
    () =>
      Effect.promise(async () => {
        const browser = await launchChromium()
        const demo = startDemo()
        try {
          const link = await waitFor(
            "the dashboard link",
            async () => /(http:\/\/\S+\/)#token=[0-9a-f]+/.exec(demo.stdout())?.[1],
            90_000
          )
          // A run of the demo's that dropped builds: its repairs are BuildDropped events.
          const runId = await waitFor("a run that dropped builds", async () => {
            const response = await fetch(`${link}api/events?type=BuildDropped&limit=1`)
            if (!response.ok) return undefined
            const events = (await response.json()) as Array<{ runId: string | null; stream: string }>
            return events[0]?.runId ?? undefined
          }, 60_000)
          const page = await browser.newPage({ viewport: { width: WIDTH, height: 800 } })
          const errors: Array<string> = []
          page.on("pageerror", (error) => errors.push(error.message))

          // The run page: event types and dates whole, on one line, inside their cells.
          await page.goto(`${link}runs/${runId}`)
          const types = "#repairs tbody tr[data-event] td:nth-child(2) code"
          assert.isAtLeast(await page.locator(types, { hasText: "BuildDropped" }).count(), 1)
          assert.deepStrictEqual(await brokenOrOverflowing(page, types), [], "event types broken mid-word")
          assert.deepStrictEqual(await brokenOrOverflowing(page, "time"), [], "dates over more than one line")
          assert.isAtMost(await documentWidth(page), WIDTH)

          // The batch page: chart axis labels at 10 px or more as drawn (an SVG scales its text with it).
          await page.goto(`${link}batches/drop-canceling-builds`)
          await waitFor(
            "a run on the batch page",
            async () => (await page.locator(".runs tbody tr[data-run]").count()) >= 1 || undefined,
            30_000
          )
          const labelSizes = await page.evaluate(`(() => {
            const sizes = []
            for (const svg of document.querySelectorAll("figure.chart svg")) {
              const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width
              for (const text of svg.querySelectorAll("text")) sizes.push(parseFloat(getComputedStyle(text).fontSize) * scale)
            }
            for (const el of document.querySelectorAll("figure.chart .xaxis")) sizes.push(parseFloat(getComputedStyle(el).fontSize))
            return sizes
          })()`) as Array<number>
          assert.isAtLeast(labelSizes.length, 6)
          assert.isAtLeast(Math.min(...labelSizes), 10, `drawn label sizes: ${labelSizes.join(", ")}`)
          assert.deepStrictEqual(await brokenOrOverflowing(page, "time"), [], "dates over more than one line")

          // The runs table: its summary cells lie inside the viewport, nothing to scroll sideways.
          assert.isAtMost(await documentWidth(page), WIDTH)
          const summaries = await page.evaluate(`(() => {
            const out = []
            for (const scroll of document.querySelectorAll(".runs .scroll")) {
              out.push("table " + scroll.scrollWidth + " in " + scroll.clientWidth)
            }
            for (const td of document.querySelectorAll(".runs tbody tr[data-run] td.summary")) {
              const box = td.getBoundingClientRect()
              out.push(box.left >= 0 && box.right <= innerWidth ? "in view" : "summary at " + Math.round(box.left) + "–" + Math.round(box.right))
            }
            return out
          })()`) as Array<string>
          const cells = summaries.filter((s) => !s.startsWith("table "))
          assert.isAtLeast(cells.length, 1, summaries.join("\n"))
          assert.deepStrictEqual(cells.filter((s) => s !== "in view"), [], summaries.join("\n"))
          for (const table of summaries.filter((s) => s.startsWith("table "))) {
            const [inner, outer] = table.slice(6).split(" in ").map(Number)
            assert.isAtMost(inner!, outer!, `the runs table scrolls sideways: ${table}`)
          }

          // Searching an entity: its history is in view once the page answers.
          const { stream } = ((await (await fetch(`${link}api/events?type=BuildDropped&limit=1`)).json()) as Array<
            { stream: string }
          >)[0]!
          await page.goto(link)
          await page.fill("#stream", stream)
          await page.locator("form.search button[type=submit]").click()
          await page.waitForURL(/stream=/)
          await page.locator("#history").waitFor()
          const inView = await waitFor("the history to be in view", async () => {
            const box = await page.evaluate(`(() => {
              const r = document.getElementById("history").getBoundingClientRect()
              return [r.top, r.bottom, innerHeight]
            })()`) as [number, number, number]
            return box[0] >= 0 && box[0] < box[2] ? box : undefined
          }, 5_000).catch((error: Error) => error.message)
          assert.isArray(inView, `history not in view after Search: ${inView}`)
          assert.include(await page.locator("#history").textContent(), "BuildDropped")
          assert.deepStrictEqual(errors, [])
        } finally {
          await demo.cleanUp()
          await browser.close()
        }
      }),
    240_000
  )
})
