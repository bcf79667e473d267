/**
 * Builds the bundle bin/sweeper.mjs runs (bin/bundle.mjs) once, before any test file starts a
 * process: the CLI and supervisors the tests start go through bin/sweeper.mjs, as an operator's
 * `npx sweeper` does, and would otherwise each build it at once on the first starts of both workers.
 * A bundle that cannot be built fails the run here, in one message, rather than as a "running from
 * source" line on the stderr of every process a test starts. SWEEPER_FROM_SOURCE=1 runs them from
 * src/ (readable stack traces while debugging a test) and builds nothing.
 */
import { execFileSync } from "node:child_process"
import { fileURLToPath } from "node:url"

const root = fileURLToPath(new URL("../..", import.meta.url))

export default function buildBundle() {
  if (process.env.SWEEPER_FROM_SOURCE === "1") return
  const entry = execFileSync(
    process.execPath,
    ["--input-type=module", "-e", "console.log(String((await import('./bin/bundle.mjs')).bundledEntry()))"],
    { cwd: root, encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] }
  ).trim()
  if (entry === "undefined") {
    throw new Error(
      "bin/bundle.mjs could not build the bundle (its error is above); SWEEPER_FROM_SOURCE=1 runs from src/"
    )
  }
}
