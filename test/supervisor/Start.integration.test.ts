/**
 * `npm start` on a machine with no configuration: the supervisor comes up on the embedded default
 * (PGlite under ./.sweeper, in-memory Redis), says so first, serves /healthz, and a SIGTERM sent to
 * the *npm* process (what Docker, Kubernetes and most process managers do) stops the supervisor
 * gracefully, leaving no orphan.
 *
 * The test never touches the project's own ./.sweeper or port 9394 (a developer's `npm start` may
 * be using them): it runs `npm start` from a scratch directory that links to the project's sources
 * and modules, so the default `.sweeper` is the scratch one, and asks for port 0 — the one setting
 * it needs. The default port itself is pinned by a spec of the configuration.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { spawn } from "node:child_process"
import { copyFileSync, existsSync, mkdtempSync, readFileSync, rmSync, symlinkSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { waitFor } from "../support/processes.ts"

const root = fileURLToPath(new URL("../..", import.meta.url))

const isAlive = (pid: number) => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

describe("npm start", () => {
  it.live(
    "comes up on the embedded default, answers /healthz, and SIGTERM to npm stops it (no orphan)",
    () =>
      Effect.promise(async () => {
        const scratch = mkdtempSync(join(tmpdir(), "sweeper-start-"))
        copyFileSync(join(root, "package.json"), join(scratch, "package.json"))
        symlinkSync(join(root, "src"), join(scratch, "src"))
        symlinkSync(join(root, "bin"), join(scratch, "bin"))
        symlinkSync(join(root, "node_modules"), join(scratch, "node_modules"))
        // Only what a shell always has, plus a free port: no DATABASE_URL, REDIS_URL or data dir.
        const child = spawn("npm", ["start", "--silent"], {
          cwd: scratch,
          env: { PATH: process.env.PATH ?? "", HOME: process.env.HOME ?? "/tmp", SWEEPER_HTTP_PORT: "0" },
          stdio: ["ignore", "pipe", "pipe"],
          detached: true
        })
        let output = ""
        child.stdout.on("data", (chunk) => (output += chunk))
        child.stderr.on("data", (chunk) => (output += chunk))
        const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)))
        const lockFile = join(scratch, ".sweeper", "embedded.lock")
        let supervisorPid: number | undefined
        try {
          const base = await waitFor(
            "the HTTP address",
            async () => /HTTP listening on (http:\/\/[^\s"\\]+)/.exec(output)?.[1],
            75_000
          )
          const health = await (await fetch(`${base}/healthz`)).text()
          assert.strictEqual(health.trim(), "ok")
          const first = output.split("\n").find((line) => line.trim().startsWith("{"))
          assert.include(first, "embedded default")
          assert.include(first, "PGlite")
          for (
            const batch of [
              "drop-canceling-builds",
              "stuck-export-jobs",
              "delete-stale-direct-uploads",
              "reschedule-stuck-issue-rebalances",
              "concurrency-limit-resume",
              "prune-events"
            ]
          ) {
            assert.include(output, `Scheduled ${batch}`)
          }
          // The supervisor published its address in the (default, scratch) data directory.
          const published = JSON.parse(readFileSync(join(scratch, ".sweeper", "supervisor.json"), "utf8"))
          assert.strictEqual(published.url, base)
          supervisorPid = Number(readFileSync(lockFile, "utf8"))
          assert.notStrictEqual(supervisorPid, child.pid, "npm is not the supervisor")

          // SIGTERM to npm itself, never to node: `exec` makes npm's child the supervisor.
          process.kill(child.pid!, "SIGTERM")
          assert.strictEqual(await exited, 0, output)
          await waitFor("the supervisor to be gone", async () => isAlive(supervisorPid!) ? undefined : true, 10_000)
          assert.isFalse(existsSync(lockFile), "the lock is released on shutdown")
          assert.isFalse(
            existsSync(join(scratch, ".sweeper", "supervisor.json")),
            "the address is withdrawn on shutdown"
          )
          assert.include(output, "Shutting down", "the supervisor shut down gracefully")
        } finally {
          if (child.exitCode === null) process.kill(-child.pid!, "SIGKILL")
          if (supervisorPid !== undefined && isAlive(supervisorPid)) process.kill(supervisorPid, "SIGKILL")
          rmSync(scratch, { recursive: true, force: true })
        }
      }),
    120_000
  )
})
