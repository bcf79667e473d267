/**
 * A manual run asked for over HTTP while the batch's scheduled run is held by the health gate waits
 * in the batch's mailbox. When its client gives up (the CLI's wait ran out, Ctrl-C, a browser tab
 * closed), the request is withdrawn: once the held run ends, nothing runs for nobody. The demo
 * makes the stuck builds; a stand-in Prometheus holds every batch until the test lets go.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtempSync, rmSync } from "node:fs"
import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { startSweeper, waitFor } from "../support/processes.ts"

interface StoredEvent {
  readonly type: string
  readonly data: Record<string, unknown>
}

describe("a manual run whose client gave up while it waited", () => {
  it.live("is never run once the run ahead of it ends", () =>
    Effect.promise(async () => {
      let apdex = 0.5
      const prometheus = createServer((_request, response) => {
        response.setHeader("content-type", "application/json")
        response.end(JSON.stringify({
          status: "success",
          data: { resultType: "scalar", result: [Date.now() / 1000, String(apdex)] }
        }))
      })
      await new Promise<void>((resolve) => prometheus.listen(0, "127.0.0.1", resolve))
      const health = JSON.stringify({
        prometheus: {
          url: `http://127.0.0.1:${(prometheus.address() as AddressInfo).port}`,
          rules: [{ name: "testApdex", query: "test_apdex", stop: "< 0.9", resume: ">= 0.9" }]
        }
      })
      const dataDir = mkdtempSync(join(tmpdir(), "sweeper-withdrawn-"))
      const demo = startSweeper("withdrawn-demo", { SWEEPER_DATA_DIR: dataDir, SWEEPER_HEALTH: health }, ["demo"])
      const events = async (query: string) =>
        await (await fetch(`${await demo.listening}/api/events?${query}&limit=1000`)).json() as Array<StoredEvent>
      try {
        const base = await demo.listening
        await waitFor("drop-canceling-builds held", async () =>
          (await events("type=RepairHeld")).some((e) =>
            e.data.batch === "drop-canceling-builds"
          ) || undefined, 90_000)
        const token = JSON.parse(
          await (await import("node:fs/promises")).readFile(join(dataDir, "supervisor.json"), "utf8")
        ) as { token: string }
        const abort = new AbortController()
        const asked = fetch(`${base}/api/batches/drop-canceling-builds/run`, {
          method: "POST",
          headers: { authorization: `Bearer ${token.token}`, "content-type": "application/json" },
          body: "{}",
          signal: abort.signal
        }).catch((error: unknown) =>
          error
        )
        await new Promise((resolve) => setTimeout(resolve, 1500))
        abort.abort()
        await asked
        apdex = 1
        await waitFor("the held run to end", async () =>
          (await events("type=RunFinished")).some((e) =>
            e.data.batch === "drop-canceling-builds" && (e.data.summary as { heldMs?: number } | null)?.heldMs
          ) || undefined, 90_000)
        // Time for a request left in the mailbox to have run.
        await new Promise((resolve) =>
          setTimeout(resolve, 5000)
        )
        const manual = (await events("type=RunStarted")).filter((e) =>
          e.data.batch === "drop-canceling-builds" && e.data.trigger === "manual"
        )
        assert.lengthOf(manual, 0, "the withdrawn request ran")
      } finally {
        demo.child.kill("SIGTERM")
        await demo.exited
        prometheus.close()
        rmSync(dataDir, { recursive: true, force: true })
      }
    }), 240_000)
})
