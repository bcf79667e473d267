/**
 * The stuck-builds family on real PostgreSQL laid out with GitLab's own DDL (p_ci_builds with two
 * partitions, and the older plain ci_builds), runner tables included: GitLab's cases for every rule
 * (pending outdated, waiting for its runner's ack with the ack state in real Redis, and stuck;
 * running outdated; scheduled outdated), the minute on each side of every threshold, complete builds
 * and bridges untouched, both failure-reason sets; and rows that never leave the scope (a zombie, a
 * row held by another transaction, a row a trigger refuses), with which each run still ends, every
 * other row repaired and the stuck ones counted.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Option, Redacted } from "effect"
import type { SqlClient } from "effect/sql"
import { CurrentRun } from "../../src/domain/Batch.ts"
import { DropBatchSize } from "../../src/domain/Build.ts"
import {
  CurrentFailureReasonSet,
  type FailureReasonSet,
  RunnerProvisioningTimeoutReason
} from "../../src/domain/StuckBuilds.ts"
import { BuildsSql } from "../../src/layers/postgres/BuildsSql.ts"
import { EventLogSql } from "../../src/layers/postgres/EventLogSql.ts"
import { migrate } from "../../src/layers/postgres/Migrations.ts"
import { layerServer } from "../../src/layers/postgres/Postgres.ts"
import { StuckBuildsSql } from "../../src/layers/postgres/StuckBuildsSql.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { RunnerAckQueueRedis } from "../../src/layers/redis/RunnerAckQueueRedis.ts"
import { DropCancelingBuilds } from "../../src/programs/DropCancelingBuilds.ts"
import { DropPendingBuilds } from "../../src/programs/DropPendingBuilds.ts"
import { DropRunningBuilds } from "../../src/programs/DropRunningBuilds.ts"
import { DropScheduledBuilds } from "../../src/programs/DropScheduledBuilds.ts"
import type { Builds } from "../../src/services/Builds.ts"
import type { Metrics } from "../../src/services/Metrics.ts"
import { RunnerAckQueue } from "../../src/services/RunnerAckQueue.ts"
import type { StuckBuilds } from "../../src/services/StuckBuilds.ts"
import { at } from "../support/clock.ts"
import { createGitLabSchema, type GitLabLayout } from "../support/gitlabSchema.ts"
import { freshDatabase, holdLocks, TestDatabaseUrl } from "../support/postgres.ts"
import { RedisTest } from "../support/redis.ts"

const NOW = "2026-01-02T05:00:00Z"

/** A fresh database with GitLab's layout and runner tables, migrated (gitlab mode), the family's layers on it. */
const onGitLab = <A, E>(
  layout: GitLabLayout,
  effect: Effect.Effect<
    A,
    E,
    PgClient.PgClient | SqlClient.SqlClient | TestDatabaseUrl | StuckBuilds | Builds | Metrics | RunnerAckQueue
  >
) =>
  Effect.scoped(Effect.gen(function*() {
    const { url } = yield* freshDatabase
    const base = Layer.merge(layerServer(Redacted.make(url)), Layer.succeed(TestDatabaseUrl, url))
    yield* Effect.gen(function*() {
      yield* createGitLabSchema({ ...layout, runners: true })
      yield* migrate
    }).pipe(Effect.provide(base))
    return yield* effect.pipe(
      Effect.provide(
        Layer.mergeAll(StuckBuildsSql, BuildsSql, MetricsPrometheus, RunnerAckQueueRedis.pipe(Layer.provide(RedisTest)))
          .pipe(
            Layer.provideMerge(EventLogSql),
            Layer.provideMerge(base)
          )
      )
    )
  }))

const asRun = (batch: string, reasons: FailureReasonSet = "legacy") => <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  effect.pipe(
    at(NOW),
    Effect.provideService(CurrentFailureReasonSet, reasons),
    Effect.provideService(CurrentRun, {
      runId: null,
      batch,
      dryRun: false,
      budget: Option.none(),
      fence: Option.none()
    })
  )

interface Row {
  readonly id: number
  readonly project?: number
  readonly status: string
  readonly created: string
  readonly updated?: string
  readonly scheduled?: string | null
  readonly type?: string
  readonly runner?: number
}

const seed = (table: string, partitioned: boolean, rows: ReadonlyArray<Row>) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    for (const row of rows) {
      // Odd ids in partition 101 on p_ci_builds, so every rule crosses partitions.
      const partition = partitioned && row.id % 2 === 1 ? 101 : 100
      yield* sql`INSERT INTO ${sql(table)} (id, partition_id, project_id, type, status, created_at, updated_at,
        scheduled_at, lock_version, runner_id)
        VALUES (${row.id}, ${partition}, ${row.project ?? 10}, ${row.type ?? "Ci::Build"}, ${row.status},
          ${row.created}::timestamp, ${row.updated ?? row.created}::timestamp,
          ${row.scheduled === undefined || row.scheduled === null ? null : row.scheduled}::timestamptz, 0,
          ${row.runner ?? null})`
    }
  })

