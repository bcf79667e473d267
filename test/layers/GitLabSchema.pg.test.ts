/**
 * Beside a real GitLab, on databases laid out with GitLab's own DDL (test/support/
 * gitlabSchema.ts): migrate touches nothing of GitLab's (pg_indexes and columns identical before and
 * after), detection picks gitlab mode, builds are read and written through p_ci_builds in every
 * partition by (id, partition_id), a missing column stops start-up naming it, and doctor's scan
 * verdicts and index statements.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { DateTime, Effect, Layer, Option, Redacted } from "effect"
import type { SqlClient } from "effect/sql"
import { cancelingIndex, createStatements, judgeScan, partitionsOf, scans } from "../../src/doctor/Indexes.ts"
import { CurrentRun } from "../../src/domain/Batch.ts"
import { DropBatchSize } from "../../src/domain/Build.ts"
import { BuildsSql } from "../../src/layers/postgres/BuildsSql.ts"
import {
  checkColumns,
  detectBuildsTable,
  detectSchemaMode,
  MissingColumn,
  PartitionedBuilds,
  PlainBuilds
} from "../../src/layers/postgres/DatabaseSchema.ts"
import { EventLogSql } from "../../src/layers/postgres/EventLogSql.ts"
import { migrate, pendingMigrations } from "../../src/layers/postgres/Migrations.ts"
import { layerServer } from "../../src/layers/postgres/Postgres.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { DropCancelingBuilds } from "../../src/programs/DropCancelingBuilds.ts"
import { Builds } from "../../src/services/Builds.ts"
import { at } from "../support/clock.ts"
import { allIndexes, createGitLabSchema, gitlabColumns, type GitLabLayout } from "../support/gitlabSchema.ts"
import { freshDatabase } from "../support/postgres.ts"

const NOW = "2026-01-01T05:00:00Z"

/** A fresh database with GitLab's layout, not migrated. */
const onGitLab = <A, E>(layout: GitLabLayout, effect: Effect.Effect<A, E, PgClient.PgClient | SqlClient.SqlClient>) =>
  Effect.scoped(Effect.gen(function*() {
    const { url } = yield* freshDatabase
    return yield* Effect.gen(function*() {
      yield* createGitLabSchema(layout)
      return yield* effect
    }).pipe(Effect.provide(layerServer(Redacted.make(url))))
  }))

const run = Effect.provideService(CurrentRun, {
  runId: null,
  batch: "drop-canceling-builds",
  dryRun: false,
  budget: Option.none(),
  fence: Option.none()
})

