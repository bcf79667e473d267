/**
 * The CLI and the REPL find the supervisor they are meant for on their own — the one running on
 * the same data directory, or SWEEPER_URL — and say which one they talk to. With none running and
 * nothing configured they say so, instead of creating an empty `./.sweeper` and answering from it
 * as if it were Sweeper's state.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { existsSync, mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { batchNames } from "../../src/programs/index.ts"
import { runToEnd } from "../support/cli.ts"

/** What `npx sweeper` runs: the bundle (test/support/cli.ts says why). */
const main = fileURLToPath(new URL("../../bin/sweeper.mjs", import.meta.url))
const repl = fileURLToPath(new URL("../../src/cli/Repl.ts", import.meta.url))

/** A command run in `cwd` with nothing configured (no SWEEPER_* variable, no DATABASE_URL) but `env`. */
const bare = (cwd: string, args: ReadonlyArray<string>, input?: string, env: Record<string, string> = {}) =>
  runToEnd(process.execPath, args, { cwd, env, ...(input === undefined ? {} : { input }) })

describe("nothing running, nothing configured", () => {
  it.live("status, run and the REPL say so in one line and create no ./.sweeper", () =>
    Effect.promise(async () => {
      const cwd = mkdtempSync(join(tmpdir(), "sweeper-bare-"))
      try {
        for (const args of [["status"], ["run", "drop-canceling-builds", "--dry-run"], ["events"]]) {
          const result = await bare(cwd, [main, ...args])
          assert.strictEqual(result.code, 3, `${args.join(" ")}: ${result.stderr}`)
          const lines = result.stderr.split("\n").filter((line) => line.trim() !== "")
          assert.lengthOf(lines, 1, result.stderr)
          assert.match(lines[0]!, /^sweeper: no Sweeper supervisor is running for \.sweeper/)
          assert.include(lines[0]!, "SWEEPER_DATA_DIR")
          assert.strictEqual(result.stdout, "")
          assert.isFalse(existsSync(join(cwd, ".sweeper")), `${args.join(" ")} created ./.sweeper`)
        }
        const session = await bare(cwd, [repl], "1 + 1\n.exit\n")
        assert.notStrictEqual(session.code, 0)
        assert.include(session.stderr, "no Sweeper supervisor is running for .sweeper")
        assert.isFalse(existsSync(join(cwd, ".sweeper")), "the REPL created ./.sweeper")
      } finally {
        rmSync(cwd, { recursive: true, force: true })
      }
    }), 120_000)

  it.live(
    "a store a stopped supervisor left in ./.sweeper is read, and the CLI says that is what it reads",
    () =>
      Effect.promise(async () => {
        const cwd = mkdtempSync(join(tmpdir(), "sweeper-stopped-"))
        try {
          // Named once, the store is made (as `npx sweeper start` would; `status` only reads, and
          // makes none); then found by default.
          const made = await bare(cwd, [main, "migrate"], "", { SWEEPER_DATA_DIR: join(cwd, ".sweeper") })
          assert.strictEqual(made.code, 0, made.stderr)
          const status = await bare(cwd, [main, "status", "--json"])
          assert.strictEqual(status.code, 0, status.stderr)
          assert.include(status.stderr, `Reading the embedded database in ${join(cwd, ".sweeper")}`)
          // Every registered batch is listed from the store, none missing, none from elsewhere.
          const listed = (JSON.parse(status.stdout) as Array<{ name: string }>).map((batch) => batch.name)
          assert.sameMembers(listed, [...batchNames])
        } finally {
          rmSync(cwd, { recursive: true, force: true })
        }
      }),
    120_000
  )
})
