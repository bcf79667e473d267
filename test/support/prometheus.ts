/**
 * A real Prometheus (Debian's `prometheus`, which .ci/run installs for promtool) scraping a tiny
 * exporter this test process serves on loopback, whose gauges the test sets: for the health gate's
 * Prometheus rules. Scrapes every second; data in a temp dir; both stopped at scope close. A
 * missing binary fails the test, never skips it.
 */
import { Effect } from "effect"
import { spawn } from "node:child_process"
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
    const port = await freePort()
    const child = spawn("prometheus", [
      `--config.file=${join(dir, "prometheus.yml")}`,
      `--storage.tsdb.path=${join(dir, "data")}`,
      `--web.listen-address=127.0.0.1:${port}`
    ], { stdio: ["ignore", "ignore", "pipe"] })
    let stderr = ""
    child.stderr!.on("data", (chunk) => (stderr += chunk))
    const spawned = new Promise<void>((_resolve, reject) =>
      child.once(
        "error",
        (error) => reject(new Error(`prometheus is required (Debian package prometheus): ${error.message}`))
      )
    )
    spawned.catch(() => {})
    const url = `http://127.0.0.1:${port}`
    const ready = async () => {
      for (let i = 0; i < 300; i++) {
        if (child.exitCode !== null) throw new Error(`prometheus exited (${child.exitCode}):\n${stderr}`)
        try {
          if ((await fetch(`${url}/-/ready`)).ok) return
        } catch {
          // not listening yet
        }
        await new Promise((resolve) => setTimeout(resolve, 100))
      }
      throw new Error(`prometheus never became ready:\n${stderr}`)
    }
    await Promise.race([ready(), spawned])
    const prometheus: TestPrometheus = {
      url,
      set: (next) => {
        series = next
      },
      waitFor: async (query, value, timeoutMs = 15_000) => {
        const deadline = Date.now() + timeoutMs
        while (Date.now() < deadline) {
          if ((await queryValue(url, query)) === value) return
          await new Promise((resolve) => setTimeout(resolve, 200))
        }
        throw new Error(`prometheus: ${query} never returned ${value}`)
      }
    }
    // Removed only once Prometheus has exited: it writes its data dir while shutting down.
    const stop = async () => {
      const exited = new Promise<void>((resolve) =>
        child.exitCode !== null ? resolve() : child.once("exit", () => resolve())
      )
      child.kill("SIGTERM")
      const killer = setTimeout(() => child.kill("SIGKILL"), 5_000)
      await exited
      clearTimeout(killer)
      exporter.close()
      rmSync(dir, { recursive: true, force: true })
    }
    return { prometheus, stop }
  }),
  ({ stop }) => Effect.promise(stop)
).pipe(Effect.map(({ prometheus }) => prometheus))
