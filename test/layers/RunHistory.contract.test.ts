/**
 * One contract for both RunHistory implementations: RunHistoryMemory over the memory event log and
 * RunHistorySql (its rollup kept by the trigger) on real PostgreSQL. Events are appended through
 * EventLog under CurrentRun, as the run guard and the programs append them.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it, layer } from "@effect/vitest"
import { Effect, Layer, Option } from "effect"
import { randomUUID } from "node:crypto"
import { CurrentRun } from "../../src/domain/Batch.ts"
import { BuildDoomed, BuildDropped, RunFinished, RunStarted } from "../../src/domain/Events.ts"
import { EventLogMemory } from "../../src/layers/memory/EventLogMemory.ts"
import { RunHistoryMemory } from "../../src/layers/memory/RunHistoryMemory.ts"
import { EventLogSql } from "../../src/layers/postgres/EventLogSql.ts"
import { RunHistorySql } from "../../src/layers/postgres/RunHistorySql.ts"
import { EventLog } from "../../src/services/EventLog.ts"
import { RunHistory } from "../../src/services/RunHistory.ts"
import { at } from "../support/clock.ts"
import { PgTest } from "../support/postgres.ts"

/** A finished run of `batch` at `finishedAt` with `repairs` builds dropped (every 5th doomed), appended in pages of 40. */
const run = (batch: string, finishedAt: string, repairs: number, firstId: number) =>
  Effect.gen(function*() {
    const log = yield* EventLog
    const runId = randomUUID()
    const events = Array.from({ length: repairs }, (_, i) => {
      const id = firstId + i
      return i % 5 === 4
        ? new BuildDoomed({ id, project_id: 1, runner_id: null, failure_reason: 12 })
        : new BuildDropped({ id, project_id: 1, runner_id: null, failure_reason: 3 })
    })
    yield* Effect.gen(function*() {
      yield* log.append(
        new RunStarted({ batch, run_id: runId, scheduled_at: null, node: "n1", trigger: "schedule", dryRun: false })
      )
      for (let i = 0; i < events.length; i += 40) yield* log.appendAll(events.slice(i, i + 40))
      yield* log.append(
        new RunFinished({ batch, outcome: "succeeded", summary: { dropped: repairs }, duration_ms: 250, dryRun: false })
      )
    }).pipe(
      Effect.provideService(CurrentRun, { runId, batch, dryRun: false, budget: Option.none(), fence: Option.none() }),
      at(finishedAt)
    )
    return runId
  })

type Register = (name: string, body: Effect.Effect<void, unknown, EventLog | RunHistory>) => void

const contract = (test: Register) => {
  test(
    "a run: its header, repairs paged by keyset and by type, exactly its own",
    Effect.gen(function*() {
      const history = yield* RunHistory
      const big = yield* run("drop-canceling-builds", "2026-11-24T10:00:00Z", 250, 1000)
      const other = yield* run("drop-canceling-builds", "2026-11-24T11:00:00Z", 7, 5000)
      const detail = yield* history.run(big)
      assert.deepInclude(detail!, {
        batch: "drop-canceling-builds",
        trigger: "schedule",
        node: "n1",
        outcome: "succeeded",
        durationMs: 250,
        repairs: 250
      })
      assert.deepStrictEqual(detail!.finishedAt, new Date("2026-11-24T10:00:00Z"))
      assert.isNull(yield* history.run(randomUUID()))

      const ids: Array<string> = []
      let after: number | undefined = undefined
      for (;;) {
        const page: Effect.Success<ReturnType<typeof history.repairs>> = yield* history.repairs(big, {
          after,
          limit: 100
        })
        ids.push(...page.events.map((e) => e.stream))
        if (page.next === null) break
        after = page.next
      }
      assert.deepStrictEqual(ids, Array.from({ length: 250 }, (_, i) => `build:${1000 + i}`))

      const doomed = yield* history.repairs(big, { type: "BuildDoomed", limit: 100 })
      assert.lengthOf(doomed.events, 50)
      assert.isNull(doomed.next)
      assert.strictEqual((yield* history.run(other))!.repairs, 7)
    })
  )

  test(
    "history: the batch's runs finished since, oldest first, with their repairs",
    Effect.gen(function*() {
      const history = yield* RunHistory
      const a = yield* run("stuck-export-jobs", "2026-11-20T00:00:00Z", 1, 1)
      const b = yield* run("stuck-export-jobs", "2026-11-24T00:00:00Z", 3, 10)
      yield* run("drop-canceling-builds", "2026-11-24T00:00:00Z", 2, 20)
      const all = yield* history.history("stuck-export-jobs", new Date("2026-11-01T00:00:00Z"))
      assert.deepStrictEqual(all.map((p) => [p.runId, p.repairs, p.outcome, p.durationMs]), [[a, 1, "succeeded", 250], [
        b,
        3,
        "succeeded",
        250
      ]])
      const recent = yield* history.history("stuck-export-jobs", new Date("2026-11-23T00:00:00Z"))
      assert.deepStrictEqual(recent.map((p) => p.runId), [b])
    })
  )
}

const Memory = RunHistoryMemory.pipe(Layer.provideMerge(EventLogMemory))
const Sql = Layer.mergeAll(RunHistorySql, EventLogSql).pipe(Layer.provideMerge(PgTest))
const reset = Effect.flatMap(PgClient.PgClient, (sql) => sql`TRUNCATE sweeper_events, sweeper_runs RESTART IDENTITY`)

describe("RunHistory contract", () => {
  describe("RunHistoryMemory", () => {
    contract((name, body) => it.effect(name, () => Effect.provide(body, Memory)))
  })
  layer(Sql, { excludeTestServices: true })("RunHistorySql (real PostgreSQL)", (it) => {
    contract((name, body) => it.effect(name, () => Effect.andThen(reset, body)))
  })
})
