/**
 * `npm start` on a machine with no configuration: the supervisor comes up on the embedded default
 * (PGlite under ./.sweeper, in-memory Redis), says so first, serves /healthz on the default port,
 * and exits 0 on SIGTERM.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { spawn } from "node:child_process"
import { existsSync, readFileSync } from "node:fs"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { waitFor } from "../support/processes.ts"

const root = fileURLToPath(new URL("../..", import.meta.url))

describe("npm start", () => {
  it.live("comes up on the embedded default with no environment and answers /healthz", () =>
    Effect.promise(async () => {
      // Only what a shell always has: no DATABASE_URL, REDIS_URL or SWEEPER_* variables.
      const child = spawn("npm", ["start", "--silent"], {
        cwd: root,
        env: { PATH: process.env.PATH ?? "", HOME: process.env.HOME ?? "/tmp" },
        stdio: ["ignore", "pipe", "pipe"],
        detached: true
      })
      let output = ""
      child.stdout.on("data", (chunk) => (output += chunk))
      child.stderr.on("data", (chunk) => (output += chunk))
      const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)))
      try {
        const health = await waitFor("/healthz on 127.0.0.1:9394", async () => {
          try {
            const response = await fetch("http://127.0.0.1:9394/healthz")
            return response.status === 200 ? await response.text() : undefined
          } catch {
            return undefined
          }
        }, 45_000)
        assert.strictEqual(health.trim(), "ok")
        const lines = output.split("\n").filter((line) => line.trim().startsWith("{"))
        assert.include(lines[0], "embedded default")
        assert.include(lines[0], "PGlite")
        assert.include(output, "HTTP listening on http://127.0.0.1:9394")
        for (const batch of ["drop-canceling-builds", "stuck-export-jobs", "delete-stale-direct-uploads", "reschedule-stuck-issue-rebalances", "concurrency-limit-resume"]) {
          assert.include(output, `Scheduled ${batch}`)
        }
        // SIGTERM to Sweeper itself (its pid is in the embedded database's lock file), as a process
        // manager would; npm passes its exit code through.
        const pid = Number(readFileSync(join(root, ".sweeper", "embedded.lock"), "utf8"))
        process.kill(pid, "SIGTERM")
        assert.strictEqual(await exited, 0)
        assert.isFalse(existsSync(join(root, ".sweeper", "embedded.lock")), "the lock is released on shutdown")
      } finally {
        if (child.exitCode === null) process.kill(-child.pid!, "SIGKILL")
      }
    }), 90_000)
})
