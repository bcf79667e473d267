/** Long-running Sweeper processes for multi-process and start-up tests. */
import { Effect } from "effect"
import { type ChildProcess, spawn } from "node:child_process"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { fromSource, sweeperEntry } from "./cli.ts"

const root = fileURLToPath(new URL("../..", import.meta.url))

/** Tests never touch the project's own ./.sweeper or port 9394 (a developer's `npm start` may hold them). */
const scratchDataDir = join(tmpdir(), `sweeper-test-data-${process.pid}`)

export interface SweeperProcess {
  readonly name: string
  readonly child: ChildProcess
  readonly output: () => string
  /** Resolves with the exit code (or signal name) when the process ends. */
  readonly exited: Promise<number | string>
  /** Resolves with the HTTP address once the supervisor has announced it. */
  readonly listening: Promise<string>
}

export const startSweeper = (
  name: string,
  env: Record<string, string>,
  args: ReadonlyArray<string> = ["start"]
): SweeperProcess => {
  const child = spawn(process.execPath, [sweeperEntry, ...args], {
    cwd: root,
    env: {
      PATH: process.env.PATH ?? "",
      HOME: process.env.HOME ?? "/tmp",
      SWEEPER_DATA_DIR: scratchDataDir,
      SWEEPER_HTTP_PORT: "0",
      SWEEPER_NODE_NAME: name,
      ...fromSource,
      ...env
    },
    stdio: ["ignore", "pipe", "pipe"]
  })
  let output = ""
  let announce: (address: string) => void = () => {}
  const listening = new Promise<string>((resolve) => (announce = resolve))
  const collect = (chunk: Buffer) => {
    output += chunk.toString()
    const match = /HTTP listening on (http:\/\/[^\s"\\]+)/.exec(output)
    if (match?.[1] !== undefined) announce(match[1])
  }
  child.stdout!.on("data", collect)
  child.stderr!.on("data", collect)
  const exited = new Promise<number | string>((resolve) =>
    child.on("exit", (code, signal) => resolve(code ?? signal ?? "unknown"))
  )
  // A process that dies before it listens fails the wait instead of hanging it.
  const listeningOrDied = Promise.race([
    listening,
    exited.then((code) => Promise.reject(new Error(`sweeper ${name} exited (${code}) before listening:\n${output}`)))
  ])
  listeningOrDied.catch(() => {})
  return { name, child, output: () => output, exited, listening: listeningOrDied }
}

export const waitFor = async <A>(
  what: string,
  probe: () => Promise<A | undefined>,
  timeoutMs: number,
  intervalMs = 250
): Promise<A> => {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    const value = await probe()
    if (value !== undefined) return value
    await new Promise((resolve) => setTimeout(resolve, intervalMs))
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)
}

/** `startSweeper` for a scope: the process is killed (SIGKILL) and awaited when the scope closes. */
export const scopedSweeper = (name: string, env: Record<string, string>, args?: ReadonlyArray<string>) =>
  Effect.acquireRelease(
    Effect.sync(() => startSweeper(name, env, args)),
    (p) =>
      Effect.promise(async () => {
        p.child.kill("SIGKILL")
        await p.exited
      })
  )
