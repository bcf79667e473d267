/** Runs the real CLI (`node bin/sweeper.mjs …`) as a child process, as an operator would. */
import { spawn } from "node:child_process"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"

const root = fileURLToPath(new URL("../..", import.meta.url))

/** Tests never touch the project's own ./.sweeper or port 9394 (a developer's `npm start` may hold them). */
const scratchDataDir = join(tmpdir(), `sweeper-test-data-${process.pid}`)

/**
 * What an operator's `npx sweeper` runs: bin/sweeper.mjs, which runs the bundled build of src/
 * (bin/bundle.mjs; test/support/bundle.globalSetup.ts builds it once before the tests). A start
 * from src/ strips and compiles ≈ 600 modules: about 0.85 s of CPU a start against 0.2 s for the
 * bundle, and the suite starts hundreds on its 2 cores. SWEEPER_FROM_SOURCE=1 (passed on) runs src/.
 */
export const sweeperEntry = "bin/sweeper.mjs"
export const fromSource = process.env.SWEEPER_FROM_SOURCE === "1" ? { SWEEPER_FROM_SOURCE: "1" } : {}

export interface CliResult {
  readonly code: number | null
  readonly stdout: string
  readonly stderr: string
}

export const runCli = (args: ReadonlyArray<string>, env: Record<string, string> = {}, timeoutMs = 60_000) =>
  new Promise<CliResult>((resolve, reject) => {
    // process.execPath is the Node 24 that runs vitest (npm puts it first on PATH).
    const child = spawn(process.execPath, [sweeperEntry, ...args], {
      cwd: root,
      env: {
        PATH: process.env.PATH ?? "",
        HOME: process.env.HOME ?? "/tmp",
        SWEEPER_DATA_DIR: scratchDataDir,
        SWEEPER_HTTP_PORT: "0",
        ...fromSource,
        ...env
      },
      stdio: ["ignore", "pipe", "pipe"]
    })
    let stdout = ""
    let stderr = ""
    child.stdout.on("data", (chunk) => (stdout += chunk))
    child.stderr.on("data", (chunk) => (stderr += chunk))
    const timer = setTimeout(() => {
      child.kill("SIGKILL")
      reject(new Error(`sweeper ${args.join(" ")} timed out\n${stderr}`))
    }, timeoutMs)
    child.on("error", reject)
    child.on("close", (code) => {
      clearTimeout(timer)
      resolve({ code, stdout, stderr })
    })
  })

/**
 * Any command run to its end in `cwd` with only PATH and HOME (plus `env`) set, `input` on its
 * stdin: what a newcomer's fresh terminal would run.
 */
export const runToEnd = (
  file: string,
  args: ReadonlyArray<string>,
  options: { readonly cwd?: string; readonly env?: Record<string, string>; readonly input?: string } = {}
) =>
  new Promise<CliResult>((resolve, reject) => {
    const child = spawn(file, args, {
      cwd: options.cwd ?? root,
      env: { PATH: process.env.PATH ?? "", HOME: process.env.HOME ?? "/tmp", ...options.env },
      stdio: ["pipe", "pipe", "pipe"]
    })
    let stdout = ""
    let stderr = ""
    child.stdout.on("data", (chunk) => (stdout += chunk))
    child.stderr.on("data", (chunk) => (stderr += chunk))
    child.on("error", reject)
    child.on("close", (code) => resolve({ code, stdout, stderr }))
    child.stdin.end(options.input ?? "")
  })

/** A command line as printed for a newcomer, typed into a shell in the checkout, `input` on stdin. */
export const shellInCheckout = (command: string, input = "") => runToEnd("sh", ["-c", command], { input })