/**
 * Runners: project 10 has an online project runner; project 30 sits under group 20 (namespace 21,
 * traversal 20 → 21) whose group runner is online; project 40 has none, and the instance runner is
 * offline (last contact three hours ago); project 50's own runner is online but paused.
 */
const seedRunners = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  yield* sql`INSERT INTO namespaces (id, name, path, type, traversal_ids, organization_id) VALUES
    (20, 'g', 'g', 'Group', '{20}', 1), (21, 'sub', 'sub', 'Group', '{20,21}', 1),
    (22, 'other', 'other', 'Group', '{22}', 1)`
  yield* sql`INSERT INTO projects (id, name, path, namespace_id, project_namespace_id, organization_id) VALUES
    (10, 'p10', 'p10', 22, 110, 1), (30, 'p30', 'p30', 21, 130, 1), (40, 'p40', 'p40', 22, 140, 1),
    (50, 'p50', 'p50', 22, 150, 1)`
  yield* sql`INSERT INTO ci_runners (id, contacted_at, active, runner_type) VALUES
    (1, '2026-01-02 02:00:00', true, 1), (2, '2026-01-02 04:50:00', true, 3),
    (3, '2026-01-02 04:50:00', true, 2), (4, '2026-01-02 04:50:00', false, 3)`
  yield* sql`INSERT INTO ci_runner_projects (runner_id, project_id) VALUES (2, 10), (4, 50)`
  yield* sql`INSERT INTO ci_runner_namespaces (runner_id, namespace_id) VALUES (3, 20)`
})

/** GitLab's cases, with the minute on each side of every threshold (NOW = 2026-01-02 05:00). */
const CASES: ReadonlyArray<
  Row & { readonly dropped: "pending_outdated" | "pending_stuck" | "running" | "scheduled" | "canceling" | null }
> = [
  // canceling (drop-canceling-builds): GitLab 19 ends it canceled (dropped for no_updates_canceling)
  { id: 40, status: "canceling", created: "2026-01-02 03:59:00", dropped: "canceling" },
  // pending, outdated after a day (project 10: a runner is online, so only the day counts)
  { id: 1, status: "pending", created: "2026-01-01 04:59:00", dropped: "pending_outdated" },
  { id: 2, status: "pending", created: "2026-01-01 05:00:00", dropped: null },
  { id: 3, status: "pending", created: "2026-01-01 05:01:00", dropped: null },
  { id: 4, status: "pending", created: "2025-12-30 00:00:00", updated: "2026-01-02 03:00:00", dropped: null },
  // pending, stuck after an hour with no online runner able to pick it
  { id: 5, project: 40, status: "pending", created: "2026-01-02 03:59:00", dropped: "pending_stuck" },
  { id: 6, project: 40, status: "pending", created: "2026-01-02 04:00:00", dropped: null },
  { id: 7, project: 40, status: "pending", created: "2026-01-02 04:01:00", dropped: null },
  { id: 8, project: 30, status: "pending", created: "2026-01-02 03:00:00", dropped: null },
  { id: 9, project: 10, status: "pending", created: "2026-01-02 03:00:00", dropped: null },
  { id: 10, project: 50, status: "pending", created: "2026-01-02 03:00:00", dropped: "pending_stuck" },
  { id: 11, project: 40, status: "pending", created: "2026-01-01 00:00:00", dropped: "pending_outdated" },
  // running, no update for an hour (and created before the cutoff, GitLab's newer query)
  { id: 12, status: "running", created: "2026-01-02 03:59:00", dropped: "running" },
  { id: 13, status: "running", created: "2026-01-02 04:00:00", dropped: null },
  { id: 14, status: "running", created: "2026-01-02 02:00:00", updated: "2026-01-02 04:01:00", dropped: null },
  { id: 15, status: "running", created: "2026-01-02 04:30:00", updated: "2026-01-02 03:00:00", dropped: null },
  // scheduled, an hour past scheduled_at
  {
    id: 16,
    status: "scheduled",
    created: "2026-01-01 00:00:00",
    scheduled: "2026-01-02T03:59:00Z",
    dropped: "scheduled"
  },
  { id: 17, status: "scheduled", created: "2026-01-01 00:00:00", scheduled: "2026-01-02T04:00:00Z", dropped: null },
  { id: 18, status: "scheduled", created: "2026-01-01 00:00:00", scheduled: "2026-01-02T04:01:00Z", dropped: null },
  { id: 19, status: "scheduled", created: "2026-01-01 00:00:00", scheduled: null, dropped: null },
  // complete builds and bridges: never touched, however old
  ...["success", "failed", "canceled", "skipped", "manual", "created"].map((status, i) => ({
    id: 20 + i,
    project: 40,
    status,
    created: "2025-12-01 00:00:00",
    scheduled: "2025-12-01T00:00:00Z",
    dropped: null
  })),
  { id: 30, project: 40, type: "Ci::Bridge", status: "pending", created: "2025-12-01 00:00:00", dropped: null },
  { id: 31, type: "Ci::Bridge", status: "running", created: "2025-12-01 00:00:00", dropped: null }
]

