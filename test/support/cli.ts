/** Runs the real CLI (`node src/main.ts …`) as a child process, as an operator would. */
import { spawn } from "node:child_process"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"

const root = fileURLToPath(new URL("../..", import.meta.url))

/** Tests never touch the project's own ./.sweeper or port 9394 (a developer's `npm start` may hold them). */
const scratchDataDir = join(tmpdir(), `sweeper-test-data-${process.pid}`)

export interface CliResult {
  readonly code: number | null
  readonly stdout: string
  readonly stderr: string
}

export const runCli = (args: ReadonlyArray<string>, env: Record<string, string> = {}, timeoutMs = 60_000) =>
  new Promise<CliResult>((resolve, reject) => {
    // process.execPath is the Node 24 that runs vitest (npm puts it first on PATH).
    const child = spawn(process.execPath, ["src/main.ts", ...args], {
      cwd: root,
      env: {
        PATH: process.env.PATH ?? "",
        HOME: process.env.HOME ?? "/tmp",
        SWEEPER_DATA_DIR: scratchDataDir,
        SWEEPER_HTTP_PORT: "0",
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
