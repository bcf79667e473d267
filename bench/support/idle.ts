/**
 * The supervisor's idle footprint against real servers (issue 9: ≤ 100 MB RSS): `sweeper start`
 * as its own process on a fresh database and the bench Redis, every batch scheduled, read from
 * /proc once it has listened and sat idle for a while. Prints figures only.
 */
import { Effect } from "effect"
import { spawn } from "node:child_process"
import { mkdtempSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { benchDatabase, benchRedis, redisUrl } from "./harness.ts"

const IDLE_SECONDS = 15

const statusField = (pid: number, field: string) => {
  const line = readFileSync(`/proc/${pid}/status`, "utf8").split("\n").find((l) => l.startsWith(`${field}:`))
  return Number(line?.replace(/\D+/g, "") ?? Number.NaN) * 1024
}

export const idleFootprint = Effect.scoped(Effect.gen(function*() {
  const database = yield* benchDatabase(undefined)
  yield* benchRedis
  const main = new URL("../../src/main.ts", import.meta.url).pathname
  const child = yield* Effect.acquireRelease(
    Effect.sync(() => spawn(process.execPath, [main, "start"], {
      env: {
        PATH: process.env.PATH ?? "",
        DATABASE_URL: database.url,
        REDIS_URL: redisUrl,
        SWEEPER_HTTP_PORT: "0",
        SWEEPER_DATA_DIR: mkdtempSync(join(tmpdir(), "sweeper-idle-")),
        SWEEPER_LOG_LEVEL: "Warn"
      },
      stdio: ["ignore", "pipe", "pipe"]
    })),
    (child) => Effect.promise(() => new Promise<void>((resolve) => {
      if (child.exitCode !== null) return resolve()
      child.once("exit", () => resolve())
      child.kill("SIGTERM")
    }))
  )
  let output = ""
  child.stdout.on("data", (chunk) => (output += String(chunk)))
  child.stderr.on("data", (chunk) => (output += String(chunk)))
  // Start-up (connect, migrate, schedule) takes a few seconds; then it only waits for ticks.
  yield* Effect.sleep(`${IDLE_SECONDS} seconds`)
  if (child.exitCode !== null) return yield* Effect.die(new Error(`sweeper start exited (${child.exitCode}): ${output.slice(-500)}`))
  const pid = child.pid!
  const rss = statusField(pid, "VmRSS")
  const peak = statusField(pid, "VmHWM")
  const mb = (bytes: number) => `${(bytes / 2 ** 20).toFixed(1)} MB`
  console.log(`\nidle supervisor (DATABASE_URL + REDIS_URL, all batches scheduled, ${IDLE_SECONDS} s after start)`)
  console.log(`  RSS ${mb(rss)}, peak ${mb(peak)} (target ≤ 100 MB)`)
  return { rssBytes: rss, peakBytes: peak }
}))