const REASONS: Record<FailureReasonSet, Record<string, number>> = {
  legacy: { pending_outdated: 3, pending_stuck: 3, running: 3, scheduled: 7, canceling: 3 },
  "gitlab-19": { pending_outdated: 25, pending_stuck: 26, running: 27, scheduled: 7 }
}

const states = (table: string) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const rows = yield* sql<{ id: string; status: string; failure_reason: number | null }>`
      SELECT id::text, status, failure_reason FROM ${sql(table)} ORDER BY id`
    return new Map(rows.map((r) => [Number(r.id), [r.status, r.failure_reason] as const]))
  })

describe("The stuck-builds family beside GitLab's schema", () => {
  for (const partitioned of [true, false]) {
    for (const reasons of ["legacy", "gitlab-19"] as const) {
      const table = partitioned ? "p_ci_builds" : "ci_builds"
      it.live(`every rule's cases and boundaries (${table}, ${reasons} reasons)`, () =>
        onGitLab(
          { partitioned },
          Effect.gen(function*() {
            const sql = yield* PgClient.PgClient
            yield* seedRunners
            yield* seed(table, partitioned, CASES)
            const pending = yield* DropPendingBuilds.run.pipe(asRun("drop-pending-builds", reasons))
            const running = yield* DropRunningBuilds.run.pipe(asRun("drop-running-builds", reasons))
            const scheduled = yield* DropScheduledBuilds.run.pipe(asRun("drop-scheduled-builds", reasons))
            const canceling = yield* DropCancelingBuilds.run.pipe(asRun("drop-canceling-builds", reasons))
            assert.deepStrictEqual([pending.dropped, running.dropped, scheduled.dropped, canceling.dropped], [
              4,
              1,
              1,
              1
            ])
            const after = yield* states(table)
            for (const row of CASES) {
              const [status, reason] = after.get(row.id)!
              if (row.dropped === null) {
                assert.deepStrictEqual([row.id, status, reason], [row.id, row.status, null])
              } else if (row.dropped === "canceling" && reasons === "gitlab-19") {
                // GitLab's drop! of a canceling build: canceled, its failure_reason left as it was.
                assert.deepStrictEqual([row.id, status, reason], [row.id, "canceled", null])
              } else {
                assert.deepStrictEqual([row.id, status, reason], [row.id, "failed", REASONS[reasons][row.dropped]!])
              }
            }
            // One event per drop, with GitLab's stuck type and the rule.
            const events = yield* sql<{ stream: string; data: { stuck_type: string; rule: string } }>`
              SELECT stream, data FROM sweeper_events WHERE type = 'BuildDropped' AND data ? 'rule' ORDER BY (data->>'id')::int`
            assert.deepStrictEqual(events.map((e) => [e.stream, e.data.stuck_type, e.data.rule]), [
              ["build:1", "outdated", "pending_outdated"],
              ["build:5", "stuck", "pending_stuck"],
              ["build:10", "stuck", "pending_stuck"],
              ["build:11", "outdated", "pending_outdated"],
              ["build:12", "outdated", "running_outdated"],
              ["build:16", "outdated", "scheduled_outdated"]
            ])
            // A second round finds nothing.
            const again = yield* DropPendingBuilds.run.pipe(asRun("drop-pending-builds", reasons))
            assert.strictEqual(again.dropped + again.batches, 0)
          })
        ), 120_000)
    }
  }

  for (const reasons of ["legacy", "gitlab-19"] as const) {
    it.live(`a runner assigned and its acknowledgement awaited over an hour (${reasons} reasons)`, () =>
      onGitLab(
        { partitioned: true },
        Effect.gen(function*() {
          const sql = yield* PgClient.PgClient
          yield* seedRunners
          // Project 10 has an online runner, so neither other pending rule applies to these.
          const assigned = { project: 10, status: "pending", runner: 2, created: "2025-12-31 17:00:00" }
          yield* seed("p_ci_builds", true, [
            { id: 50, ...assigned, updated: "2026-01-02 03:59:00" },
            { id: 51, ...assigned, updated: "2026-01-02 04:00:00" },
            { id: 52, ...assigned, updated: "2026-01-02 04:30:00" },
            // The runner is still within its acknowledgement window: left alone either way.
            { id: 53, ...assigned, updated: "2026-01-02 03:00:00" },
            { id: 54, ...assigned, updated: "2026-01-02 04:30:00" },
            // No runner assigned: not this rule's.
            { id: 55, project: 10, status: "pending", created: "2025-12-31 17:00:00", updated: "2026-01-02 03:00:00" },
            // Outdated too: GitLab's first rule takes it, with its own reason.
            { id: 56, ...assigned, created: "2025-12-31 00:00:00", updated: "2025-12-31 00:00:00" }
          ])
          const queue = yield* RunnerAckQueue
          yield* queue.setWaiting(53, 900)
          yield* queue.setWaiting(54, 900)
          // Pages of one: the next page is read while this one is written, so each page's waiting
          // builds must stay its own.
          // The operator named runner_provisioning_timeout's integer in their GitLab (24 here).
          const pending = yield* DropPendingBuilds.run.pipe(
            asRun("drop-pending-builds", reasons),
            Effect.provideService(DropBatchSize, 1),
            Effect.provideService(RunnerProvisioningTimeoutReason, Option.some(24))
          )
          const after = yield* states("p_ci_builds")
          const expected: Record<number, readonly [string, number | null]> = reasons === "legacy"
            ? { 50: ["failed", 24], 56: ["failed", 3] }
            : { 56: ["failed", 25] }
          for (const id of [50, 51, 52, 53, 54, 55, 56]) {
            assert.deepStrictEqual([id, ...after.get(id)!], [id, ...(expected[id] ?? ["pending", null])])
          }
          assert.strictEqual(pending.dropped, Object.keys(expected).length)
          const events = yield* sql<{ data: { id: number; stuck_type: string; rule: string } }>`
            SELECT data FROM sweeper_events WHERE type = 'BuildDropped' ORDER BY (data->>'id')::int`
          assert.deepStrictEqual(
            events.map((e) => [e.data.id, e.data.stuck_type, e.data.rule]),
            reasons === "legacy"
              ? [[50, "waiting_for_ack", "pending_waiting_for_ack"], [56, "outdated", "pending_outdated"]]
              : [[56, "outdated", "pending_outdated"]]
          )
        })
      ), 120_000)
  }

  it.live(
    "rows that never leave the scope: each run ends, every other row is repaired, the stuck ones counted",
    () =>
      onGitLab(
        { partitioned: true },
        Effect.gen(function*() {
          const sql = yield* PgClient.PgClient
          // 250 running builds an hour stale, three of which can never be failed: 7 a zombie (a trigger
          // swallows its update), 8 refused (a trigger raises), 9 held by another open transaction.
          yield* seed(
            "p_ci_builds",
            true,
            Array.from({ length: 250 }, (_, i) => ({ id: i + 1, status: "running", created: "2026-01-02 02:00:00" }))
          )
          yield* sql.unsafe(`CREATE FUNCTION zombie() RETURNS trigger LANGUAGE plpgsql AS $$
          BEGIN IF OLD.id = 7 THEN RETURN NULL; END IF;
          IF OLD.id = 8 THEN RAISE EXCEPTION 'build 8 may not change'; END IF; RETURN NEW; END $$`)
          for (const partition of ["ci_builds", "gitlab_partitions_dynamic.ci_builds_101"]) {
            yield* sql.unsafe(
              `CREATE TRIGGER zombie BEFORE UPDATE ON ${partition} FOR EACH ROW EXECUTE FUNCTION zombie()`
            )
          }
          const release = yield* holdLocks((other) => other`SELECT 1 FROM p_ci_builds WHERE id = 9 FOR UPDATE`)
          for (let round = 1; round <= 2; round++) {
            const summary = yield* DropRunningBuilds.run.pipe(
              asRun("drop-running-builds"),
              Effect.timeout("60 seconds")
            )
            assert.deepStrictEqual(
              [summary.dropped, summary.refused, summary.skippedLocked, summary.doomed],
              round === 1 ? [247, 2, 1, 0] : [0, 2, 1, 0]
            )
            assert.strictEqual(summary.batches, round === 1 ? 3 : 1)
          }
          const left = yield* sql<{ id: string }>`SELECT id::text FROM p_ci_builds WHERE status = 'running' ORDER BY id`
          assert.deepStrictEqual(left.map((r) => Number(r.id)), [7, 8, 9])
          yield* release
          // Once the other transaction ends, the next run fails the row it held.
          const last = yield* DropRunningBuilds.run.pipe(asRun("drop-running-builds"))
          assert.deepStrictEqual([last.dropped, last.refused, last.skippedLocked], [1, 2, 0])
        })
      ),
    120_000
  )
})
