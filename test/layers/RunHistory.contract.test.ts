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
import { HISTORY_MAX_RUNS, RunHistory } from "../../src/services/RunHistory.ts"
import { at } from "../support/clock.ts"
import { PgTest } from "../support/postgres.ts"

/**
 * A finished run of `batch` at `finishedAt` with `repairs` builds dropped (every 5th doomed), appended
 * in pages of 40; its RunFinished says it repaired `repaired` items (by default one per event).
 */
const run = (
  batch: string,
  finishedAt: string,
  repairs: number,
  firstId: number,
  options: { readonly repaired?: number; readonly dryRun?: boolean; readonly pipelineOf?: (id: number) => number } = {}
) =>
  Effect.gen(function*() {
    const log = yield* EventLog
    const runId = randomUUID()
    const events = Array.from({ length: repairs }, (_, i) => {
      const id = firstId + i
      return i % 5 === 4
        ? new BuildDoomed({ id, project_id: 1, runner_id: null, failure_reason: 12 })
        : new BuildDropped({
          id,
          project_id: 1,
          runner_id: null,
          ...(options.pipelineOf === undefined ? {} : { pipeline_id: options.pipelineOf(id) }),
          failure_reason: 3
        })
    })
    yield* Effect.gen(function*() {
      yield* log.append(
        new RunStarted({
          batch,
          run_id: runId,
          scheduled_at: null,
          node: "n1",
          trigger: "schedule",
          dryRun: options.dryRun === true
        })
      )
      for (let i = 0; i < events.length; i += 40) yield* log.appendAll(events.slice(i, i + 40))
      yield* log.append(
        new RunFinished({
          batch,
          outcome: "succeeded",
          summary: { dropped: repairs },
          duration_ms: 250,
          dryRun: options.dryRun === true,
          repaired: options.repaired ?? repairs
        })
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
    "a run's pipelines: those of the builds it dropped, distinct, smallest first, one more than the page lists",
    Effect.gen(function*() {
      const history = yield* RunHistory
      const few = yield* run("drop-running-builds", "2026-11-24T09:00:00Z", 12, 9000, {
        pipelineOf: (id) => 700 - (id % 3)
      })
      assert.deepStrictEqual((yield* history.run(few))!.pipelines, [698, 699, 700])
      const none = yield* run("drop-running-builds", "2026-11-24T09:10:00Z", 3, 9100)
      assert.deepStrictEqual((yield* history.run(none))!.pipelines, [])
      const many = yield* run("drop-running-builds", "2026-11-24T09:20:00Z", 150, 9200, { pipelineOf: (id) => id })
      const listed = (yield* history.run(many))!.pipelines
      assert.lengthOf(listed, 101)
      assert.strictEqual(listed[0], 9200)
    })
  )

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

  test(
    "repairs are the items a run repaired, not its events; dry runs are marked and left out of bucket totals",
    Effect.gen(function*() {
      const history = yield* RunHistory
      // A resume run that moved 5 000 jobs in 2 events, a prune of 12 000 events in 3 pages.
      const moved = yield* run("concurrency-limit-resume", "2026-11-24T00:10:00Z", 2, 1, { repaired: 5000 })
      const dry = yield* run("concurrency-limit-resume", "2026-11-24T00:20:00Z", 4, 10, { repaired: 40, dryRun: true })
      const later = yield* run("concurrency-limit-resume", "2026-11-24T07:00:00Z", 3, 20, { repaired: 12_000 })
      assert.strictEqual((yield* history.run(moved))!.repairs, 5000)
      const points = yield* history.history("concurrency-limit-resume", new Date("2026-11-01T00:00:00Z"))
      assert.deepStrictEqual(points.map((p) => [p.runId, p.repairs, p.dryRun]), [
        [moved, 5000, false],
        [dry, 40, true],
        [later, 12_000, false]
      ])
      const buckets = yield* history.buckets("concurrency-limit-resume", new Date("2026-11-01T00:00:00Z"), 6 * 3600_000)
      assert.deepStrictEqual(
        buckets.map((b) => [b.start.toISOString(), b.runs, b.dryRuns, b.succeeded, b.repairs, b.durationMsMax]),
        [
          ["2026-11-24T00:00:00.000Z", 2, 1, 1, 5000, 250],
          ["2026-11-24T06:00:00.000Z", 1, 0, 1, 12_000, 250]
        ]
      )
    })
  )

  test(
    "buckets fold every run of the window: none left out past HISTORY_MAX_RUNS",
    Effect.gen(function*() {
      const history = yield* RunHistory
      const log = yield* EventLog
      // 2 500 one-repair runs of an every-minute batch, RunStarted and RunFinished only.
      for (let i = 0; i < 2500; i++) {
        const runId = randomUUID()
        const finishedAt = new Date(Date.parse("2026-11-20T00:00:00Z") + i * 60_000).toISOString()
        yield* Effect.gen(function*() {
          yield* log.append(
            new RunStarted({
              batch: "b",
              run_id: runId,
              scheduled_at: null,
              node: "n",
              trigger: "schedule",
              dryRun: false
            })
          )
          yield* log.append(
            new RunFinished({
              batch: "b",
              outcome: "succeeded",
              summary: {},
              duration_ms: 1,
              dryRun: false,
              repaired: 1
            })
          )
        }).pipe(
          Effect.provideService(CurrentRun, {
            runId,
            batch: "b",
            dryRun: false,
            budget: Option.none(),
            fence: Option.none()
          }),
          at(finishedAt)
        )
      }
      const since = new Date("2026-11-01T00:00:00Z")
      assert.lengthOf(yield* history.history("b", since), HISTORY_MAX_RUNS)
      const buckets = yield* history.buckets("b", since, 24 * 3600_000)
      assert.strictEqual(buckets.reduce((n, b) => n + b.runs, 0), 2500)
      assert.strictEqual(buckets.reduce((n, b) => n + b.repairs, 0), 2500)
      assert.deepStrictEqual(buckets.map((b) => b.runs), [1440, 1060])
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
