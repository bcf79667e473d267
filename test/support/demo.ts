/**
 * `npm run demo [-- args]` as a newcomer runs it, as a child process: on a scratch data directory
 * and a free port (never ./.sweeper or 9394), its output collected, and a clean-up that leaves no
 * process or directory behind whatever the test did.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"

const root = fileURLToPath(new URL("../..", import.meta.url))

export interface Demo {
  readonly child: ChildProcess
  readonly dataDir: string
  readonly stdout: () => string
  readonly stderr: () => string
  /** Resolves with the exit code (or signal name) when the demo ends. */
  readonly exited: Promise<number | string>
  /** SIGTERM, then its exit code, or "still running" if it has not ended within `withinMs`. */
  readonly stop: (withinMs?: number) => Promise<number | string>
  /** For a `finally`: stops what still runs (SIGTERM, SIGKILL after 30 s) and removes the data directory. */
  readonly cleanUp: () => Promise<void>
}

export const startDemo = (args: ReadonlyArray<string> = []): Demo => {
  const dataDir = mkdtempSync(join(tmpdir(), "sweeper-demo-test-"))
  const child = spawn("npm", ["run", "--silent", "demo", ...(args.length > 0 ? ["--", ...args] : [])], {
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
  const exited = new Promise<number | string>((resolve) =>
    child.on("exit", (code, signal) => resolve(code ?? signal ?? "unknown"))
  )
  const running = () => child.exitCode === null && child.signalCode === null
  const stop = (withinMs = 30_000) => {
    if (running()) child.kill("SIGTERM")
    return Promise.race([
      exited,
      new Promise<string>((resolve) => setTimeout(() => resolve("still running"), withinMs))
    ])
  }
  const cleanUp = async () => {
    if (running()) await stop()
    if (running()) child.kill("SIGKILL")
    await exited
    rmSync(dataDir, { recursive: true, force: true })
  }
  return { child, dataDir, stdout: () => stdout, stderr: () => stderr, exited, stop, cleanUp }
}
