/**
 * One contract for ExportJobs.failMany against rows another open transaction holds (a write
 * never waits for them), on the memory layer and on a real PostgreSQL where a second connection holds
 * the rows `FOR UPDATE`: the slice write skips them at once and names them (`locked`), fails the
 * rest, leaves them queued/started with no event; once the lock is gone the same write fails them.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Context, DateTime, Duration, Effect, Layer } from "effect"
import { EventLogMemory } from "../../src/layers/memory/EventLogMemory.ts"
import { ExportJobsMemory, MemoryExportJobs } from "../../src/layers/memory/ExportJobsMemory.ts"
import { EventLogSql } from "../../src/layers/postgres/EventLogSql.ts"
import { ExportJobsSql } from "../../src/layers/postgres/ExportJobsSql.ts"
import { EventLog } from "../../src/services/EventLog.ts"
import { ExportJobs } from "../../src/services/ExportJobs.ts"
import { holdLocks, PgTest, TestDatabaseUrl } from "../support/postgres.ts"

const NOW = DateTime.makeUnsafe("2026-03-01T12:30:00Z")
const CREATED = DateTime.makeUnsafe("2026-03-01T10:00:00Z")
const NO_WAIT = Duration.seconds(5)

class Rows extends Context.Service<Rows, {
  /** Queued export jobs with these ids (jid `j<id>`, project 5). */
  seed(ids: ReadonlyArray<number>): Effect.Effect<void>
  statusOf(id: number): Effect.Effect<number>
  hold(ids: ReadonlyArray<number>): Effect.Effect<Effect.Effect<void>>
}>()("test/layers/ExportJobs.contract/Rows") {}

const memory = Layer.effect(
  Rows,
  Effect.gen(function*() {
    const state = yield* MemoryExportJobs
    return Rows.of({
      seed: (ids) =>
        Effect.sync(() => {
          for (const id of ids) {
            state.jobs.set(id, { id, projectId: 5, jid: `j${id}`, status: 0, createdAt: CREATED, updatedAt: CREATED })
          }
        }),
      statusOf: (id) => Effect.sync(() => state.jobs.get(id)!.status),
      hold: (ids) =>
        Effect.sync(() => {
          for (const id of ids) state.locked.add(id)
          return Effect.sync(() => ids.forEach((id) => state.locked.delete(id)))
        })
    })
  })
).pipe(Layer.provideMerge(ExportJobsMemory), Layer.provideMerge(EventLogMemory))

const postgres = Layer.effect(
  Rows,
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const url = yield* TestDatabaseUrl
    const created = DateTime.toDateUtc(CREATED)
    return Rows.of({
      seed: (ids) =>
        Effect.orDie(Effect.gen(function*() {
          yield* sql`INSERT INTO namespaces (id, name, path) VALUES (1, 'g', 'g')`
          yield* sql`INSERT INTO projects (id, namespace_id, name, path) VALUES (5, 1, 'p', 'p')`
          yield* sql`INSERT INTO project_export_jobs (id, project_id, jid, status, created_at, updated_at)
        SELECT i, 5, 'j' || i, 0, ${created}, ${created} FROM unnest(${ids}::bigint[]) AS i`
        })),
      statusOf: (id) =>
        Effect.orDie(Effect.map(
          sql<{ status: number }>`SELECT status FROM project_export_jobs WHERE id = ${id}`,
          (rows) => rows[0]!.status
        )),
      hold: (ids) =>
        holdLocks((other) => other`SELECT 1 FROM project_export_jobs WHERE id = ANY(${ids}::bigint[]) FOR UPDATE`).pipe(
          Effect.provideService(TestDatabaseUrl, url)
        )
    })
  })
).pipe(Layer.provideMerge(ExportJobsSql), Layer.provideMerge(EventLogSql), Layer.provideMerge(PgTest))

const backends: Record<string, Layer.Layer<Rows | ExportJobs | EventLog>> = { memory, postgres: Layer.orDie(postgres) }

const failedStreams = Effect.map(
  Effect.flatMap(EventLog, (log) => log.query({ type: "ExportJobFailed" })),
  (events) => events.map((event) => event.stream)
)
const noWait = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  effect.pipe(
    Effect.timeoutOrElse({
      duration: NO_WAIT,
      orElse: () => Effect.die(new Error("the write waited for a locked row"))
    })
  )

for (const [name, backend] of Object.entries(backends)) {
  describe(`ExportJobs contract (${name}): rows held by another transaction`, () => {
    it.live("failMany skips held rows at once, fails the rest, and fails them once the lock is gone", () =>
      Effect.gen(function*() {
        const rows = yield* Rows
        const jobs = yield* ExportJobs
        yield* rows.seed([1, 2, 3, 4])
        const slice = yield* jobs.findEnqueued([1, 2, 3, 4])
        const release = yield* rows.hold([2, 3])
        assert.deepStrictEqual(yield* noWait(jobs.failMany(slice, NOW)), { failed: ["j1", "j4"], locked: [2, 3] })
        assert.strictEqual(yield* rows.statusOf(2), 0)
        assert.strictEqual(yield* rows.statusOf(3), 0)
        assert.deepStrictEqual(yield* failedStreams, ["export_job:1", "export_job:4"])
        // A held row that changed as well (re-enqueued: the jid read is stale) is a lost race.
        const stale = slice.filter((job) => job.id === 2).map((job) => ({ ...job, jid: "old" }))
        assert.deepStrictEqual(yield* noWait(jobs.failMany(stale, NOW)), { failed: [], locked: [] })
        yield* release
        const again = yield* jobs.findEnqueued([1, 2, 3, 4])
        assert.deepStrictEqual(yield* noWait(jobs.failMany(again, NOW)), { failed: ["j2", "j3"], locked: [] })
        assert.deepStrictEqual(yield* failedStreams, ["export_job:1", "export_job:4", "export_job:2", "export_job:3"])
      }).pipe(Effect.provide(backend)))
  })
}
