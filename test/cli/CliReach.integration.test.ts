/**
 * The CLI reaches what it means to: a run id that is not one is refused at the edge (flag and
 * query), naming the flag, instead of failing inside PostgreSQL as `internal`.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { runCli } from "../support/cli.ts"
import { startSweeper } from "../support/processes.ts"

const errorLines = (stderr: string) => stderr.split("\n").filter((l) => l.trim() !== "")

describe("a run id that is not one", () => {
  it.live(
    "events --run abc: exit 2, one line naming --run; /api/events?run=abc: 400 naming run",
    () =>
      Effect.promise(async () => {
        const dataDir = mkdtempSync(join(tmpdir(), "sweeper-runid-"))
        const supervisor = startSweeper("runid-supervisor", { SWEEPER_DATA_DIR: dataDir })
        try {
          // Without a supervisor first: the local road.
          const alone = await runCli(["events", "--run", "abc"], { SWEEPER_DATA_DIR: join(dataDir, "alone") })
          assert.strictEqual(alone.code, 2, alone.stderr)
          assert.lengthOf(errorLines(alone.stderr), 1, alone.stderr)
          assert.include(alone.stderr, "--run")
          assert.strictEqual(alone.stdout, "")

          const base = await supervisor.listening
          const response = await fetch(`${base}/api/events?run=abc`)
          assert.strictEqual(response.status, 400)
          const body = await response.json() as { error: { code: string; message: string } }
          assert.strictEqual(body.error.code, "bad_request")
          assert.match(body.error.message, /^run: /)
          // A well-formed id that matches nothing is an empty answer, not an error.
          const none = await fetch(`${base}/api/events?run=0f8a1c2e-5b7d-4e9a-9c3f-2a6b8d4e1f70`)
          assert.strictEqual(none.status, 200)
          assert.deepStrictEqual(await none.json(), [])

          const remote = await runCli(["events", "--run", "abc"], { SWEEPER_DATA_DIR: dataDir })
          assert.strictEqual(remote.code, 2, remote.stderr)
          assert.include(errorLines(remote.stderr).at(-1), "--run")
        } finally {
          supervisor.child.kill("SIGTERM")
          await supervisor.exited
          rmSync(dataDir, { recursive: true, force: true })
        }
      }),
    120_000
  )
})
