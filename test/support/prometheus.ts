/**
 * A real Prometheus (Debian's `prometheus`, which .ci/run installs for promtool) scraping a tiny
 * exporter this test process serves on loopback, whose gauges the test sets: for the health gate's
 * Prometheus rules. Scrapes every second; data in a temp dir; both stopped at scope close. A
 * missing binary fails the test, never skips it.
 */
import { Effect } from "effect"
import { type ChildProcess, spawn } from "node:child_process"
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { createServer, type Server } from "node:http"
import { createServer as createNetServer } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"

export interface TestPrometheus {
  /** Prometheus' base URL, for SWEEPER_HEALTH's `prometheus.url`. */
  readonly url: string
  /** Sets what the exporter serves: `{ 'test_apdex{db="main"}': 0.95 }`. */
  readonly set: (series: Record<string, number>) => void
  /** Waits until an instant query returns `value` (a scrape or two after `set`). */
  readonly waitFor: (query: string, value: number, timeoutMs?: number) => Promise<void>
}

const freePort = () =>
  new Promise<number>((resolve, reject) => {
    const server = createNetServer()
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const address = server.address()
      server.close(() =>
        typeof address === "object" && address !== null ? resolve(address.port) : reject(new Error("no port"))
      )
    })
  })

const queryValue = async (url: string, query: string): Promise<number | undefined> => {
  try {
    const response = await fetch(`${url}/api/v1/query?query=${encodeURIComponent(query)}`)
    const body = await response.json() as { data?: { result?: Array<{ value?: [number, string] }> } }
    const text = body.data?.result?.[0]?.value?.[1]
    return text === undefined ? undefined : Number(text)
  } catch {
    return undefined
  }
}

export const testPrometheus = Effect.acquireRelease(
  Effect.promise(async () => {
    let series: Record<string, number> = {}
    const exporter: Server = createServer((_request, response) => {
      response.setHeader("content-type", "text/plain; version=0.0.4")
      response.end(Object.entries(series).map(([name, value]) => `${name} ${value}\n`).join(""))
    })
    const exporterPort = await new Promise<number>((resolve) =>
      exporter.listen(0, "127.0.0.1", () => resolve((exporter.address() as { port: number }).port))
    )
    const dir = mkdtempSync(join(tmpdir(), "sweeper-prometheus-"))
    writeFileSync(
      join(dir, "prometheus.yml"),
      [
        "global:",
        "  scrape_interval: 1s",
        "  evaluation_interval: 1s",
        "scrape_configs:",
        "  - job_name: test",
        "    static_configs:",
        `      - targets: ["127.0.0.1:${exporterPort}"]`,
        ""
      ].join("\n")
    )
    // Readiness under load: a busy 2-core machine can take far longer than an idle one to start it.
    const READY_WITHIN_MS = 180_000
    /** One start on a port the OS just handed out; "taken" when another process bound it first. */
    const startOn = async (port: number) => {
      const child = spawn("prometheus", [
        `--config.file=${join(dir, "prometheus.yml")}`,
        `--storage.tsdb.path=${join(dir, "data")}`,
        `--web.listen-address=127.0.0.1:${port}`
      ], { stdio: ["ignore", "ignore", "pipe"] })
      let stderr = ""
      child.stderr!.on("data", (chunk) => (stderr += chunk))
      const spawned = new Promise<never>((_resolve, reject) =>
        child.once(
          "error",
          (error) => reject(new Error(`prometheus is required (Debian package prometheus): ${error.message}`))
        )
      )
      spawned.catch(() => {})
      const url = `http://127.0.0.1:${port}`
      const ready = async (): Promise<"ready" | "taken"> => {
        const deadline = Date.now() + READY_WITHIN_MS
        while (Date.now() < deadline) {
          if (child.exitCode !== null) {
            if (/address already in use/i.test(stderr)) return "taken"
            throw new Error(`prometheus exited (${child.exitCode}):\n${stderr}`)
          }
          try {
            if ((await fetch(`${url}/-/ready`)).ok) return "ready"
          } catch {
            // not listening yet
          }
          await new Promise((resolve) => setTimeout(resolve, 100))
        }
        throw new Error(`prometheus not ready within ${READY_WITHIN_MS / 1000} s:\n${stderr}`)
      }
      try {
        return { child, url, outcome: await Promise.race([ready(), spawned]) }
      } catch (error) {
        child.kill("SIGKILL")
        throw error
      }
    }
    /** Stops the child, then removes its data: it writes its data dir while shutting down. */
    const stopAll = async (child: ChildProcess | undefined) => {
      if (child !== undefined) {
        const exited = new Promise<void>((resolve) =>
          child.exitCode !== null || child.signalCode !== null ? resolve() : child.once("exit", () => resolve())
        )
        child.kill("SIGTERM")
        const killer = setTimeout(() => child.kill("SIGKILL"), 5_000)
        await exited
        clearTimeout(killer)
      }
      exporter.close()
      rmSync(dir, { recursive: true, force: true })
    }
    let started: { readonly child: ChildProcess; readonly url: string } | undefined
    try {
      // The port is free when the OS hands it out, but another process may bind it before
      // prometheus does: then a new port, a few times.
      for (let attempt = 0; started === undefined; attempt++) {
        const { child, outcome, url } = await startOn(await freePort())
        if (outcome === "ready") started = { child, url }
        else if (attempt >= 4) throw new Error("prometheus: every port tried was taken")
      }
    } catch (error) {
      // A failed setup leaves no process and no temp dir behind.
      await stopAll(undefined)
      throw error
    }
    const { child, url } = started
    const prometheus: TestPrometheus = {
      url,
      set: (next) => {
        series = next
      },
      waitFor: async (query, value, timeoutMs = 60_000) => {
        const deadline = Date.now() + timeoutMs
        while (Date.now() < deadline) {
          if ((await queryValue(url, query)) === value) return
          await new Promise((resolve) => setTimeout(resolve, 200))
        }
        throw new Error(`prometheus: ${query} never returned ${value}`)
      }
    }
    const stop = () => stopAll(child)
    return { prometheus, stop }
  }),
  ({ stop }) => Effect.promise(stop)
).pipe(Effect.map(({ prometheus }) => prometheus))
