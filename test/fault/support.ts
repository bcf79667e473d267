/**
 * The fault suite's tools: the real CLI as a child process (`sweeper run <batch> --json`) on the
 * test's PostgreSQL database and Redis db, killed with SIGKILL at seeded random points once it has
 * started repairing, and the probes the checks need. Figures (kills, records, events) are printed
 * so a CI log shows what each test exercised.
 */
import { PgClient } from "@effect/sql-pg"
import { assert } from "@effect/vitest"
import { Effect } from "effect"
import type { ChildProcess } from "node:child_process"
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { PENDING_DIRECT_UPLOADS_KEY } from "../../src/domain/DirectUpload.ts"
import { leaseKey } from "../../src/domain/Lease.ts"
import { Redis } from "../../src/layers/redis/Redis.ts"
import { runCli } from "../support/cli.ts"
import { seeded } from "../support/prng.ts"
import { startSweeper } from "../support/processes.ts"

export interface RunOutput {
  readonly batch: string
  readonly runId: string
  readonly outcome: string
  readonly summary: unknown
}

/** One `sweeper run <batch> --json` to its end; its single JSON line and exit code. */
export const runToEnd = (batch: string, env: Record<string, string>, ...extra: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const result = yield* Effect.promise(() => runCli(["run", batch, "--json", ...extra], env, 120_000))
    const lines = result.stdout.split("\n").filter((line) => line.length > 0)
    assert.lengthOf(lines, 1, `${result.stderr}\n${result.stdout}`)
    return { code: result.code, output: JSON.parse(lines[0]!) as RunOutput, stderr: result.stderr }
  })

/** How many events of `type` the event log holds. */
export const countEvents = (type: string) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const rows = yield* sql<{ n: string }>`SELECT count(*) AS n FROM sweeper_events WHERE type = ${type}`
    return Number(rows[0]!.n)
  })

/** Per stream: how many events of `type` it has. */
export const eventsPerStream = (type: string) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const rows = yield* sql<{ stream: string; n: string }>`
      SELECT stream, count(*) AS n FROM sweeper_events WHERE type = ${type} GROUP BY stream`
    return new Map(rows.map((row) => [row.stream, Number(row.n)]))
  })

export const deleteLease = (name: string) =>
  Effect.flatMap(Redis, (redis) => redis.use("test.del", (client) => client.del(leaseKey(name))))

/** Polls until the child has recorded a repair beyond `before` ("repairing") or has exited. */
const untilRepairing = <E, R>(child: ChildProcess, repairs: Effect.Effect<number, E, R>, before: number) =>
  Effect.gen(function*() {
    const deadline = Date.now() + 60_000
    while (Date.now() < deadline) {
      if (child.exitCode !== null || child.signalCode !== null) return "exited"
      if ((yield* repairs) > before) return "repairing"
      yield* Effect.sleep("10 millis")
    }
    return "timed out"
  })

export interface KillReport {
  /** Repair events recorded when each SIGKILL was sent. */
  readonly repairsAtKill: ReadonlyArray<number>
  /** How many repairs of its own each attempt was let make before the kill (the seeded target). */
  readonly targets: ReadonlyArray<number>
}

/**
 * Starts `sweeper run <batch>` `kills` times and SIGKILLs it each time at a seeded random point:
 * once that attempt has recorded a random number (1 to `maxRepairs`) of repair events, plus a
 * random 0–`jitterMs` ms so the kill lands anywhere inside a repair. Counting repairs rather than
 * milliseconds keeps the kills mid-run on an idle machine and on a loaded one alike. A killed
 * holder's lease would expire at its TTL; `lease` deletes it instead, so the next attempt need not
 * wait.
 */
export const killRepeatedly = (options: {
  readonly batch: string
  readonly env: Record<string, string>
  readonly repairEvent: string
  readonly kills: number
  readonly seed: number
  readonly maxRepairs: number
  readonly jitterMs: number
  readonly lease?: string
}) =>
  Effect.gen(function*() {
    const random = seeded(options.seed)
    const repairsAtKill: Array<number> = []
    const targets: Array<number> = []
    const repairs = countEvents(options.repairEvent)
    for (let kill = 0; kill < options.kills; kill++) {
      const before = yield* repairs
      const target = 1 + Math.floor(random() * options.maxRepairs)
      const jitter = Math.floor(random() * options.jitterMs)
      targets.push(target)
      const child = startSweeper(`fault-${kill}`, options.env, ["run", options.batch, "--json"])
      child.listening.catch(() => {})
      const started = yield* untilRepairing(child.child, repairs, before + target - 1)
      assert.strictEqual(
        started,
        "repairing",
        `kill ${kill}: the run ended before it could be killed (make the data larger)\n${child.output()}`
      )
      yield* Effect.sleep(jitter)
      assert.isNull(
        child.child.exitCode,
        `kill ${kill}: the run ended before the kill (make the data larger)\n${child.output()}`
      )
      child.child.kill("SIGKILL")
      const how = yield* Effect.promise(() => child.exited)
      assert.strictEqual(how, "SIGKILL")
      repairsAtKill.push(yield* repairs)
      if (options.lease !== undefined) yield* deleteLease(options.lease)
    }
    return { repairsAtKill, targets } satisfies KillReport
  })

/** Starts `sweeper run <batch> --json` in the background; `result` parses its JSON line once it exits. */
export const startRun = (name: string, batch: string, env: Record<string, string>) => {
  const process = startSweeper(name, env, ["run", batch, "--json"])
  process.listening.catch(() => {})
  const result = Effect.promise(() => process.exited).pipe(Effect.map((code) => {
    const line = process.output().split("\n").find((l) => l.startsWith("{\"batch\""))
    assert.isDefined(line, `${name} printed no result (exit ${code}):\n${process.output()}`)
    return { code, output: JSON.parse(line!) as RunOutput, log: process.output() }
  }))
  return { process, result }
}

/** Waits until the event log holds more than `before` events of `type` (polls every 20 ms). */
export const untilEvents = (type: string, before: number, timeoutMs = 60_000) =>
  Effect.gen(function*() {
    const deadline = Date.now() + timeoutMs
    while ((yield* countEvents(type)) <= before) {
      if (Date.now() > deadline) return yield* Effect.die(new Error(`timed out waiting for a ${type} event`))
      yield* Effect.sleep("10 millis")
    }
  })

/**
 * `count` uploads abandoned 4 h ago: `artifacts:u/<i>` in pending_direct_uploads, each with its
 * half-written object `u/<i>` under a temporary local store `root` (removed with the scope). Point
 * the CLI at it with `SWEEPER_OBJECT_STORAGE: JSON.stringify({ artifacts: root })`.
 */
export const seedStaleUploads = (count: number) =>
  Effect.gen(function*() {
    const root = yield* Effect.acquireRelease(
      Effect.promise(() => mkdtemp(join(tmpdir(), "sweeper-fault-objects-"))),
      (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true }))
    )
    yield* Effect.promise(() => mkdir(join(root, "u"), { recursive: true }))
    const stale = String(Math.floor(Date.now() / 1000) - 4 * 3600)
    const entries: Record<string, string> = {}
    for (let i = 0; i < count; i++) {
      entries[`artifacts:u/${i}`] = stale
      yield* Effect.promise(() => writeFile(join(root, `u/${i}`), "half an upload"))
    }
    yield* Effect.flatMap(Redis, (redis) =>
      redis.use("test.hset", (client) => client.hset(PENDING_DIRECT_UPLOADS_KEY, entries)))
    return { root, entries }
  })
