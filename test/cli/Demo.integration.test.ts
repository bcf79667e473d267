/**
 * `npm run demo` does what the README promises a newcomer: the embedded supervisor plus the
 * simulated GitLab, and within a minute the dashboard's API shows repairs of all five kinds; then a
 * SIGTERM stops it cleanly. Runs the real npm script as a child process, on a free port and a
 * scratch data directory (never ./.sweeper or 9394).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { existsSync } from "node:fs"
import { join } from "node:path"
import { startDemo } from "../support/demo.ts"
import { waitFor } from "../support/processes.ts"

/** One repair event type per batch: the five kinds of repair. */
const REPAIRS = [
  "ExportJobFailed",
  "BuildDropped",
  "StaleDirectUploadDeleted",
  "RebalanceRescheduled",
  "ConcurrencyLimitJobsResumed"
] as const

/** Per batch, the last-run counts on the dashboard that say it repaired something. */
const CARD_REPAIRS: Record<string, ReadonlyArray<string>> = {
  "stuck-export-jobs": ["failed"],
  "drop-canceling-builds": ["dropped"],
  "drop-pending-builds": ["dropped"],
  "drop-running-builds": ["dropped"],
  "drop-scheduled-builds": ["dropped"],
  "delete-stale-direct-uploads": ["totalDeletedStaleEntries"],
  "reschedule-stuck-issue-rebalances": ["enqueuedProjects", "enqueuedNamespaces"],
  "concurrency-limit-resume": ["resumedJobs"]
}

/** The batches whose card on the dashboard page shows a last run with a non-zero repair count. */
const cardsShowingRepairs = (html: string) =>
  Object.entries(CARD_REPAIRS).filter(([batch, keys]) => {
    const start = html.indexOf(`<section class="card" data-batch="${batch}"`)
    if (start < 0) return false
    const card = html.slice(start, html.indexOf("</section>", start))
    return keys.some((key) => Number(new RegExp(`data-key="${key}" data-value="(\\d+)"`).exec(card)?.[1] ?? "0") > 0)
  }).map(([batch]) => batch)

describe("npm run demo", () => {
  it.live(
    "shows all five kinds of repair within a minute and stops cleanly on SIGTERM",
    () =>
      Effect.promise(async () => {
        const demo = startDemo()
        const { dataDir } = demo
        try {
          // Generous: on a loaded CI machine starting PGlite alone can take most of a minute.
          const url = await waitFor(
            "the dashboard URL",
            async () => /Dashboard: (http:\/\/\S+)/.exec(demo.stdout())?.[1],
            90_000
          )
          const listening = Date.now()
          assert.notInclude(url, ":9394", "the demo in a test must not take the default port")
          const seen = new Map<string, number>()
          await waitFor(
            `repairs of all five kinds (seen: ${[...seen.keys()].join(", ")})`,
            async () => {
              for (const type of REPAIRS) {
                if (seen.has(type)) continue
                const response = await fetch(`${url}api/events?type=${type}&limit=1`)
                assert.strictEqual(response.status, 200)
                const events = (await response.json()) as ReadonlyArray<{ type: string; stream: string }>
                if (events.length > 0) {
                  assert.strictEqual(events[0]!.type, type)
                  seen.set(type, Date.now() - listening)
                }
              }
              return seen.size === REPAIRS.length || undefined
            },
            60_000,
            500
          )
          console.log(
            `demo: first repair event of each kind after (ms from listening): ${
              JSON.stringify(Object.fromEntries(seen))
            }`
          )
          // What the newcomer sees: each batch's card shows a last run that repaired something.
          const shown = new Map<string, number>()
          await waitFor(
            `the dashboard's cards showing repairs (shown: ${[...shown.keys()].join(", ")})`,
            async () => {
              const page = await fetch(url)
              assert.strictEqual(page.status, 200)
              for (const batch of cardsShowingRepairs(await page.text())) {
                if (!shown.has(batch)) {
                  shown.set(batch, Date.now() - listening)
                }
              }
              return shown.size === Object.keys(CARD_REPAIRS).length || undefined
            },
            Math.max(5_000, 60_000 - (Date.now() - listening)),
            300
          )
          console.log(
            `demo: dashboard card first showing repairs after (ms from listening): ${
              JSON.stringify(Object.fromEntries(shown))
            }`
          )

          const code = await demo.stop()
          assert.strictEqual(code, 0, `${demo.stdout()}\n${demo.stderr().slice(-4000)}`)
          assert.isFalse(existsSync(join(dataDir, "embedded.lock")), "the embedded database's lock is released")
        } finally {
          await demo.cleanUp()
        }
      }),
    200_000
  )
})
