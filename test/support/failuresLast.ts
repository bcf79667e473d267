/**
 * A reporter that closes `npm test` with what failed, so a failure is the last thing on the screen
 * and nobody scrolls through a long run to find it: every failed test by its full name, every file
 * whose setup failed before its tests ran, then one `Tests: N passed, N failed, N skipped` line.
 * Above them, the slowest files with their time: the suite must stay within its budget on 2 cores, and
 * this list says where to look when it grows.
 */
import type { Reporter, SerializedError, TestModule } from "vitest/node"

export default class FailuresLast implements Reporter {
  onTestRunEnd(modules: ReadonlyArray<TestModule>, unhandledErrors: ReadonlyArray<SerializedError>) {
    const failed: Array<string> = []
    let passed = 0
    let skipped = 0
    for (const module of modules) {
      const tests = Array.from(module.children.allTests())
      // A file whose import or beforeAll failed: one failure for the file, its tests that never ran not skips.
      const setupFailed = module.state() === "failed" && !tests.some((test) => test.result().state === "failed")
      for (const test of tests) {
        const state = test.result().state
        if (state === "passed") passed++
        else if (state === "failed") failed.push(`${module.relativeModuleId} > ${test.fullName}`)
        else if (!setupFailed) skipped++
      }
      if (setupFailed) {
        failed.push(`${module.relativeModuleId} (setup failed: ${module.errors()[0]?.message ?? "no tests ran"})`)
      }
    }
    for (const error of unhandledErrors) failed.push(`unhandled error: ${error.message}`)
    const lines = ["", ...slowest(modules)]
    if (failed.length > 0) lines.push("", `Failed (${failed.length}):`, ...failed.map((name) => `  ${name}`))
    lines.push(`Tests: ${passed} passed, ${failed.length} failed, ${skipped} skipped`, "")
    process.stdout.write(lines.join("\n"))
  }
}

const SLOWEST_SHOWN = 15

/** The files whose tests and hooks took longest, longest first. */
const slowest = (modules: ReadonlyArray<TestModule>): ReadonlyArray<string> => {
  const timed = modules
    .map((module) => ({ name: module.relativeModuleId, seconds: module.diagnostic().duration / 1000 }))
    .sort((a, b) => b.seconds - a.seconds)
  const total = timed.reduce((sum, file) => sum + file.seconds, 0)
  return [
    `Slowest files (of ${timed.length}, ${total.toFixed(0)} s of tests and hooks in all):`,
    ...timed.slice(0, SLOWEST_SHOWN).map((file) => `  ${file.seconds.toFixed(1).padStart(7)} s  ${file.name}`)
  ]
}
