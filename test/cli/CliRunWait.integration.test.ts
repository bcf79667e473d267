/**
 * A remote `sweeper run` waits as long as the run may take. Node's fetch gives up on a response
 * whose headers take more than five minutes, which a held run or drop-canceling-builds (a 25-minute
 * budget) easily does: the CLI said "supervisor unreachable" (exit 3) while the run went on. The
 * five minutes are shortened here to one second (a preload sets fetch's own limit), and a stand-in
 * supervisor answers the run after eleven; its address file is what a real one publishes.
 */
import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect, Option } from "effect"
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { createServer, type Server } from "node:http"
import type { AddressInfo } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { parseBudget, runWait } from "../../src/cli/Operator.ts"
import { runCli } from "../support/cli.ts"

const preload = fileURLToPath(new URL("../support/shortFetchTimeout.mjs", import.meta.url))

const view = (name: string, budget: string) => ({
  name,
  worker: "Ci::DropCancelingBuildsWorker",
  description: "stand-in",
  cron: "*/5 * * * *",
  cronInWords: "every 5 minutes",
  timezone: "UTC",
  state: "idle",
  disabled: false,
  paused: null,
  breaker: { open: false, until: null },
  nextTick: null,
  nextTicks: [],
  lastRun: null,
  lastOutcome: null,
  openRun: null,
  lastSuccessAt: null,
  consecutiveFailures: 0,
  config: { budget, lease: null, missedRuns: "skip" }
})

/** A stand-in supervisor whose runs answer after `answerAfterMs` (never, if undefined). */
const standIn = (answerAfterMs: number | undefined, budget: string) =>
  new Promise<{ server: Server; url: string; runs: () => number; aborted: () => number }>((resolve) => {
    let runs = 0
    let aborted = 0
    const server = createServer((request, response) => {
      request.resume()
      request.on("end", () => {
        if (request.method === "GET" && request.url === "/api/batches") {
          response.setHeader("content-type", "application/json")
          return response.end(JSON.stringify([view("drop-canceling-builds", budget)]))
        }
        if (request.method === "POST" && request.url === "/api/batches/drop-canceling-builds/run") {
          runs++
          response.on("close", () => {
            if (!response.writableFinished) aborted++
          })
          if (answerAfterMs === undefined) return
          return setTimeout(() => {
            response.setHeader("content-type", "application/json")
            response.end(JSON.stringify({
              batch: "drop-canceling-builds",
              runId: "0f8a1c2e-5b7d-4e9a-9c3f-2a6b8d4e1f70",
              outcome: "succeeded",
              summary: { dropped: 7 },
              durationMs: answerAfterMs,
              dryRun: false
            }))
          }, answerAfterMs)
        }
        response.statusCode = 404
        response.end("{}")
      })
    })
    server.listen(0, "127.0.0.1", () =>
      resolve({
        server,
        url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
        runs: () => runs,
        aborted: () => aborted
      }))
  })

const publish = (dataDir: string, url: string) =>
  writeFileSync(join(dataDir, "supervisor.json"), JSON.stringify({ pid: process.pid, url, token: "t" }))

describe("a remote run longer than the HTTP client's patience", () => {
  it.live(
    "waits for the run's answer instead of reporting the supervisor unreachable",
    () =>
      Effect.promise(async () => {
        const dataDir = mkdtempSync(join(tmpdir(), "sweeper-wait-"))
        const fake = await standIn(11_000, "25m")
        try {
          publish(dataDir, fake.url)
          const ran = await runCli(["run", "drop-canceling-builds", "--json"], {
            SWEEPER_DATA_DIR: dataDir,
            NODE_OPTIONS: `--import ${preload}`,
            TEST_FETCH_HEADERS_TIMEOUT_MS: "1000"
          })
          assert.strictEqual(ran.code, 0, ran.stderr)
          assert.include(JSON.parse(ran.stdout), { outcome: "succeeded" })
          assert.strictEqual(fake.runs(), 1)
          // Silent for ten seconds, it says once what it waits for, and how long it would.
          assert.include(ran.stderr, "Waiting for the run of drop-canceling-builds (up to 51m 30s)")
        } finally {
          fake.server.close()
          rmSync(dataDir, { recursive: true, force: true })
        }
      }),
    60_000
  )
})

describe("SWEEPER_URL", () => {
  it.live("names the supervisor to talk to, and the CLI says it talks to that one", () =>
    Effect.promise(async () => {
      const dataDir = mkdtempSync(join(tmpdir(), "sweeper-url-"))
      const fake = await standIn(0, "25m")
      try {
        const status = await runCli(["status", "--json"], { SWEEPER_DATA_DIR: dataDir, SWEEPER_URL: fake.url })
        assert.strictEqual(status.code, 0, status.stderr)
        assert.deepStrictEqual((JSON.parse(status.stdout) as Array<{ name: string }>).map((v) => v.name), [
          "drop-canceling-builds"
        ])
        assert.include(status.stderr, `Talking to the supervisor at ${fake.url} (SWEEPER_URL)`)
      } finally {
        fake.server.close()
        rmSync(dataDir, { recursive: true, force: true })
      }
    }), 60_000)
})

describe("how long the CLI waits for a remote run", () => {
  it("the run ahead and its own, each budget + the hard-timeout grace, plus slack; budgets as the API writes them", () => {
    assert.deepStrictEqual(parseBudget("25m"), Option.some(Duration.minutes(25)))
    assert.deepStrictEqual(parseBudget("1h 30m"), Option.some(Duration.minutes(90)))
    assert.deepStrictEqual(parseBudget("0"), Option.some(Duration.zero))
    assert.isTrue(Option.isNone(parseBudget("soon")))
    // 2 × (25m + 30s) + 30s
    assert.strictEqual(Duration.toMillis(runWait(Duration.minutes(25))), (2 * (25 * 60 + 30) + 30) * 1000)
  })
})
