/**
 * The in-memory Redis exists only for the all-embedded default. One side configured
 * without the other (or a store URL that cannot be a server or a cluster) is a one-line exit 2,
 * before any connection is tried (the URLs below point nowhere).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { runCli } from "../support/cli.ts"

const DB = "postgres://postgres@127.0.0.1:1/nowhere"
const REDIS = "redis://127.0.0.1:1"

const cases: ReadonlyArray<readonly [string, Record<string, string>, RegExp]> = [
  ["DATABASE_URL without REDIS_URL", { DATABASE_URL: DB }, /REDIS_URL: DATABASE_URL is set but REDIS_URL is not/],
  ["REDIS_URL without DATABASE_URL", { REDIS_URL: REDIS }, /DATABASE_URL: REDIS_URL is set but DATABASE_URL is not/],
  [
    "a store URL without DATABASE_URL",
    { REDIS_QUEUES_URL: REDIS },
    /DATABASE_URL: REDIS_\*_URL is set but DATABASE_URL is not/
  ],
  [
    "one store URL, no REDIS_URL for the others",
    { DATABASE_URL: DB, REDIS_QUEUES_URL: REDIS },
    /REDIS_SHARED_STATE_URL: neither REDIS_SHARED_STATE_URL nor REDIS_URL is set/
  ],
  ["a cluster URL naming a database", {
    DATABASE_URL: DB,
    REDIS_URL: REDIS,
    REDIS_QUEUES_URL: "redis://127.0.0.1:1/3,redis://127.0.0.1:2"
  }, /REDIS_QUEUES_URL="[^"]*": a Redis Cluster has only database 0/]
]

describe("half-embedded configuration", () => {
  // One CLI start costs seconds: the cases run side by side, each asserted under its own label.
  it.live(`each case exits 2 with one line: ${cases.map(([label]) => label).join("; ")}`, () =>
    Effect.forEach(
      cases,
      ([label, env, message]) =>
        Effect.promise(() => runCli(["status"], env)).pipe(Effect.map((result) => {
          assert.strictEqual(result.code, 2, `${label}: ${result.stderr}${result.stdout}`)
          const lines = result.stderr.trim().split("\n")
          assert.lengthOf(lines, 1, `${label}: ${result.stderr}`)
          assert.match(lines[0]!, /^sweeper: invalid configuration: /, label)
          assert.match(lines[0]!, message, label)
        })),
      { concurrency: "unbounded", discard: true }
    ))
})
