/**
 * One contract for both EventLog implementations: EventLogMemory and EventLogSql on a real
 * PostgreSQL (a fresh migrated database per test). Timestamps come from a frozen Clock, run ids from
 * CurrentRun, exactly as the run guard provides them.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it, layer } from "@effect/vitest"
import { Effect, Layer, Option, Schema } from "effect"
import { randomUUID } from "node:crypto"
import { CurrentRun, type RunInfo } from "../../src/domain/Batch.ts"
import {
  BuildDropped,
  type DomainEvent,
  RunFinished,
  RunStarted,
  StaleDirectUploadDeleted
} from "../../src/domain/Events.ts"
import { EventLogMemory } from "../../src/layers/memory/EventLogMemory.ts"
import { EventLogSql } from "../../src/layers/postgres/EventLogSql.ts"
import { EventLog } from "../../src/services/EventLog.ts"
import { at } from "../support/clock.ts"
import { PgTest } from "../support/postgres.ts"

class Boom extends Schema.TaggedError<Boom>()("Boom", { message: Schema.String }) {}

const runInfo = (runId: string): RunInfo => ({
  runId,
  batch: "contract",
  dryRun: false,
  budget: Option.none(),
  fence: Option.none()
})

const inRun = (runId: string) => <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.provideService(effect, CurrentRun, runInfo(runId))

const append = (event: DomainEvent) => Effect.flatMap(EventLog, (log) => log.append(event))

const dropped = (id: number) =>
  new BuildDropped({ id, project_id: 10 + id, runner_id: id % 2 === 0 ? null : 7, failure_reason: 3 })
const started = (batch: string, runId: string) =>
  new RunStarted({ batch, run_id: runId, scheduled_at: null, node: "n1", trigger: "manual", dryRun: false })

/** Registers one contract test; the implementation supplies EventLog (and a clean store). */
type Register = (name: string, body: Effect.Effect<void, unknown, EventLog>) => void

