/**
 * Shutdown on the embedded default never hangs. PGlite's initialisation blocks the event loop for
 * seconds, so a SIGTERM sent meanwhile is handled just as the database client connects: the socket
 * server stops before it has taken that connection, then only `end()`s it, and with the client's
 * startup message unread that socket never closed. `stop()` waited for it forever; the process
 * ignored every later SIGTERM too.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { existsSync, mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { startSweeper, waitFor } from "../support/processes.ts"

describe("shutdown on the embedded default", () => {
  it.live("a SIGTERM while PGlite initialises stops the supervisor", () =>
    Effect.promise(async () => {
      const dataDir = mkdtempSync(join(tmpdir(), "sweeper-shutdown-"))
      const sweeper = startSweeper("shutdown-during-startup", { SWEEPER_DATA_DIR: dataDir, SWEEPER_HTTP_PORT: "0" })
      try {
        await waitFor(
          "the start-up line",
          async () => sweeper.output().includes("Sweeper starting") || undefined,
          60_000,
          20
        )
        // Initialising a fresh data directory blocks the event loop for seconds: the signal is
        // handled when PGlite is up and the client is connecting.
        await new Promise((resolve) => setTimeout(resolve, 1000))
        assert.isFalse(sweeper.output().includes("HTTP listening"), "too late: start-up had finished")
        sweeper.child.kill("SIGTERM")
        // The signal takes effect once PGlite.create returns (its acquire cannot be cut short), and
        // on a loaded machine a fresh initialisation alone takes tens of seconds: the limit only has
        // to tell a slow start-up from the hang this guards against, which never ends.
        const code = await Promise.race([
          sweeper.exited,
          new Promise((resolve) => setTimeout(() => resolve("still running"), 120_000))
        ])
        assert.oneOf(code, [0, 130], sweeper.output())
        // Stopped where it was: start-up did not carry on to serve and schedule after the signal.
        assert.notInclude(sweeper.output(), "HTTP listening", "the signal did not stop start-up")
        assert.isFalse(existsSync(join(dataDir, "embedded.lock")), "the lock is released on shutdown")
      } finally {
        if (sweeper.child.exitCode === null && sweeper.child.signalCode === null) sweeper.child.kill("SIGKILL")
        await sweeper.exited
        rmSync(dataDir, { recursive: true, force: true })
      }
    }), 240_000)
})
