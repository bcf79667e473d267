/**
 * The newcomer's path, read from README.md itself rather than restated here: its quick start names
 * the demo, the tests and the main job; `npm run demo` (as typed in a shell in the checkout) prints
 * where its data lives; then README's "A REPL session in the demo" is played line by line against
 * that demo — its `$` lines in a shell, its `sweeper>` lines typed into the REPL — and the run it
 * asks for must repair stuck builds, whose events the dashboard's API then shows. A README edit
 * that breaks the story breaks this test.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { spawn } from "node:child_process"
import { readFileSync } from "node:fs"
import { fileURLToPath } from "node:url"
import { shellInCheckout } from "../support/cli.ts"
import { waitFor } from "../support/processes.ts"

const root = fileURLToPath(new URL("../..", import.meta.url))
const readme = readFileSync(new URL("../../README.md", import.meta.url), "utf8")

/** The first fenced block after a heading. */
const blockAfter = (heading: string): ReadonlyArray<string> => {
  const from = readme.indexOf(heading)
  assert.isAtLeast(from, 0, `README has no "${heading}"`)
  const open = readme.indexOf("```", from)
  const body = readme.indexOf("\n", open) + 1
  return readme.slice(body, readme.indexOf("```", body)).split("\n")
}

const shellEnv = { PATH: process.env.PATH ?? "", HOME: process.env.HOME ?? "/tmp" }

describe("the newcomer's path in README", () => {
  it("README's first screen says Node 24 comes with npm ci and its EBADENGINE warnings are expected", () => {
    const firstScreen = readme.split("\n").slice(0, 30).join("\n")
    assert.include(firstScreen, "Node 24 comes with `npm ci`")
    assert.match(firstScreen, /`npm warn EBADENGINE` lines:\s+they are expected/)
  })

  it("the quick start names the demo, the tests and the main job, in that order", () => {
    const commands = blockAfter("## Quick start").map((line) => line.split("#")[0]!.trim()).filter((l) => l !== "")
    assert.deepStrictEqual(commands, ["npm ci && npm run demo", "npm test", "npm start"])
  })

  it.live(
    "npm run demo, then README's REPL session against it, repairs stuck builds the dashboard's API shows",
    () =>
      Effect.promise(async () => {
        // `npm run demo` exactly as the quick start types it; only the port is left to the system.
        const demo = spawn("sh", ["-c", "exec npm run demo"], {
          cwd: root,
          env: { ...shellEnv, SWEEPER_HTTP_PORT: "0" },
          stdio: ["ignore", "pipe", "pipe"],
          detached: true
        })
        let printed = ""
        demo.stdout.on("data", (chunk) => (printed += chunk))
        demo.stderr.on("data", (chunk) => (printed += chunk))
        const exited = new Promise((resolve) => demo.on("exit", resolve))
        try {
          const { dashboard, dataDir } = await waitFor("the demo's dashboard URL and data directory", async () => {
            const url = /Dashboard: (http:\/\/127\.0\.0\.1:\d+)/.exec(printed)?.[1]
            const dir = /SWEEPER_DATA_DIR=(\S+) npx sweeper status/.exec(printed)?.[1]
            return url !== undefined && dir !== undefined ? { dashboard: url, dataDir: dir } : undefined
          }, 120_000)

          // README's session names an example directory; the newcomer pastes the one the demo printed.
          const session = blockAfter("### A REPL session in the demo")
            .map((line) => line.replace(/\/tmp\/sweeper-demo-\w+/g, dataDir))
          const commands = session.filter((l) => l.startsWith("$ ")).map((l) => l.slice(2))
          const replInput = session.filter((l) => l.startsWith("sweeper> "))
            .map((l) => l.slice("sweeper> ".length).replace(/\s+\/\/.*$/, ""))
          const repl = commands.find((c) => c.includes("repl"))
          assert.isDefined(repl, "README's session starts the REPL")
          assert.isTrue(replInput.some((l) => /^await sweeper\.run\("drop-canceling-builds"\)$/.test(l)))

          for (const command of commands.filter((c) => c !== repl)) {
            const done = await shellInCheckout(command, "")
            assert.strictEqual(done.code, 0, `${command}: ${done.stderr}`)
          }
          // The batch is paused (README's first line); the simulator makes a stuck build a second. Its
          // ticks share the embedded database with nine batches every few seconds, so on a loaded
          // machine a fixed wait can end before the first one: wait until a dry run would drop one.
          const dryRun = `SWEEPER_DATA_DIR=${dataDir} npx sweeper run drop-canceling-builds --dry-run --json`
          await waitFor(
            "a stuck build for the REPL's run to drop",
            async () => {
              const dry = await shellInCheckout(dryRun)
              assert.strictEqual(dry.code, 0, dry.stderr)
              return (JSON.parse(dry.stdout) as { targetsTotal?: number }).targetsTotal! > 0 || undefined
            },
            60_000,
            500
          )
          const played = await shellInCheckout(repl!, replInput.join("\n") + "\n")
          assert.strictEqual(played.code, 0, played.stderr)
          assert.include(played.stdout, "talking to the supervisor at http://127.0.0.1:")

          // The REPL's answers to README's two runs (top-level objects as util.inspect prints them,
          // in whatever order they finished): the real one is the one that is not a dry run.
          // The first follows the REPL's prompt on its line.
          const answers = played.stdout.match(/^(?:sweeper> )*\{\n {2}batch: 'drop-canceling-builds',[\s\S]*?^\}$/gm) ??
            []
          assert.lengthOf(answers, 2, played.stdout)
          const answer = answers.find((a) => !a.includes("dryRun: true")) ?? ""
          const runId = /runId: '([0-9a-f-]{36})'/.exec(answer)?.[1]
          const dropped = Number(/dropped: (\d+)/.exec(answer)?.[1] ?? 0)
          assert.isDefined(runId, played.stdout)
          assert.include(answer, "outcome: 'succeeded'")
          assert.isAbove(dropped, 0, answer)
          const events = await (await fetch(`${dashboard}/api/events?run=${runId}&limit=1000`)).json() as Array<
            { type: string; data: Record<string, unknown> }
          >
          assert.strictEqual(events.filter((e) => e.type === "BuildDropped").length, dropped)
          assert.strictEqual(events.find((e) => e.type === "RunStarted")?.data.trigger, "manual")
        } finally {
          // npm runs the demo in a child: the whole process group goes.
          if (demo.pid !== undefined) process.kill(-demo.pid, "SIGTERM")
          await exited
        }
      }),
    300_000
  )
})
