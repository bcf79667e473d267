/**
 * `npm run demo` does what the README promises a newcomer: the embedded supervisor plus the
 * simulated GitLab, and within a minute the dashboard's API shows repairs of all five kinds; then a
 * SIGTERM stops it cleanly. Runs the real npm script as a child process, on a free port and a
 * scratch data directory (never ./.sweeper or 9394).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { type ChildProcess, spawn } from "node:child_process"
import { existsSync, mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { waitFor } from "../support/processes.ts"

const root = fileURLToPath(new URL("../..", import.meta.url))

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

const exitOf = (child: ChildProcess) =>
  new Promise<number | string>((resolve) => child.on("exit", (code, signal) => resolve(code ?? signal ?? "unknown")))

describe("npm run demo", () => {
  it.live(
    "shows all five kinds of repair within a minute and stops cleanly on SIGTERM",
    () =>
      Effect.promise(async () => {
        const dataDir = mkdtempSync(join(tmpdir(), "sweeper-demo-test-"))
        const child = spawn("npm", ["run", "--silent", "demo"], {
          cwd: root,
          env: {
            PATH: process.env.PATH ?? "",
            HOME: process.env.HOME ?? "/tmp",
            SWEEPER_DATA_DIR: dataDir,
            SWEEPER_HTTP_PORT: "0"
          },
          stdio: ["ignore", "pipe", "pipe"]
        })
        let stdout = ""
        let stderr = ""
        child.stdout.on("data", (chunk) => (stdout += chunk))
        child.stderr.on("data", (chunk) => (stderr += chunk))
        const exited = exitOf(child)
        try {
          // Generous: on a loaded CI machine starting PGlite alone can take most of a minute.
          const url = await waitFor(
            "the dashboard URL",
            async () => /Dashboard: (http:\/\/\S+)/.exec(stdout)?.[1],
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

          child.kill("SIGTERM")
          const code = await Promise.race([
            exited,
            new Promise((resolve) => setTimeout(() => resolve("still running"), 30_000))
          ])
          assert.strictEqual(code, 0, `${stdout}\n${stderr.slice(-4000)}`)
          assert.isFalse(existsSync(join(dataDir, "embedded.lock")), "the embedded database's lock is released")
        } finally {
          if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL")
          await exited
          rmSync(dataDir, { recursive: true, force: true })
        }
      }),
    200_000
  )
})
