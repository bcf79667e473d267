/**
 * A private server whose setup fails leaves nothing behind: here prometheus cannot even be spawned
 * (nothing on PATH), and the temporary directory its setup made is gone when the error arrives.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit } from "effect"
import { mkdtempSync, readdirSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { testPrometheus } from "./prometheus.ts"

describe("test prometheus", () => {
  it.live("a setup that fails removes its temporary directory", () =>
    Effect.gen(function*() {
      const saved = { PATH: process.env.PATH, TMPDIR: process.env.TMPDIR }
      const scratch = mkdtempSync(join(tmpdir(), "sweeper-prometheus-setup-"))
      try {
        // os.tmpdir() reads TMPDIR on every call: the setup's directory lands in scratch, alone.
        process.env.TMPDIR = scratch
        process.env.PATH = ""
        const exit = yield* Effect.exit(Effect.scoped(testPrometheus))
        process.env.PATH = saved.PATH
        assert.isTrue(Exit.isFailure(exit))
        assert.include(String(Exit.isFailure(exit) ? exit.cause : ""), "prometheus is required")
        assert.deepStrictEqual(readdirSync(scratch), [])
      } finally {
        process.env.PATH = saved.PATH
        if (saved.TMPDIR === undefined) delete process.env.TMPDIR
        else process.env.TMPDIR = saved.TMPDIR
        rmSync(scratch, { recursive: true, force: true })
      }
    }))
})
