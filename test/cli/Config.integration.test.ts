/**
 * Configuration is validated at the edge: each bad value below, given to the real CLI, stops it
 * before it opens any database, with exit code 2, exactly one line on stderr naming the variable
 * at fault, and nothing on stdout. A good configuration with the same variables still runs.
 */
import { assert, describe, it } from "@effect/vitest"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { runCli } from "../support/cli.ts"

interface Case {
  readonly name: string
  readonly env: Record<string, string>
  readonly variable: string
  readonly command?: ReadonlyArray<string>
}

const cases: ReadonlyArray<Case> = [
  {
    name: "cron that never fires",
    env: { SWEEPER_CRON_DROP_CANCELING_BUILDS: "0 0 31 2 *" },
    variable: "SWEEPER_CRON_DROP_CANCELING_BUILDS"
  },
  {
    name: "cron that never fires, refused by start too",
    env: { SWEEPER_CRON_CONCURRENCY_LIMIT_RESUME: "0 0 30 2 *" },
    variable: "SWEEPER_CRON_CONCURRENCY_LIMIT_RESUME",
    command: ["start"]
  },
  {
    name: "cron of another batch that does not parse",
    env: { SWEEPER_CRON_STUCK_EXPORT_JOBS: "61 * * * *" },
    variable: "SWEEPER_CRON_STUCK_EXPORT_JOBS"
  },
  {
    name: "empty cron (no silent default)",
    env: { SWEEPER_CRON_STUCK_EXPORT_JOBS: "" },
    variable: "SWEEPER_CRON_STUCK_EXPORT_JOBS"
  },
  {
    name: "lease TTL of 0 seconds",
    env: { SWEEPER_LEASE_TTL_DROP_CANCELING_BUILDS: "0 seconds" },
    variable: "SWEEPER_LEASE_TTL_DROP_CANCELING_BUILDS"
  },
  {
    name: "empty lease TTL",
    env: { SWEEPER_LEASE_TTL_DROP_CANCELING_BUILDS: "" },
    variable: "SWEEPER_LEASE_TTL_DROP_CANCELING_BUILDS"
  },
  {
    name: "lease TTL for a batch without a lease",
    env: { SWEEPER_LEASE_TTL_STUCK_EXPORT_JOBS: "90 seconds" },
    variable: "SWEEPER_LEASE_TTL_STUCK_EXPORT_JOBS"
  },
  {
    name: "unknown time zone (not blamed on a cron)",
    env: { SWEEPER_TIMEZONE: "Mars/Olympus", SWEEPER_CRON_DROP_CANCELING_BUILDS: "45 * * * *" },
    variable: "SWEEPER_TIMEZONE"
  },
  { name: "hexadecimal port", env: { SWEEPER_HTTP_PORT: "0x50" }, variable: "SWEEPER_HTTP_PORT" },
  { name: "empty port (no fall back to 9394)", env: { SWEEPER_HTTP_PORT: "" }, variable: "SWEEPER_HTTP_PORT" },
  { name: "port out of range", env: { SWEEPER_HTTP_PORT: "65536" }, variable: "SWEEPER_HTTP_PORT" },
  {
    name: "worker named \"\"",
    env: { SWEEPER_CONCURRENCY_LIMITS: `{"": {"limit": 1}}` },
    variable: "SWEEPER_CONCURRENCY_LIMITS"
  },
  {
    name: "worker that is not a class name",
    env: {
      SWEEPER_CONCURRENCY_LIMITS: `{"Releases::CreateEvidenceWorker": {"limit": 1}, "releases worker": {"limit": 1}}`
    },
    variable: "SWEEPER_CONCURRENCY_LIMITS"
  },
  {
    name: "empty queue",
    env: { SWEEPER_CONCURRENCY_LIMITS: `{"ExportWorker": {"limit": 1, "queue": ""}}` },
    variable: "SWEEPER_CONCURRENCY_LIMITS"
  },
  {
    name: "unknown disabled batch",
    env: { SWEEPER_DISABLED_BATCHES: "drop-canceling-builds,drop-cancelling-builds" },
    variable: "SWEEPER_DISABLED_BATCHES"
  },
  { name: "empty API token (not \"disabled\")", env: { SWEEPER_API_TOKEN: "" }, variable: "SWEEPER_API_TOKEN" },
  { name: "empty DATABASE_URL (not \"embedded\")", env: { DATABASE_URL: "" }, variable: "DATABASE_URL" },
  { name: "empty log level", env: { SWEEPER_LOG_LEVEL: "" }, variable: "SWEEPER_LOG_LEVEL" },
  {
    name: "log format that is neither json nor text",
    env: { SWEEPER_LOG_FORMAT: "pretty" },
    variable: "SWEEPER_LOG_FORMAT"
  },
  {
    name: "event retention under a day",
    env: { SWEEPER_EVENT_RETENTION: "23 hours" },
    variable: "SWEEPER_EVENT_RETENTION"
  },
  {
    name: "event retention that is no duration",
    env: { SWEEPER_EVENT_RETENTION: "forever" },
    variable: "SWEEPER_EVENT_RETENTION"
  },
  { name: "empty event retention", env: { SWEEPER_EVENT_RETENTION: "" }, variable: "SWEEPER_EVENT_RETENTION" },
  {
    name: "cron of prune-events that does not parse",
    env: { SWEEPER_CRON_PRUNE_EVENTS: "17 3 * *" },
    variable: "SWEEPER_CRON_PRUNE_EVENTS"
  }
]

