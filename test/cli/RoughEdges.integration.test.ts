/**
 * What a new user meets first, tried through the real CLI as they would try it: help texts that say
 * what is true, one-line errors that name the value given and what was expected, logs that do not
 * cry wolf.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { existsSync, rmSync } from "node:fs"
import { type AddressInfo, createServer, type Server } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { SHADOW_BATCHES } from "../../src/domain/Shadow.ts"
import { batches } from "../../src/programs/index.ts"
import { runCli } from "../support/cli.ts"

// A fresh embedded store takes a while to open on a busy machine.
const cli = (args: ReadonlyArray<string>, env: Record<string, string> = {}) =>
  Effect.promise(() => runCli(args, env, 150_000))

describe("a new user's first commands", () => {
  it.live("`demo --help` counts the batches the registry has", () =>
    Effect.gen(function*() {
      const help = yield* cli(["demo", "--help"])
      assert.strictEqual(help.code, 0, help.stderr)
      assert.include(help.stdout, `watch its ${batches.length} batches repair`)
      // --shadow names every batch it puts in shadow mode: each one whose GitLab worker the simulator plays.
      for (const batch of SHADOW_BATCHES) assert.include(help.stdout, batch)
    }))

  it.live("prune-events describes itself in a sentence that parses", () =>
    Effect.gen(function*() {
      const help = yield* cli(["events", "prune", "--help"])
      assert.strictEqual(help.code, 0, help.stderr)
      assert.include(help.stdout, "keeping the events each batch's state is folded from")
    }))

  it.live("`events --help` shows its subcommand as optional; `sweeper help [command]` is the help", () =>
    Effect.gen(function*() {
      const events = yield* cli(["events", "--help"])
      assert.include(events.stdout, "sweeper events [<subcommand>] [flags]")
      const help = yield* cli(["help"])
      assert.strictEqual(help.code, 0, help.stderr)
      assert.include(help.stdout, "sweeper <subcommand> [flags]")
      const run = yield* cli(["help", "run"])
      assert.strictEqual(run.code, 0, run.stderr)
      assert.include(run.stdout, "sweeper run [flags] <batch>")
    }))

  it.live("configuration and flag errors share one shape: what, the value given, what is expected", () =>
    Effect.gen(function*() {
      const firstLine = (args: ReadonlyArray<string>, env: Record<string, string> = {}) =>
        Effect.map(cli(args, env), (result) => {
          assert.strictEqual(result.code, 2, result.stderr)
          return result.stderr.trim().split("\n")[0]!
        })
      const [redisUrl, port, now, limit] = yield* Effect.all([
        firstLine(["status"], { DATABASE_URL: "postgres://postgres@127.0.0.1:1/nowhere", REDIS_URL: "garbage" }),
        firstLine(["status"], { SWEEPER_HTTP_PORT: "abc" }),
        firstLine(["run", "drop-canceling-builds", "--dry-run", "--now", "yesterday"]),
        firstLine(["events", "--limit", "0"])
      ], { concurrency: "unbounded" })
      assert.strictEqual(
        redisUrl,
        "sweeper: invalid configuration: REDIS_URL=\"garbage\": expected a redis:// or rediss:// URL (a comma list of them for a cluster)"
      )
      assert.strictEqual(
        port,
        "sweeper: invalid configuration: SWEEPER_HTTP_PORT=\"abc\": expected a decimal port number 0-65535"
      )
      assert.strictEqual(
        now,
        "sweeper: invalid flag: --now=\"yesterday\": expected an ISO-8601 instant (2026-01-01T05:00:00Z) or a duration ago (1h, 30m, 7d) (see: sweeper run --help)"
      )
      assert.strictEqual(
        limit,
        "sweeper: invalid flag: --limit=\"0\": expected a whole number from 1 to 1000 (see: sweeper events --help)"
      )
    }))

  it.live("a command that only reads, pointed at a mistyped SWEEPER_DATA_DIR, creates nothing and says so (exit 3)", () =>
    Effect.gen(function*() {
      const typo = join(tmpdir(), `sweeper-typo-${process.pid}`, "sweper")
      for (const args of [["status"], ["events"]]) {
        const result = yield* cli(args, { SWEEPER_DATA_DIR: typo })
        assert.strictEqual(result.code, 3, result.stderr)
        assert.strictEqual(result.stdout, "")
        assert.match(result.stderr.trim(), new RegExp(`^sweeper: no Sweeper data in ${typo} \\(SWEEPER_DATA_DIR\\)`))
        assert.isFalse(existsSync(typo), `${args.join(" ")} created ${typo}`)
      }
    }))

  it.live("a taken HTTP port is one line naming the address and SWEEPER_HTTP_PORT, exit 2, before anything migrates", () =>
    Effect.acquireUseRelease(
      Effect.callback<Server>((resume) => {
        const holder = createServer()
        holder.listen({ host: "127.0.0.1", port: 0 }, () => resume(Effect.succeed(holder)))
      }),
      (holder) =>
        Effect.gen(function*() {
          const port = (holder.address() as AddressInfo).port
          const dataDir = join(tmpdir(), `sweeper-port-${process.pid}`)
          for (const command of ["start", "demo"]) {
            const result = yield* cli([command], { SWEEPER_DATA_DIR: dataDir, SWEEPER_HTTP_PORT: String(port) })
            assert.strictEqual(result.code, 2, result.stderr)
            const errors = result.stderr.split("\n").filter((line) => line.startsWith("sweeper:"))
            assert.deepStrictEqual(errors, [
              `sweeper: 127.0.0.1:${port} is already in use (SWEEPER_HTTP_PORT=${port}): stop what listens there, or set SWEEPER_HTTP_PORT to a free port (0: any free one)`
            ], result.stderr)
            assert.notInclude(result.stderr, "ServeError")
            assert.notInclude(result.stderr, "Migration")
          }
          assert.isFalse(existsSync(join(dataDir, "pgdata")), "start opened (and migrated) its database first")
        }),
      (holder) =>
        Effect.callback<void>((resume) => {
          holder.close(() => resume(Effect.void))
        })
    ))

  it.live(
    "a dry run's counts say what it would do, the main count first; instants are written as in the console",
    () =>
      Effect.gen(function*() {
        const dataDir = join(tmpdir(), `sweeper-dry-${process.pid}`)
        const dry = yield* cli(["run", "drop-canceling-builds", "--dry-run"], { SWEEPER_DATA_DIR: dataDir })
        assert.strictEqual(dry.code, 0, dry.stderr)
        assert.match(dry.stdout, /^drop-canceling-builds \(dry run\) succeeded: would drop 0, would doom 0, /)
        // Instants as the console writes them (views/Time.ts), always with seconds.
        const events = yield* cli(["events", "--limit", "1"], { SWEEPER_DATA_DIR: dataDir })
        assert.match(events.stdout, /^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} UTC batch:drop-canceling-builds RunFinished /)
        const status = yield* cli(["status"], { SWEEPER_DATA_DIR: dataDir })
        assert.match(status.stdout, /drop-canceling-builds .* \d{4}-\d{2}-\d{2} \d{2}:\d{2}:00 UTC /)
        rmSync(dataDir, { recursive: true, force: true })
      }),
    450_000
  )
})
