/**
 * The supervisor's idle footprint against real servers (≤ 90 MB RSS): what `npm start`
 * runs (package.json's start script: its node flags and entry point), as its own process on a fresh
 * database and the bench Redis, every batch scheduled, read from /proc once it has listened and
 * sat idle for a while. A `--help` run first fills Node's compile cache, as any earlier start of
 * the same code would have: the figure is that of a restart, not of the very first start after an
 * upgrade (which also holds the TypeScript stripper, about 18 MB more). Prints figures only.
 */
import { Effect } from "effect"
import { execFileSync, spawn } from "node:child_process"
import { mkdtempSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { benchDatabase, benchRedis, redisUrl } from "./harness.ts"
import { benchLogLevel } from "./logging.ts"

const IDLE_SECONDS = 15

const statusField = (pid: number, field: string) => {
  const line = readFileSync(`/proc/${pid}/status`, "utf8").split("\n").find((l) => l.startsWith(`${field}:`))
  return Number(line?.replace(/\D+/g, "") ?? Number.NaN) * 1024
}

const root = new URL("../../", import.meta.url).pathname

/**
 * package.json's start script (`[NAME=value …] exec node <flags> <entry> start`) as the
 * environment it sets and node's arguments.
 */
const startCommand = (): { readonly env: Record<string, string>; readonly args: Array<string> } => {
  const script =
    (JSON.parse(readFileSync(`${root}package.json`, "utf8")) as { scripts: { start: string } }).scripts.start
  const words = script.split(/\s+/).filter((word) => word !== "exec")
  const env: Record<string, string> = {}
  while (/^[A-Z_][A-Z0-9_]*=/.test(words[0] ?? "")) {
    const [name, ...value] = words.shift()!.split("=")
    env[name!] = value.join("=")
  }
  if (words[0] !== "node") throw new Error(`unexpected start script: ${script}`)
  return { env, args: words.slice(1) }
}

export const idleFootprint = Effect.scoped(Effect.gen(function*() {
  const database = yield* benchDatabase(undefined)
  yield* benchRedis
  const { args, env: startEnv } = startCommand()
  yield* Effect.sync(() =>
    execFileSync(process.execPath, [...args.slice(0, -1), "--help"], { cwd: root, stdio: "ignore" })
  )
  const child = yield* Effect.acquireRelease(
    Effect.sync(() =>
      spawn(process.execPath, args, {
        cwd: root,
        env: {
          ...startEnv,
          PATH: process.env.PATH ?? "",
          DATABASE_URL: database.url,
          REDIS_URL: redisUrl,
          SWEEPER_HTTP_PORT: "0",
          SWEEPER_DATA_DIR: mkdtempSync(join(tmpdir(), "sweeper-idle-")),
          // Production's default, Info, unless BENCH_LOG_LEVEL asks for another (support/logging.ts).
          SWEEPER_LOG_LEVEL: benchLogLevel
        },
        stdio: ["ignore", "pipe", "pipe"]
      })
    ),
    (started) =>
      Effect.promise(() =>
        new Promise<void>((resolve) => {
          if (started.exitCode !== null) return resolve()
          started.once("exit", () => resolve())
          started.kill("SIGTERM")
        })
      )
  )
  let output = ""
  child.stdout.on("data", (chunk) => (output += String(chunk)))
  child.stderr.on("data", (chunk) => (output += String(chunk)))
  // Start-up (connect, migrate, schedule) takes a few seconds; then it only waits for ticks.
  yield* Effect.sleep(`${IDLE_SECONDS} seconds`)
  if (child.exitCode !== null) {
    return yield* Effect.die(new Error(`sweeper start exited (${child.exitCode}): ${output.slice(-500)}`))
  }
  const pid = child.pid!
  const rss = statusField(pid, "VmRSS")
  const peak = statusField(pid, "VmHWM")
  const mb = (bytes: number) => `${(bytes / 2 ** 20).toFixed(1)} MB`
  console.log(
    `\nidle supervisor (${Object.entries(startEnv).map(([k, v]) => `${k}=${v} `).join("")}node ${
      args.join(" ")
    }; DATABASE_URL + REDIS_URL, all batches scheduled, ${IDLE_SECONDS} s after start)`
  )
  console.log(`  RSS ${mb(rss)}, peak ${mb(peak)} (target ≤ 90 MB)`)
  return { rssBytes: rss, peakBytes: peak }
}))