/** Each process gets its own embedded data directory: a value wrongly accepted runs for real and exits 0. */
const withDataDir = async <A>(f: (dir: string) => Promise<A>) => {
  const dir = mkdtempSync(join(tmpdir(), "sweeper-config-"))
  try {
    return await f(dir)
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}

describe("configuration is validated at the edge (real CLI)", () => {
  it.concurrent.each(cases)("$name → exit 2, one line naming $variable", async ({ env, variable, command }) => {
    const result = await withDataDir((dir) =>
      runCli(command ?? ["run", "drop-canceling-builds", "--dry-run"], {
        SWEEPER_DATA_DIR: dir,
        SWEEPER_HTTP_PORT: "0",
        ...env
      })
    )
    assert.strictEqual(result.code, 2, result.stderr)
    const lines = result.stderr.split("\n").filter((line) => line.trim().length > 0)
    assert.lengthOf(lines, 1, result.stderr)
    assert.match(lines[0]!, new RegExp(`^sweeper: invalid configuration: ${variable}(=".*")?: `))
    assert.strictEqual(result.stdout, "")
  })

  it("the same variables with good values run (0 0 29 2 * fires every 4 years; zones, offsets, class names)", async () => {
    const result = await withDataDir((dir) =>
      runCli(["run", "drop-canceling-builds", "--dry-run", "--json"], {
        SWEEPER_DATA_DIR: dir,
        SWEEPER_CRON_DROP_CANCELING_BUILDS: "0 0 29 2 *",
        SWEEPER_CRON_STUCK_EXPORT_JOBS: "*/2 * * * * *",
        SWEEPER_TIMEZONE: "Europe/Berlin",
        SWEEPER_LEASE_TTL_DROP_CANCELING_BUILDS: "1 second",
        SWEEPER_HTTP_PORT: "8080",
        SWEEPER_CONCURRENCY_LIMITS:
          `{"Releases::CreateEvidenceWorker": {"limit": 5, "queue": "default"}, "Ci::Build_Worker2": {"limit": 0}}`,
        SWEEPER_DISABLED_BATCHES: "stuck-export-jobs, concurrency-limit-resume",
        SWEEPER_LOG_LEVEL: "Warn",
        SWEEPER_EVENT_RETENTION: "1 day"
      })
    )
    assert.strictEqual(result.code, 0, result.stderr)
    assert.strictEqual(JSON.parse(result.stdout).outcome, "succeeded")
  })
})
