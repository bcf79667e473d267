/** ExportJobsSql on a real PostgreSQL: the reads, and the guards the fail UPDATE carries itself. */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { DateTime, Effect, Layer } from "effect"
import { EventLogSql } from "../../src/layers/postgres/EventLogSql.ts"
import { ExportJobsSql } from "../../src/layers/postgres/ExportJobsSql.ts"
import { ExportJobs } from "../../src/services/ExportJobs.ts"
import { PgTest } from "../support/postgres.ts"

const NOW = DateTime.makeUnsafe("2026-03-01T12:30:00Z")
const CREATED = new Date("2026-03-01T10:00:00Z")

const Storage = () => ExportJobsSql.pipe(Layer.provideMerge(EventLogSql), Layer.provideMerge(PgTest))

const seed = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  yield* sql`INSERT INTO namespaces (id, name, path) VALUES (1, 'g', 'g')`
  yield* sql`INSERT INTO projects (id, namespace_id, name, path) VALUES (5, 1, 'p', 'p')`
  yield* sql`INSERT INTO project_export_jobs (id, project_id, jid, status, created_at, updated_at) VALUES
    (1, 5, 'j1', 0, ${CREATED}, ${CREATED}), (2, 5, 'j2', 1, ${CREATED}, ${CREATED}),
    (3, 5, 'j3', 2, ${CREATED}, ${CREATED}), (4, 5, 'j4', 3, ${CREATED}, ${CREATED})`
  yield* sql`INSERT INTO project_relation_exports (project_export_job_id, project_id, relation) VALUES
    (2, 5, 'issues'), (2, 5, 'labels'), (3, 5, 'issues')`
})

const row = (id: number) =>
  Effect.flatMap(
    PgClient.PgClient,
    (sql) =>
      sql<{ status: number; updated_at: Date }>`SELECT status, updated_at FROM project_export_jobs WHERE id = ${id}`
  ).pipe(
    Effect.map((rows) => rows[0]!)
  )

const eventCount = Effect.flatMap(
  PgClient.PgClient,
  (sql) => sql<{ n: string }>`SELECT count(*) AS n FROM sweeper_events WHERE type = 'ExportJobFailed'`
).pipe(
  Effect.map((rows) => Number(rows[0]!.n))
)

describe("ExportJobsSql", () => {
  it.live("reads queued/started jobs, and re-reads them with their relation export counts", () =>
    Effect.gen(function*() {
      yield* seed
      const jobs = yield* ExportJobs
      assert.deepStrictEqual(yield* jobs.listEnqueued, [{ id: 1, jid: "j1" }, { id: 2, jid: "j2" }])
      const found = yield* jobs.findEnqueued([2, 3, 4, 1, 99])
      assert.deepStrictEqual(found.map((j) => [j.id, j.projectId, j.jid, j.status, j.relationExports]), [
        [1, 5, "j1", 0, 0],
        [2, 5, "j2", 1, 2]
      ])
      assert.strictEqual(DateTime.formatIso(found[0]!.createdAt), CREATED.toISOString())
      assert.deepStrictEqual(yield* jobs.findEnqueued([]), [])
    }).pipe(Effect.provide(Storage())))

  it.live("failMany sets status 3 and updated_at, with its event; the UPDATE's own guards stop a lost update", () =>
    Effect.gen(function*() {
      yield* seed
      const jobs = yield* ExportJobs
      const sql = yield* PgClient.PgClient
      const [first, second] = yield* jobs.findEnqueued([1, 2])
      // Between the re-read and the write, job 2 finishes and job 1 is failed by its own worker … then
      // re-enqueued with a new jid.
      yield* sql`UPDATE project_export_jobs SET status = 2 WHERE id = 2`
      assert.deepStrictEqual(yield* jobs.failMany([second!], NOW), { failed: [], locked: [] })
      assert.strictEqual((yield* row(2)).status, 2)
      yield* sql`UPDATE project_export_jobs SET jid = 'j1-again' WHERE id = 1`
      assert.deepStrictEqual(yield* jobs.failMany([first!], NOW), { failed: [], locked: [] })
      assert.strictEqual((yield* row(1)).status, 0)
      assert.strictEqual(yield* eventCount, 0)

      yield* sql`UPDATE project_export_jobs SET jid = 'j1' WHERE id = 1`
      assert.deepStrictEqual(yield* jobs.failMany([first!], NOW), { failed: ["j1"], locked: [] })
      const failed = yield* row(1)
      assert.strictEqual(failed.status, 3)
      assert.strictEqual(failed.updated_at.toISOString(), DateTime.formatIso(NOW))
      const events = yield* sql<{ stream: string; data: unknown }>`SELECT stream, data FROM sweeper_events`
      assert.deepStrictEqual(events.map((e) => [e.stream, e.data]), [["export_job:1", {
        id: 1,
        jid: "j1",
        project_id: 5
      }]])
      // Failing it again is a no-op.
      assert.deepStrictEqual(yield* jobs.failMany([first!], NOW), { failed: [], locked: [] })
      assert.strictEqual(yield* eventCount, 1)
    }).pipe(Effect.provide(Storage())))

  it.live("failMany fails a whole slice in one transaction: rows that changed meanwhile are left out, one event per failed row", () =>
    Effect.gen(function*() {
      const sql = yield* PgClient.PgClient
      yield* sql`INSERT INTO namespaces (id) VALUES (1)`
      yield* sql`INSERT INTO projects (id, namespace_id) VALUES (5, 1), (6, 1)`
      yield* sql`INSERT INTO project_export_jobs (id, project_id, jid, status, created_at, updated_at)
        SELECT n, 5 + n % 2, 'jid-' || n, n % 2, ${CREATED}, ${CREATED} FROM generate_series(1, 2500) AS n`
      const jobs = yield* ExportJobs
      const slice = yield* jobs.findEnqueued(Array.from({ length: 2500 }, (_, i) => i + 1))
      // Job 7 finishes and job 8 is re-enqueued between the re-read and the write.
      yield* sql`UPDATE project_export_jobs SET status = 2 WHERE id = 7`
      yield* sql`UPDATE project_export_jobs SET jid = 'jid-8-again' WHERE id = 8`
      const { failed, locked } = yield* jobs.failMany(slice, NOW)
      assert.deepStrictEqual(locked, [])
      assert.strictEqual(failed.length, 2498)
      assert.isFalse(failed.includes("jid-7") || failed.includes("jid-8"))
      const counts = yield* sql<
        { status: number; n: string }
      >`SELECT status, count(*) AS n FROM project_export_jobs GROUP BY status ORDER BY status`
      assert.deepStrictEqual(counts.map((c) => [c.status, Number(c.n)]), [[0, 1], [2, 1], [3, 2498]])
      const events = yield* sql<{ stream: string; data: { id: number; jid: string; project_id: number } }>`
        SELECT stream, data FROM sweeper_events ORDER BY id`
      assert.strictEqual(events.length, 2498)
      assert.deepStrictEqual(events[0], { stream: "export_job:1", data: { id: 1, jid: "jid-1", project_id: 6 } })
      assert.strictEqual(new Set(events.map((e) => e.stream)).size, 2498)
    }).pipe(Effect.provide(Storage())))
})
