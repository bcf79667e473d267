/**
 * `npm test`'s output as a reader meets it: a failure is the last thing printed, by its full name,
 * with the logs of the failing test and none of the passing ones. The project's own vitest
 * configuration is run on a made-up tree in a temporary directory: one test that passes and logs,
 * one that fails and logs, and one file whose setup throws before any test runs.
 */
import { assert, describe, it } from "@effect/vitest"
import { spawnSync } from "node:child_process"
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"

const root = join(import.meta.dirname, "..", "..")

const PASSING = `import { expect, it } from "vitest"
it("adds up", () => {
  console.log("noise-from-a-passing-test")
  expect(1 + 1).toBe(2)
})
it("the deliberately failing test", () => {
  console.log("evidence-from-the-failing-test")
  expect(1 + 1).toBe(3)
})
`
const BROKEN_SETUP = `import { beforeAll, it } from "vitest"
beforeAll(() => {
  throw new Error("the server did not start")
})
it("never runs", () => {})
`

/** Variables of the vitest running this file, which would make the inner run think it is a worker. */
const outerVitest = (name: string) => name.startsWith("VITEST") || name === "TEST" || name === "NODE_ENV"

describe("npm test's output", () => {
  it("ends with the failed tests' names and the totals; logs only for the failing test", () => {
    const dir = mkdtempSync(join(tmpdir(), "sweeper-npm-test-"))
    try {
      mkdirSync(join(dir, "test"))
      writeFileSync(join(dir, "test", "fixture.test.ts"), PASSING)
      writeFileSync(join(dir, "test", "setup.test.ts"), BROKEN_SETUP)
      symlinkSync(join(root, "node_modules"), join(dir, "node_modules"), "dir")
      const env = Object.fromEntries(Object.entries(process.env).filter(([name]) => !outerVitest(name)))
      const run = spawnSync(
        process.execPath,
        [join(root, "node_modules", "vitest", "vitest.mjs"), "run", "--config", join(root, "vitest.config.ts")],
        { cwd: dir, env: { ...env, NO_COLOR: "1" }, encoding: "utf8", timeout: 120_000 }
      )
      const output = `${run.stdout}${run.stderr}`
      assert.strictEqual(run.status, 1, output)
      const lines = run.stdout.trimEnd().split("\n")
      assert.deepStrictEqual(lines.slice(-4), [
        "Failed (2):",
        "  test/fixture.test.ts > the deliberately failing test",
        "  test/setup.test.ts (setup failed: the server did not start)",
        "Tests: 1 passed, 2 failed, 0 skipped"
      ], output)
      assert.include(output, "evidence-from-the-failing-test")
      assert.notInclude(output, "noise-from-a-passing-test")
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })
})
