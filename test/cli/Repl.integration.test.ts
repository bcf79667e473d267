/** The REPL and `sweeper status` on the embedded default, as an operator types them. */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { spawn } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { runCli } from "../support/cli.ts"

const root = fileURLToPath(new URL("../..", import.meta.url))

const repl = (input: string, env: Record<string, string>) =>
  new Promise<{ code: number | null; stdout: string }>((resolve, reject) => {
    const child = spawn(process.execPath, ["src/cli/Repl.ts"], {
      cwd: root,
      env: { PATH: process.env.PATH ?? "", HOME: process.env.HOME ?? "/tmp", ...env },
      stdio: ["pipe", "pipe", "pipe"]
    })
    let stdout = ""
    child.stdout.on("data", (chunk) => (stdout += chunk))
    child.on("error", reject)
    child.on("close", (code) => resolve({ code, stdout }))
    child.stdin.end(input)
  })

describe("REPL and status", () => {
  it.live("runs a batch from the REPL, then status shows it", () =>
    Effect.promise(async () => {
      const dataDir = mkdtempSync(join(tmpdir(), "sweeper-repl-"))
      try {
        const env = { SWEEPER_DATA_DIR: dataDir }
        const session = await repl(
          `await sweeper.run("drop-canceling-builds").then((r) => "outcome=" + r.outcome)\n` +
            `"batches=" + sweeper.batches.length\n.exit\n`,
          env
        )
        assert.strictEqual(session.code, 0)
        assert.include(session.stdout, "'outcome=succeeded'")
        // The eight GitLab batches and Sweeper's own prune-events.
        assert.include(session.stdout, "'batches=9'")

        const status = await runCli(["status", "--json"], env)
        assert.strictEqual(status.code, 0)
        const rows = JSON.parse(status.stdout) as Array<{ name: string; lastOutcome: string | null }>
        assert.strictEqual(rows.find((r) => r.name === "drop-canceling-builds")!.lastOutcome, "succeeded")
        assert.strictEqual(rows.find((r) => r.name === "stuck-export-jobs")!.lastOutcome, null)

        // And a one-off CLI run on the embedded default prints its one JSON line.
        const run = await runCli(["run", "drop-canceling-builds", "--json"], env)
        assert.strictEqual(run.code, 0)
        const result = JSON.parse(run.stdout)
        assert.deepStrictEqual(Object.keys(result), ["batch", "runId", "outcome", "dryRun", "summary"])
        assert.strictEqual(result.outcome, "succeeded")
      } finally {
        rmSync(dataDir, { recursive: true, force: true })
      }
    }), 150_000)

  it.live(
    "piped lines are answered one at a time, in order; pause and resume say what they did",
    () =>
      Effect.promise(async () => {
        const dataDir = mkdtempSync(join(tmpdir(), "sweeper-repl-order-"))
        try {
          const session = await repl(
            `await new Promise((answer) => setTimeout(() => answer("first"), 800))\n"second"\n` +
              `await sweeper.pause("prune-events")\nawait sweeper.resume("prune-events")\n.exit\n`,
            { SWEEPER_DATA_DIR: dataDir, SWEEPER_LOG_LEVEL: "Warn" }
          )
          assert.strictEqual(session.code, 0, session.stdout)
          const answers = session.stdout.split("\n").map((line) => line.replace(/^(sweeper> )+/, "")).filter((line) =>
            line.startsWith("'") || line === "undefined"
          )
          assert.deepStrictEqual(answers, ["'first'", "'second'", "'prune-events paused'", "'prune-events resumed'"])
        } finally {
          rmSync(dataDir, { recursive: true, force: true })
        }
      }),
    150_000
  )
})
