import { fileURLToPath } from "node:url"
import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // The CLI and supervisors the tests start run the bundled build (test/support/cli.ts): built once here.
    // PgTest's databases are copies of one migrated per run (test/support/postgres.globalSetup.ts).
    globalSetup: [
      fileURLToPath(new URL("./test/support/bundle.globalSetup.ts", import.meta.url)),
      fileURLToPath(new URL("./test/support/postgres.globalSetup.ts", import.meta.url))
    ],
    // Integration tests start real processes (the CLI, a supervisor); on a loaded 2-core machine each
    // start can take tens of seconds, so a test's limit is generous: it only bounds a hang.
    testTimeout: 180_000,
    // Setup starts private servers (a standby pair, prometheus, a Redis cluster, chromium) that wait on
    // their own readiness; on a busy machine that can take minutes, so the hook's limit is generous.
    hookTimeout: 300_000,
    // Storage tests each get their own database / Redis db; two workers fit the 2-core machines.
    maxWorkers: 2,
    // A passing test's logs are noise; a failing one's are the evidence, printed beside its error.
    silent: "passed-only",
    // One dot per test while it runs; the failures' errors, then their names and the totals, last.
    reporters: ["dot", fileURLToPath(new URL("./test/support/failuresLast.ts", import.meta.url))]
  }
})