describe("Beside GitLab's schema", () => {
  for (const partitioned of [true, false]) {
    it.live(`migrate leaves GitLab's tables exactly as they were (${partitioned ? "p_ci_builds" : "plain ci_builds"})`, () =>
      onGitLab(
        { partitioned },
        Effect.gen(function*() {
          const sql = yield* PgClient.PgClient
          const indexesBefore = yield* allIndexes
          const columnsBefore = yield* gitlabColumns
          assert.isAbove(indexesBefore.length, 20)
          assert.deepStrictEqual(yield* detectSchemaMode(Option.none()), { mode: "gitlab", source: "detected" })
          assert.deepStrictEqual(yield* pendingMigrations("gitlab"), [
            "0002_sweeper_tables",
            "0003_schema_ownership",
            "0004_event_retention_indexes",
            "0005_console_rollup",
            "0006_ledger_rollup",
            "0008_event_relay",
            "0009_transition_tables",
            "0010_relay_keys",
            "0011_shadow_candidates",
            "0013_job_outbox_batches"
          ])

          const applied = yield* migrate
          // Sweeper's own transactional migrations (never the platform tables), then its online steps.
          assert.deepStrictEqual(applied.map(([id]) => Number(id)), [
            2,
            3,
            4,
            5,
            6,
            8,
            9,
            10,
            11,
            13,
            4,
            4,
            5,
            6,
            6,
            12,
            12
          ])
          assert.deepStrictEqual(yield* migrate, [])
          const isSweepers = (row: { tablename: string }) => row.tablename.startsWith("sweeper_")
          assert.deepStrictEqual((yield* allIndexes).filter((r) => !isSweepers(r)), indexesBefore)
          assert.deepStrictEqual(yield* gitlabColumns, columnsBefore)
          // Only Sweeper's own tables are new; it recorded owning none of GitLab's.
          const tables = yield* sql<{ table_name: string }>`SELECT table_name FROM information_schema.tables
          WHERE table_schema = 'public' AND table_name LIKE 'sweeper%' ORDER BY table_name`
          assert.deepStrictEqual(tables.map((t) => t.table_name), [
            "sweeper_backfills",
            "sweeper_events",
            "sweeper_job_outbox",
            "sweeper_job_outbox_batches",
            "sweeper_lease_fences",
            "sweeper_migrations",
            "sweeper_owed_runs",
            "sweeper_relayed",
            "sweeper_relayed_keys",
            "sweeper_runs",
            "sweeper_schema_ownership",
            "sweeper_shadow_candidates"
          ])
          assert.lengthOf(yield* sql`SELECT * FROM sweeper_schema_ownership`, 0)
          // Still gitlab after its own migrations ran.
          assert.strictEqual((yield* detectSchemaMode(Option.none())).mode, "gitlab")
          assert.deepStrictEqual(yield* detectBuildsTable, partitioned ? PartitionedBuilds : PlainBuilds)
          assert.strictEqual((yield* checkColumns).checked, partitioned ? 25 : 24)
        })
      ))
  }

  it.live("a standalone database records what Sweeper created and stays standalone", () =>
    Effect.scoped(Effect.gen(function*() {
      const { url } = yield* freshDatabase
      yield* Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        assert.deepStrictEqual(yield* detectSchemaMode(Option.none()), { mode: "standalone", source: "detected" })
        yield* migrate
        const owned = yield* sql<
          { table_name: string }
        >`SELECT table_name FROM sweeper_schema_ownership ORDER BY table_name`
        assert.deepStrictEqual(owned.map((r) => r.table_name), [
          "ci_builds",
          "ci_builds_runner_session",
          "ci_pending_builds",
          "ci_pipelines",
          "ci_resource_groups",
          "ci_resources",
          "ci_running_builds",
          "issues",
          "namespaces",
          "project_export_jobs",
          "project_relation_exports",
          "projects"
        ])
        assert.strictEqual((yield* detectSchemaMode(Option.none())).mode, "standalone")
        // A database migrated before the ownership record existed is still recognised as Sweeper's.
        yield* sql`DELETE FROM sweeper_schema_ownership`
        assert.strictEqual((yield* detectSchemaMode(Option.none())).mode, "standalone")
      }).pipe(Effect.provide(layerServer(Redacted.make(url))))
    })))

  it.live("drop-canceling-builds repairs stuck builds in every partition of p_ci_builds, by (id, partition_id)", () =>
    onGitLab(
      { partitioned: true },
      Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        yield* migrate
        // 130 stuck builds in each partition (more than one page of 100, sharing created_at across
        // partitions); id 7 exists in both partitions, as the (id, partition_id) key allows.
        yield* sql`INSERT INTO p_ci_builds (id, partition_id, project_id, runner_id, type, status, lock_version, created_at, updated_at)
        SELECT i + CASE WHEN p = 101 AND i <> 7 THEN 1000 ELSE 0 END, p, 10 + i % 3, 40, 'Ci::Build', 'canceling', i % 4,
          '2026-01-01 01:00:00'::timestamp + ((i % 20) * interval '1 minute'), '2026-01-01 02:00:00'
        FROM generate_series(1, 130) AS i, (VALUES (100), (101)) AS parts(p)`
        // Controls in partition 101: recent, running, a bridge.
        yield* sql`INSERT INTO p_ci_builds (id, partition_id, project_id, type, status, created_at, updated_at) VALUES
        (5001, 101, 1, 'Ci::Build', 'canceling', '2026-01-01 04:30:00', '2026-01-01 04:30:00'),
        (5002, 101, 1, 'Ci::Build', 'running', '2026-01-01 01:00:00', '2026-01-01 01:00:00'),
        (5003, 101, 1, 'Ci::Bridge', 'canceling', '2026-01-01 01:00:00', '2026-01-01 01:00:00')`

        const builds = yield* Builds
        const seven = yield* builds.find({ id: 7, partitionId: 101 })
        assert.strictEqual(Option.getOrThrow(seven).partitionId, 101)
        assert.strictEqual(Option.getOrThrow(seven).lockVersion, 3)

        const summary = yield* DropCancelingBuilds.run.pipe(at(NOW), run)
        assert.deepStrictEqual(summary, {
          dropped: 260,
          doomed: 0,
          batches: 3,
          skippedLocked: 0,
          heldMs: 0,
          heldBy: []
        })
        const byPartition = yield* sql<{ partition: string; status: string; failure_reason: number | null; n: string }>`
        SELECT tableoid::regclass::text AS partition, status, failure_reason, count(*) AS n FROM p_ci_builds
        GROUP BY 1, 2, 3 ORDER BY 1, 2, 3`
        assert.deepStrictEqual(byPartition.map((r) => [r.partition, r.status, r.failure_reason, Number(r.n)]), [
          ["ci_builds", "failed", 3, 130],
          ["gitlab_partitions_dynamic.ci_builds_101", "canceling", null, 2],
          ["gitlab_partitions_dynamic.ci_builds_101", "failed", 3, 130],
          ["gitlab_partitions_dynamic.ci_builds_101", "running", null, 1]
        ])
        // One event per build, stream build:<id>, the partition in its data: build 7 twice.
        const events = yield* sql<{ stream: string; data: { partition_id: number; id: number } }>`
        SELECT stream, data FROM sweeper_events WHERE stream = 'build:7' ORDER BY data->>'partition_id'`
        assert.deepStrictEqual(events.map((e) => [e.stream, e.data.id, e.data.partition_id]), [["build:7", 7, 100], [
          "build:7",
          7,
          101
        ]])
        assert.strictEqual(
          Number(
            (yield* sql<{ n: string }>`SELECT count(*) AS n FROM sweeper_events WHERE type = 'BuildDropped'`)[0]!.n
          ),
          260
        )
        // A second run finds nothing.
        assert.deepStrictEqual(yield* DropCancelingBuilds.run.pipe(at(NOW), run), {
          dropped: 0,
          doomed: 0,
          batches: 0,
          skippedLocked: 0,
          heldMs: 0,
          heldBy: []
        })
      }).pipe(Effect.provide(Layer.mergeAll(BuildsSql, MetricsPrometheus).pipe(Layer.provideMerge(EventLogSql))))
    ))

  it.live("a page crossing partitions is one transaction; the row that lost the race in partition 101 is retried on its own", () =>
    onGitLab(
      { partitioned: true },
      Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        yield* migrate
        // Interleaved in keyset order across both partitions; id 7 in both.
        yield* sql`INSERT INTO p_ci_builds (id, partition_id, project_id, runner_id, type, status, lock_version, created_at, updated_at) VALUES
        (7, 100, 1, 40, 'Ci::Build', 'canceling', 2, '2026-01-01 01:00:00', '2026-01-01 02:00:00'),
        (7, 101, 1, 40, 'Ci::Build', 'canceling', 2, '2026-01-01 01:00:00', '2026-01-01 02:00:00'),
        (8, 100, 2, 40, 'Ci::Build', 'canceling', 0, '2026-01-01 01:00:00', '2026-01-01 02:00:00'),
        (9, 101, 3, 40, 'Ci::Build', 'canceling', 5, '2026-01-01 01:00:00', '2026-01-01 02:00:00')`
        const builds = yield* Builds
        const page = yield* builds.findStuckCanceling({
          cutoff: DateTime.makeUnsafe("2026-01-01T04:00:00Z"),
          after: Option.none(),
          limit: 10
        })
        assert.deepStrictEqual(page.map((b) => [b.id, b.partitionId]), [[7, 100], [7, 101], [8, 100], [9, 101]])
        // A concurrent writer bumps (7, 101) only: (7, 100), same id, must still drop.
        yield* sql`UPDATE p_ci_builds SET lock_version = lock_version + 1 WHERE id = 7 AND partition_id = 101`
        const dropped = yield* builds.dropMany(page, DateTime.makeUnsafe(NOW)).pipe(run)
        assert.deepStrictEqual(dropped.dropped.map((b) => [b.id, b.partitionId]), [[7, 100], [8, 100], [9, 101]])
        assert.deepStrictEqual(dropped.locked, [])
        const rows = yield* sql<
          { id: string; partition_id: string; status: string; lock_version: number; xid: string }
        >`
        SELECT id, partition_id, status, lock_version, xmin::text AS xid FROM p_ci_builds ORDER BY id, partition_id`
        assert.deepStrictEqual(rows.map((r) => [Number(r.id), Number(r.partition_id), r.status, r.lock_version]), [
          [7, 100, "failed", 3],
          [7, 101, "canceling", 3],
          [8, 100, "failed", 1],
          [9, 101, "failed", 6]
        ])
        // Both partitions written in one transaction.
        assert.lengthOf(new Set(rows.filter((r) => r.status === "failed").map((r) => r.xid)), 1)
        const events = yield* sql<
          { data: { id: number; partition_id: number } }
        >`SELECT data FROM sweeper_events ORDER BY id`
        assert.deepStrictEqual(events.map((e) => [e.data.id, e.data.partition_id]), [[7, 100], [8, 100], [9, 101]])
        // The program, pages of 2: (7, 101) is found again and dropped; every build has exactly one event.
        const summary = yield* DropCancelingBuilds.run.pipe(at(NOW), run, Effect.provideService(DropBatchSize, 2))
        assert.deepStrictEqual(summary, { dropped: 1, doomed: 0, batches: 1, skippedLocked: 0, heldMs: 0, heldBy: [] })
        const perBuild = yield* sql<{ key: string; n: string }>`
        SELECT (data->>'id') || ':' || (data->>'partition_id') AS key, count(*) AS n FROM sweeper_events GROUP BY 1 ORDER BY 1`
        assert.deepStrictEqual(perBuild.map((r) => [r.key, Number(r.n)]), [["7:100", 1], ["7:101", 1], ["8:100", 1], [
          "9:101",
          1
        ]])
      }).pipe(Effect.provide(Layer.mergeAll(BuildsSql, MetricsPrometheus).pipe(Layer.provideMerge(EventLogSql))))
    ))

  it.live("a missing or wrongly typed column stops start-up naming table and column", () =>
    onGitLab(
      { partitioned: true },
      Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        yield* sql`ALTER TABLE p_ci_builds DROP COLUMN failure_reason`
        const missing = yield* Effect.flip(checkColumns).pipe(
          Effect.flatMap((e) => e instanceof MissingColumn ? Effect.succeed(e) : Effect.die(e))
        )
        assert.deepStrictEqual([missing.table, missing.column, missing.found], [
          "p_ci_builds",
          "failure_reason",
          undefined
        ])
        assert.strictEqual(
          missing.message,
          "column p_ci_builds.failure_reason is missing (a batch needs it as integer)"
        )
        yield* sql`ALTER TABLE p_ci_builds ADD COLUMN failure_reason text`
        const typed = yield* Effect.flip(checkColumns).pipe(
          Effect.flatMap((e) => e instanceof MissingColumn ? Effect.succeed(e) : Effect.die(e))
        )
        assert.strictEqual(typed.message, "column p_ci_builds.failure_reason is text, a batch needs integer")
      })
    ))

  it.live("doctor's verdicts: GitLab's own indexes serve every scan; without the status index it recommends a concurrent build per partition", () =>
    Effect.gen(function*() {
      const now = DateTime.makeUnsafe(NOW)
      const verdicts = (layout: GitLabLayout) =>
        onGitLab(
          layout,
          Effect.gen(function*() {
            const sql = yield* PgClient.PgClient
            // Sweeper's own tables (gitlab mode: nothing else), as doctor finds them after `migrate`.
            yield* migrate
            const builds = yield* detectBuildsTable
            const partitions = yield* partitionsOf(sql, builds.name)
            const results = []
            for (const scan of scans(builds)) {
              const scanPartitions = scan.table === builds.name ? partitions : []
              results.push({
                scan,
                partitions: scanPartitions,
                verdict: yield* judgeScan(sql, scan, now, [scan.table, ...scanPartitions.map((p) => p.name)])
              })
            }
            return results
          })
        )

      const gitlab = yield* verdicts({ partitioned: true })
      assert.deepStrictEqual(gitlab.map((r) => [r.scan.batch, r.verdict.served]), [
        ["stuck-export-jobs", true],
        ["drop-canceling-builds", true],
        // The family's walks: GitLab's (status, created_at, project_id) index serves each of them.
        ["drop-pending-builds", true],
        ["drop-pending-builds", true],
        ["drop-pending-builds", true],
        ["drop-running-builds", true],
        ["drop-scheduled-builds", true],
        ["prune-events", true],
        ["reschedule-stuck-issue-rebalances", true],
        ["reschedule-stuck-issue-rebalances", true]
      ])
      assert.include(gitlab[0]!.verdict.servedBy, "index_project_export_jobs_on_status")
      assert.sameMembers([...gitlab[1]!.verdict.servedBy], [
        "ci_builds_status_created_at_project_id_idx",
        "ci_builds_101_status_created_at_project_id_idx"
      ])
      assert.isAbove(gitlab[1]!.verdict.plan.length, 0)

      for (const family of gitlab.slice(2, 6)) {
        assert.sameMembers([...family.verdict.servedBy], [
          "ci_builds_status_created_at_project_id_idx",
          "ci_builds_101_status_created_at_project_id_idx"
        ])
      }

      const bare = yield* verdicts({ partitioned: true, withoutStatusIndex: true })
      const canceling = bare[1]!
      assert.isFalse(canceling.verdict.served)
      assert.deepStrictEqual(bare.slice(2, 6).map((r) => r.verdict.served), [false, false, false, false])
      assert.deepStrictEqual(createStatements(cancelingIndex(PartitionedBuilds), canceling.partitions), [
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS index_ci_builds_canceling_on_created_at_project_id ON public.ci_builds (created_at, project_id, id, partition_id) WHERE status = 'canceling' AND type = 'Ci::Build'",
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS index_ci_builds_101_canceling_on_created_at_project_id ON gitlab_partitions_dynamic.ci_builds_101 (created_at, project_id, id, partition_id) WHERE status = 'canceling' AND type = 'Ci::Build'",
        "CREATE INDEX IF NOT EXISTS index_p_ci_builds_canceling_on_created_at_project_id ON ONLY p_ci_builds (created_at, project_id, id, partition_id) WHERE status = 'canceling' AND type = 'Ci::Build'",
        "ALTER INDEX index_p_ci_builds_canceling_on_created_at_project_id ATTACH PARTITION public.index_ci_builds_canceling_on_created_at_project_id",
        "ALTER INDEX index_p_ci_builds_canceling_on_created_at_project_id ATTACH PARTITION gitlab_partitions_dynamic.index_ci_builds_101_canceling_on_created_at_project_id"
      ])

      const plain = yield* verdicts({ partitioned: false, withoutStatusIndex: true })
      assert.isFalse(plain[1]!.verdict.served)
      assert.deepStrictEqual(createStatements(cancelingIndex(PlainBuilds), plain[1]!.partitions), [
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS index_ci_builds_canceling_on_created_at_project_id_id ON ci_builds (created_at, project_id, id) WHERE status = 'canceling' AND type = 'Ci::Build'"
      ])
    }))
})
