/**
 * A one-off run from the REPL while the demo runs, on the embedded default: the REPL started as the
 * demo tells a newcomer to start it (ReachCommands.ts) finds the demo's supervisor, and its run
 * goes through it — run guard, exclusive lease, events — repairing a stuck build the simulator
 * made; the run's events are then there in the supervisor's API, as a scheduled run's are.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { reachCommands } from "../../src/cli/ReachCommands.ts"
import { runCli, shellInCheckout } from "../support/cli.ts"
import { startSweeper, waitFor } from "../support/processes.ts"

interface StoredEvent {
  readonly type: string
  readonly stream: string
  readonly runId: string | null
  readonly data: Record<string, unknown>
}

describe("the REPL beside the demo", () => {
  it.live(
    "a one-off run from the REPL repairs a stuck build through the demo's supervisor",
    () =>
      Effect.promise(async () => {
        const dataDir = mkdtempSync(join(tmpdir(), "sweeper-repl-demo-"))
        const demo = startSweeper("repl-demo", { SWEEPER_DATA_DIR: dataDir }, ["demo"])
        try {
          const base = await demo.listening
          const scheduled = await waitFor("a scheduled run of drop-canceling-builds", async () => {
            const events = await (await fetch(`${base}/api/events?type=RunStarted&limit=50`)).json() as Array<
              StoredEvent
            >
            return events.find((e) => e.data.batch === "drop-canceling-builds" && e.data.trigger !== "manual")
          }, 90_000)
          // Scheduled ticks stop (a manual run still goes), so the stuck builds wait for the REPL.
          const paused = await runCli(["pause", "drop-canceling-builds"], { SWEEPER_DATA_DIR: dataDir })
          assert.strictEqual(paused.code, 0, paused.stderr)
          // The simulator makes a stuck build a second; give it a few.
          await new Promise((resolve) => setTimeout(resolve, 4000))

          // The other commands the demo prints reach it too, and say so.
          for (const { label, command } of reachCommands(dataDir).filter((c) => c.label !== "REPL")) {
            const reached = await shellInCheckout(command, "")
            assert.strictEqual(reached.code, 0, `${label}: ${reached.stderr}`)
            assert.include(reached.stdout, "drop-canceling-builds", label)
            assert.include(reached.stderr, "Talking to the supervisor at http://127.0.0.1:", label)
          }
          const repl = reachCommands(dataDir).find((c) => c.label === "REPL")!.command
          const session = await shellInCheckout(
            repl,
            // One expression a line: piped input does not wait for a declaration's await.
            `await sweeper.run("drop-canceling-builds").then((r) => console.log("RESULT " + JSON.stringify(r)))\n` +
              `console.log("TARGET " + sweeper.target)\n.exit\n`
          )
          assert.strictEqual(session.code, 0, session.stderr)
          assert.match(session.stdout, /talking to the supervisor at http:\/\/127\.0\.0\.1:\d+ \(pid \d+/)
          const line = session.stdout.split("\n").find((l) => l.includes("RESULT "))
          assert.isDefined(line, `STDOUT ${session.stdout}\nSTDERR ${session.stderr}`)
          const result = JSON.parse(line!.slice(line!.indexOf("RESULT ") + "RESULT ".length)) as {
            runId: string
            outcome: string
            summary: { dropped: number }
          }
          assert.strictEqual(result.outcome, "succeeded", line)
          assert.isAbove(result.summary.dropped, 0, line)

          // The run's own events, through the supervisor's API: started manually, a lease, builds dropped.
          const events = await (await fetch(`${base}/api/events?run=${result.runId}&limit=1000`)).json() as Array<
            StoredEvent
          >
          const started = events.find((e) => e.type === "RunStarted")!
          assert.strictEqual(started.data.trigger, "manual")
          assert.strictEqual(started.data.dryRun, false)
          // The same run guard as a scheduled run: the same fields, a fencing epoch from its exclusive lease.
          assert.deepStrictEqual(Object.keys(started.data).sort(), Object.keys(scheduled.data).sort())
          assert.isNumber(started.data.lease_epoch)
          assert.strictEqual(events.filter((e) => e.type === "BuildDropped").length, result.summary.dropped)
          assert.isDefined(events.find((e) => e.type === "RunFinished" && e.data.outcome === "succeeded"))
        } finally {
          demo.child.kill("SIGTERM")
          await demo.exited
          rmSync(dataDir, { recursive: true, force: true })
        }
      }),
    240_000
  )
})