const eventLogContract = (test: Register) => {
  test(
    "append stores stream, type, data, run id from CurrentRun and occurred_at from the Clock",
    Effect.gen(function*() {
      const log = yield* EventLog
      const runId = randomUUID()
      yield* append(dropped(41)).pipe(inRun(runId), at("2026-01-01T05:00:00.123Z"))
      const found = yield* log.query({})
      assert.lengthOf(found, 1)
      const event = found[0]!
      assert.strictEqual(event.stream, "build:41")
      assert.strictEqual(event.type, "BuildDropped")
      assert.deepStrictEqual(event.data, { id: 41, project_id: 51, runner_id: 7, failure_reason: 3 })
      assert.strictEqual(event.runId, runId)
      assert.instanceOf(event.occurredAt, Date)
      assert.strictEqual(event.occurredAt.toISOString(), "2026-01-01T05:00:00.123Z")
      assert.isNumber(event.id)
    })
  )

  test(
    "data round-trips nested JSON (summary objects, arrays, nulls, unicode); absent optional keys stay absent",
    Effect.gen(function*() {
      const log = yield* EventLog
      const summary = {
        dropped: 250,
        nested: { list: [1, "two", null, true], empty: {} },
        text: "ünïcødé \"quoted\" \\ 💥"
      }
      yield* append(new RunFinished({ batch: "b", outcome: "succeeded", summary, duration_ms: 1234.5, dryRun: false }))
      yield* append(
        new RunFinished({
          batch: "b",
          outcome: "failed",
          summary: null,
          duration_ms: 0,
          dryRun: true,
          error: "Error: x"
        })
      )
      const [ok, failed] = yield* log.query({ stream: "batch:b" })
      assert.deepStrictEqual(ok!.data, {
        batch: "b",
        outcome: "succeeded",
        summary,
        duration_ms: 1234.5,
        dryRun: false
      })
      assert.isFalse(Object.hasOwn(ok!.data, "error"))
      assert.deepStrictEqual(failed!.data, {
        batch: "b",
        outcome: "failed",
        summary: null,
        duration_ms: 0,
        dryRun: true,
        error: "Error: x"
      })
      assert.isNull(ok!.runId)
    })
  )

  test(
    "appendAll keeps the batch's order and every byte of streams and payloads an array literal would quote",
    Effect.gen(function*() {
      const log = yield* EventLog
      const runId = randomUUID()
      const paths = ["NULL", "", "a,b", "{x}", "q\"uote", "back\\slash", "line\nbreak", " spaced ", "ünï 💥", "'"]
      const batch = paths.map((path, i) =>
        new StaleDirectUploadDeleted({ location: "uploads", path, preparedAt: i === 0 ? 1.5 : i })
      )
      yield* log.appendAll(batch).pipe(inRun(runId), at("2026-01-01T05:00:00.123Z"))
      const found = yield* log.query({})
      assert.deepStrictEqual(found.map((e) => e.stream), paths.map((path) => `direct_upload:uploads:${path}`))
      assert.deepStrictEqual(
        found.map((e) => e.data),
        paths.map((path, i) => ({ location: "uploads", path, preparedAt: i === 0 ? 1.5 : i }))
      )
      assert.isTrue(found.every((e) => e.runId === runId && e.type === "StaleDirectUploadDeleted"))
      assert.isTrue(found.every((e) => e.occurredAt.toISOString() === "2026-01-01T05:00:00.123Z"))
      assert.isTrue(found.every((e, i) => i === 0 || e.id > found[i - 1]!.id))
    })
  )

  test(
    "streams follow streamOf for every kind of event",
    Effect.gen(function*() {
      const log = yield* EventLog
      yield* append(started("drop-canceling-builds", randomUUID()))
      yield* append(dropped(7))
      yield* append(new StaleDirectUploadDeleted({ location: "uploads", path: "tmp/a b", preparedAt: 1 }))
      const streams = (yield* log.query({})).map((e) => [e.stream, e.type])
      assert.deepStrictEqual(streams, [
        ["batch:drop-canceling-builds", "RunStarted"],
        ["build:7", "BuildDropped"],
        ["direct_upload:uploads:tmp/a b", "StaleDirectUploadDeleted"]
      ])
    })
  )

  test(
    "query filters: stream, streamPrefix (LIKE metacharacters literal), type, runId, since/until, order, limit",
    Effect.gen(function*() {
      const log = yield* EventLog
      const runA = randomUUID()
      const runB = randomUUID()
      yield* append(started("alpha", runA)).pipe(inRun(runA), at("2026-01-01T00:00:00Z"))
      yield* append(dropped(1)).pipe(inRun(runA), at("2026-01-01T01:00:00Z"))
      yield* append(dropped(2)).pipe(inRun(runA), at("2026-01-01T02:00:00Z"))
      yield* append(dropped(3)).pipe(inRun(runB), at("2026-01-01T03:00:00Z"))
      yield* append(new StaleDirectUploadDeleted({ location: "a_b", path: "p", preparedAt: 0 })).pipe(
        at("2026-01-01T04:00:00Z")
      )
      yield* append(new StaleDirectUploadDeleted({ location: "aXb", path: "p", preparedAt: 0 })).pipe(
        at("2026-01-01T05:00:00Z")
      )
      yield* append(new StaleDirectUploadDeleted({ location: "a%", path: "p", preparedAt: 0 })).pipe(
        at("2026-01-01T06:00:00Z")
      )

      const streams = (filter: Parameters<typeof log.query>[0]) =>
        Effect.map(log.query(filter), (es) => es.map((e) => e.stream))

      assert.deepStrictEqual(yield* streams({ stream: "build:2" }), ["build:2"])
      assert.deepStrictEqual(yield* streams({ stream: "build:" }), [])
      assert.deepStrictEqual(yield* streams({ streamPrefix: "build:" }), ["build:1", "build:2", "build:3"])
      assert.deepStrictEqual(yield* streams({ streamPrefix: "batch:" }), ["batch:alpha"])
      assert.deepStrictEqual(yield* streams({ streamPrefix: "direct_upload:a_" }), ["direct_upload:a_b:p"])
      assert.deepStrictEqual(yield* streams({ streamPrefix: "direct_upload:a%" }), ["direct_upload:a%:p"])
      assert.deepStrictEqual(yield* streams({ type: "BuildDropped" }), ["build:1", "build:2", "build:3"])
      assert.deepStrictEqual(yield* streams({ type: "Nope" }), [])
      assert.deepStrictEqual(yield* streams({ runId: runA }), ["batch:alpha", "build:1", "build:2"])
      assert.deepStrictEqual(yield* streams({ runId: runB }), ["build:3"])
      // since is inclusive, until exclusive.
      assert.deepStrictEqual(
        yield* streams({ since: new Date("2026-01-01T02:00:00Z"), until: new Date("2026-01-01T04:00:00Z") }),
        [
          "build:2",
          "build:3"
        ]
      )
      assert.deepStrictEqual(yield* streams({ since: new Date("2026-01-01T05:30:00Z") }), ["direct_upload:a%:p"])
      assert.deepStrictEqual(yield* streams({ until: new Date("2026-01-01T01:00:00Z") }), ["batch:alpha"])
      // Order and limit: newest first takes the newest N.
      assert.deepStrictEqual(yield* streams({ type: "BuildDropped", newestFirst: true }), [
        "build:3",
        "build:2",
        "build:1"
      ])
      assert.deepStrictEqual(yield* streams({ type: "BuildDropped", newestFirst: true, limit: 2 }), [
        "build:3",
        "build:2"
      ])
      assert.deepStrictEqual(yield* streams({ type: "BuildDropped", limit: 2 }), ["build:1", "build:2"])
      assert.deepStrictEqual(yield* streams({ limit: 0 }), [])
      // Filters combine.
      assert.deepStrictEqual(
        yield* streams({ streamPrefix: "build:", runId: runA, since: new Date("2026-01-01T01:30:00Z") }),
        ["build:2"]
      )
      // Ids grow in append order.
      const ids = (yield* log.query({})).map((e) => e.id)
      assert.deepStrictEqual(ids, [...ids].sort((a, b) => a - b))
      assert.strictEqual(new Set(ids).size, 7)
    })
  )

  test(
    "transaction commits its events when it succeeds",
    Effect.gen(function*() {
      const log = yield* EventLog
      const result = yield* log.transaction(Effect.gen(function*() {
        yield* append(dropped(1))
        yield* append(dropped(2))
        return "done"
      }))
      assert.strictEqual(result, "done")
      assert.deepStrictEqual((yield* log.query({})).map((e) => e.stream), ["build:1", "build:2"])
    })
  )

  test(
    "transaction rolls back the events of a failed transaction, keeping earlier ones",
    Effect.gen(function*() {
      const log = yield* EventLog
      yield* append(dropped(1))
      const error = yield* log.transaction(Effect.gen(function*() {
        yield* append(dropped(2))
        yield* append(dropped(3))
        return yield* new Boom({ message: "midway" })
      })).pipe(Effect.flip)
      assert.strictEqual((error as Boom)._tag, "Boom")
      // A defect rolls back as well.
      const exit = yield* log.transaction(append(dropped(4)).pipe(Effect.andThen(Effect.die("kaboom")))).pipe(
        Effect.exit
      )
      assert.isTrue(exit._tag === "Failure")
      yield* append(dropped(5))
      assert.deepStrictEqual((yield* log.query({})).map((e) => e.stream), ["build:1", "build:5"])
    })
  )

  test(
    "a failed inner transaction caught inside an outer one rolls back only its own events",
    Effect.gen(function*() {
      const log = yield* EventLog
      yield* log.transaction(Effect.gen(function*() {
        yield* append(dropped(10))
        yield* log.transaction(append(dropped(11)).pipe(Effect.andThen(new Boom({ message: "inner" })))).pipe(
          Effect.catchTag("Boom", () => Effect.void)
        )
        yield* append(dropped(12))
      }))
      assert.deepStrictEqual((yield* log.query({})).map((e) => e.stream), ["build:10", "build:12"])
    })
  )
}

