/**
 * The CLI's remote road: on the embedded default the running supervisor holds the database, so
 * `status`, `events`, `run`, `pause` and `resume` go through the client derived from the API
 * definition (Api.ts) — the same answers as the local road, errors as one line with the same exit
 * codes.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { runCli } from "../support/cli.ts"
import { startSweeper } from "../support/processes.ts"

const errorLines = (stderr: string) => stderr.split("\n").filter((l) => l.startsWith("sweeper:"))

describe("the CLI against a running supervisor", () => {
  it.live(
    "status, events, run, pause and resume over the API; bad input is one line, exit 2",
    () =>
      Effect.promise(async () => {
        const dataDir = mkdtempSync(join(tmpdir(), "sweeper-remote-"))
        const supervisor = startSweeper("remote-supervisor", { SWEEPER_DATA_DIR: dataDir })
        try {
          await supervisor.listening
          const env = { SWEEPER_DATA_DIR: dataDir }
          const paused = await runCli(["pause", "stuck-export-jobs"], env)
          assert.strictEqual(paused.code, 0, paused.stderr)
          const status = await runCli(["status", "--json"], env)
          assert.strictEqual(status.code, 0, status.stderr)
          const view =
            (JSON.parse(status.stdout) as Array<{ name: string; state: string; paused: { by: string } | null }>).find((
              v
            ) => v.name === "stuck-export-jobs")!
          assert.strictEqual(view.state, "paused")
          assert.match(view.paused!.by, /^cli:/, "the client sends who paused")

          const events = await runCli(["events", "--type", "BatchPaused", "--since", "1h", "--json"], env)
          assert.strictEqual(events.code, 0, events.stderr)
          const found = events.stdout.trim().split("\n").map((line) => JSON.parse(line))
          assert.lengthOf(found, 1)
          assert.strictEqual(found[0].stream, "batch:stuck-export-jobs")
          assert.strictEqual(
            (await runCli(["events", "--type", "BatchPaused", "--until", "1h", "--json"], env)).stdout,
            ""
          )

          const ran = await runCli(["run", "drop-canceling-builds", "--json", "--dry-run"], env)
          assert.strictEqual(ran.code, 0, ran.stderr)
          assert.include(JSON.parse(ran.stdout), { batch: "drop-canceling-builds", outcome: "succeeded", dryRun: true })

          const budget = await runCli(["run", "drop-canceling-builds", "--budget", "5s"], env)
          assert.strictEqual(budget.code, 2)
          assert.lengthOf(errorLines(budget.stderr), 1, budget.stderr)
          assert.include(errorLines(budget.stderr)[0], "--budget")

          // --now goes to the supervisor too (it applies the same --now rule).
          const judgedAt = await runCli(
            ["run", "prune-events", "--now", "2020-01-01T00:00:00Z", "--dry-run", "--json"],
            env
          )
          assert.strictEqual(judgedAt.code, 0, judgedAt.stderr)

          assert.strictEqual((await runCli(["resume", "stuck-export-jobs"], env)).code, 0)
          const after = JSON.parse((await runCli(["status", "--json"], env)).stdout) as Array<
            { name: string; state: string }
          >
          assert.notStrictEqual(after.find((v) => v.name === "stuck-export-jobs")!.state, "paused")
        } finally {
          supervisor.child.kill("SIGTERM")
          await supervisor.exited
          rmSync(dataDir, { recursive: true, force: true })
        }
      }),
    180_000
  )
})
