/**
 * A reporter that closes `npm test` with what failed, so a failure is the last thing on the screen
 * and nobody scrolls through a long run to find it: every failed test by its full name, every file
 * whose setup failed before its tests ran, then one `Tests: N passed, N failed, N skipped` line.
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
    const lines = failed.length === 0 ? [] : ["", `Failed (${failed.length}):`, ...failed.map((name) => `  ${name}`)]
    lines.push(`Tests: ${passed} passed, ${failed.length} failed, ${skipped} skipped`, "")
    process.stdout.write(lines.join("\n"))
  }
}