const Sql = EventLogSql.pipe(Layer.provideMerge(PgTest))

/** One migrated database for the file; every test starts from an empty event log. */
const reset = Effect.flatMap(PgClient.PgClient, (sql) => sql`TRUNCATE sweeper_events, ci_builds RESTART IDENTITY`)

describe("EventLog contract", () => {
  describe("EventLogMemory", () => {
    eventLogContract((name, body) => it.effect(name, () => Effect.provide(body, EventLogMemory)))
  })

  layer(Sql, { excludeTestServices: true })("EventLogSql (real PostgreSQL)", (it) => {
    eventLogContract((name, body) => it.effect(name, () => Effect.andThen(reset, body)))

    it.effect("an event appended in a transaction commits or rolls back with the row change beside it", () =>
      Effect.gen(function*() {
        yield* reset
        const log = yield* EventLog
        const sql = yield* PgClient.PgClient
        const insertBuild = (id: number) =>
          sql`INSERT INTO ci_builds (id, project_id, status) VALUES (${id}, 1, 'canceling')`
        const count = (id: number) =>
          Effect.map(sql<{ n: string }>`SELECT count(*) AS n FROM ci_builds WHERE id = ${id}`, (r) => Number(r[0]!.n))

        yield* log.transaction(insertBuild(1).pipe(Effect.andThen(append(dropped(1)))))
        assert.strictEqual(yield* count(1), 1)

        const failed = yield* log.transaction(Effect.gen(function*() {
          yield* insertBuild(2)
          yield* append(dropped(2))
          return yield* new Boom({ message: "after both writes" })
        })).pipe(Effect.flip)
        assert.strictEqual((failed as Boom)._tag, "Boom")
        assert.strictEqual(yield* count(2), 0)

        // The event's own failure (a duplicate key on the row written before it) rolls back the row too.
        const conflict = yield* log.transaction(Effect.gen(function*() {
          yield* append(dropped(3))
          yield* insertBuild(1)
        })).pipe(Effect.flip)
        assert.strictEqual((conflict as { _tag: string })._tag, "SqlError")
        assert.deepStrictEqual((yield* log.query({})).map((e) => e.stream), ["build:1"])
      }))
  })
})
