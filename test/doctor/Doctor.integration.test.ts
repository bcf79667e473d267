/**
 * The schema side of "beside a real GitLab" through the real CLI, as an operator runs it:
 * read-only commands never migrate (one line, nothing created), `migrate --plan` applies nothing, a
 * missing column stops start-up with one line, `sweeper doctor` on both builds layouts and on the
 * embedded default, and `doctor --apply-indexes` building its index concurrently (writes go on).
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Redacted, Schedule, type Scope } from "effect"
import type { SqlClient } from "effect/sql"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import type { DoctorReport } from "../../src/doctor/Doctor.ts"
import { layerServer } from "../../src/layers/postgres/Postgres.ts"
import { runCli } from "../support/cli.ts"
import { allIndexes, createGitLabSchema, type GitLabLayout } from "../support/gitlabSchema.ts"
import { freshDatabase } from "../support/postgres.ts"
import { freshRedisUrl } from "../support/redis.ts"

const onDatabase = <A, E>(
  url: string,
  effect: Effect.Effect<A, E, PgClient.PgClient | SqlClient.SqlClient | Scope.Scope>
) => Effect.scoped(Effect.provide(effect, layerServer(Redacted.make(url))))

/** A fresh database (GitLab's layout when given) and a Redis db; yields the env for the CLI. */
const platform = (layout?: GitLabLayout) =>
  Effect.gen(function*() {
    const { url } = yield* freshDatabase
    if (layout !== undefined) yield* onDatabase(url, createGitLabSchema(layout))
    const redisUrl = yield* freshRedisUrl
    return {
      url,
      env: { DATABASE_URL: url, REDIS_URL: redisUrl, SWEEPER_DATA_DIR: join(tmpdir(), "sweeper-doctor-it") }
    }
  })

// Generous: a loaded CI machine can take a minute to start a process (PGlite's WASM most of all).
/** The ledger's online steps, run after the transactional migrations, outside any transaction. */
const ONLINE = [
  "0004_build index_sweeper_events_on_occurred_at concurrently",
  "0004_build index_sweeper_events_on_batch_streams concurrently",
  "0005_build index_sweeper_events_on_run_id_and_id concurrently",
  "0006_backfill sweeper_runs in id ranges",
  "0006_drop index_sweeper_events_on_run_id concurrently",
  "0012_build index_sweeper_events_on_stream_hash concurrently",
  "0012_drop index_sweeper_events_on_stream_and_id concurrently"
]

const CLI_TIMEOUT = 150_000
const cli = (args: ReadonlyArray<string>, env: Record<string, string>) =>
  Effect.promise(() => runCli(args, env, CLI_TIMEOUT))

const tables = (url: string) =>
  onDatabase(
    url,
    Effect.gen(function*() {
      const sql = yield* PgClient.PgClient
      const rows = yield* sql<{ name: string }>`SELECT table_name AS name FROM information_schema.tables
      WHERE table_schema = 'public' ORDER BY table_name`
      return rows.map((r) => r.name)
    })
  )

const oneLine = (stderr: string) => {
  const lines = stderr.trim().split("\n")
  assert.lengthOf(lines, 1, stderr)
  return lines[0]!
}

describe("sweeper doctor / migrate --plan / read-only commands", () => {
  it.live(
    "read-only commands on an unmigrated database fail with one line and create nothing",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const empty = yield* platform()
        const gitlab = yield* platform({ partitioned: true })
        const gitlabTables = yield* tables(gitlab.url)
        const gitlabIndexes = yield* onDatabase(gitlab.url, allIndexes)
        const runs = [
          ...[["status"], ["events"], ["run", "drop-canceling-builds", "--dry-run"], ["doctor"]].map((args) =>
            [args, empty.env] as const
          ),
          [["status"], gitlab.env] as const
        ]
        for (const [args, env] of runs) {
          {
            const result = yield* cli(args, env)
            assert.strictEqual(result.code, 2, `${args.join(" ")}: ${result.stderr}`)
            assert.strictEqual(result.stdout, "")
            assert.match(
              oneLine(result.stderr),
              /^sweeper: Sweeper's tables are missing or out of date \(pending: .*0002_sweeper_tables.*\): run `sweeper migrate`$/
            )
          }
        }
        assert.deepStrictEqual(yield* tables(empty.url), [])
        assert.deepStrictEqual(yield* tables(gitlab.url), gitlabTables)
        assert.deepStrictEqual(yield* onDatabase(gitlab.url, allIndexes), gitlabIndexes)
      })),
    600_000
  )

  it.live(
    "migrate --plan lists pending migrations and applies nothing; a missing column stops start-up with one line",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const { url, env } = yield* platform({ partitioned: true })
        const before = yield* tables(url)
        const plan = yield* cli(["migrate", "--plan"], env)
        assert.strictEqual(plan.code, 0, plan.stderr)
        assert.strictEqual(
          plan.stdout.trim(),
          "Pending (gitlab mode, detected): 0002_sweeper_tables, 0003_schema_ownership, 0004_event_retention_indexes, "
            + "0005_console_rollup, 0006_ledger_rollup, 0008_event_relay, 0009_transition_tables, 0010_relay_keys, "
            + "0011_shadow_candidates, 0013_job_outbox_batches, "
            + ONLINE.map((step) => `${step} (online)`).join(", ")
        )
        assert.deepStrictEqual(yield* tables(url), before)

        const migrated = yield* cli(["migrate"], env)
        assert.strictEqual(migrated.code, 0, migrated.stderr)
        assert.strictEqual(
          migrated.stdout.trim(),
          "Applied (gitlab mode, detected): 0002_sweeper_tables, 0003_schema_ownership, 0004_event_retention_indexes, "
            + "0005_console_rollup, 0006_ledger_rollup, 0008_event_relay, 0009_transition_tables, 0010_relay_keys, "
            + "0011_shadow_candidates, 0013_job_outbox_batches, "
            + ONLINE.join(", ")
        )
        assert.strictEqual(
          (yield* cli(["migrate", "--plan"], env)).stdout.trim(),
          "Schema is up to date (gitlab mode, detected)"
        )
        const status = yield* cli(["status", "--json"], env)
        assert.strictEqual(status.code, 0, status.stderr)

        yield* onDatabase(
          url,
          Effect.flatMap(PgClient.PgClient, (sql) => sql`ALTER TABLE project_export_jobs DROP COLUMN jid`)
        )
        for (const args of [["run", "stuck-export-jobs"]]) {
          const broken = yield* cli(args, env)
          assert.strictEqual(broken.code, 2, broken.stderr)
          assert.strictEqual(
            oneLine(broken.stderr),
            "sweeper: column project_export_jobs.jid is missing (a batch needs it as text)"
          )
        }
      })),
    600_000
  )

  it.live(
    "doctor on GitLab's partitioned layout: gitlab mode, every partition, GitLab's indexes serve the scans, stores and clocks",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const { env } = yield* platform({ partitioned: true })
        assert.strictEqual((yield* cli(["migrate"], env)).code, 0)
        const result = yield* cli(["doctor", "--json"], env)
        assert.strictEqual(result.code, 0, result.stderr)
        const report = JSON.parse(result.stdout) as DoctorReport
        assert.isTrue(report.ok)
        assert.strictEqual(report.failureReasons.set, "legacy")
        // GitLab 19's reasons when the setting says so, named in the human report.
        const nineteen = yield* cli(["doctor"], {
          ...env,
          SWEEPER_FAILURE_REASONS: "gitlab-19",
          SWEEPER_TRANSITION_QUEUES: "worker"
        })
        assert.include(nineteen.stdout, "failure reasons: gitlab-19")
        assert.include(nineteen.stdout, "no_updates_running (27)")
        assert.include(nineteen.stdout, "Ci::BuildFinishedWorker → queue:pipeline_processing:ci_build_finished")
        assert.deepStrictEqual(report.problems, [])
        assert.strictEqual(report.postgres.schemaMode, "gitlab")
        assert.strictEqual(report.postgres.schemaModeSource, "detected")
        assert.strictEqual(report.postgres.buildsTable, "p_ci_builds")
        assert.deepStrictEqual(report.postgres.partitions, [
          "public.ci_builds",
          "gitlab_partitions_dynamic.ci_builds_101"
        ])
        assert.strictEqual(report.postgres.columnsChecked, 25)
        // What a drop does here: every side table held beside the builds, the jobs on `default`.
        assert.strictEqual(report.transitions.database, "main")
        assert.deepStrictEqual(report.transitions.tables.filter((t) => !t.held), [])
        assert.deepStrictEqual(report.transitions.tables.map((t) => t.table), [
          "ci_pending_builds",
          "ci_running_builds",
          "ci_builds_runner_session",
          "ci_resources",
          "p_ci_pipelines",
          "sweeper_job_outbox_batches"
        ])
        assert.deepStrictEqual(Object.values(report.transitions.queues), ["default", "default", "default"])
        assert.deepStrictEqual(report.scans.map((s) => [s.batch, s.table, s.served, s.recommended.length]), [
          ["stuck-export-jobs", "project_export_jobs", true, 0],
          ["drop-canceling-builds", "p_ci_builds", true, 0],
          ["drop-pending-builds", "p_ci_builds", true, 0],
          ["drop-pending-builds", "p_ci_builds", true, 0],
          ["drop-pending-builds", "p_ci_builds", true, 0],
          ["drop-running-builds", "p_ci_builds", true, 0],
          ["drop-scheduled-builds", "p_ci_builds", true, 0],
          ["prune-events", "sweeper_events", true, 0],
          ["reschedule-stuck-issue-rebalances", "namespaces", true, 0],
          ["reschedule-stuck-issue-rebalances", "projects", true, 0]
        ])
        assert.isAbove(report.scans[1]!.plan.length, 0)
        assert.deepStrictEqual(report.redis.map((r) => [r.store, r.kind, r.reachable]), [
          ["SharedState", "single", true],
          ["Queues", "single", true],
          ["QueuesMetadata", "single", true]
        ])
        for (const store of report.redis) assert.isNumber(store.clockSkewMs)
        assert.isNumber(report.postgres.clockSkewMs)

        const human = yield* cli(["doctor"], env)
        assert.strictEqual(human.code, 0, human.stderr)
        assert.include(human.stdout, "schema: gitlab (detected)")
        assert.include(
          human.stdout,
          "builds: p_ci_builds (partitions: public.ci_builds, gitlab_partitions_dynamic.ci_builds_101)"
        )
        assert.include(human.stdout, "served by ci_builds_status_created_at_project_id_idx")
        assert.include(human.stdout, "Transitions on main (what a drop does beside the build's row, as GitLab's drop!)")
        assert.include(human.stdout, "a build leaving pending: its ci_pending_builds row deleted")
        assert.include(human.stdout, "PipelineProcessWorker → queue:default")
        assert.strictEqual(human.stdout.trim().split("\n").at(-1), "OK")
      })),
    600_000
  )

  it.live(
    "doctor on a standalone database and on the embedded default: a clean report",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const { env } = yield* platform()
        assert.strictEqual((yield* cli(["migrate"], env)).code, 0)
        const standalone = yield* cli(["doctor"], env)
        assert.strictEqual(standalone.code, 0, standalone.stderr)
        assert.include(standalone.stdout, "schema: standalone (detected)")
        assert.include(standalone.stdout, "served by index_ci_builds_canceling_on_created_at_project_id_id")
        assert.notInclude(standalone.stdout, "NOT served")
        assert.strictEqual(standalone.stdout.trim().split("\n").at(-1), "OK")

        const dataDir = mkdtempSync(join(tmpdir(), "sweeper-doctor-embedded-"))
        yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(dataDir, { recursive: true, force: true })))
        const embedded = yield* cli(["doctor", "--json"], { SWEEPER_DATA_DIR: dataDir })
        assert.strictEqual(embedded.code, 0, embedded.stderr)
        const report = JSON.parse(embedded.stdout) as DoctorReport
        assert.isTrue(report.ok)
        assert.strictEqual(report.postgres.schemaMode, "standalone")
        assert.isTrue(report.scans.every((s) => s.served))
        assert.deepStrictEqual(report.redis.map((r) => [r.kind, r.reachable]), [["in-memory", true], [
          "in-memory",
          true
        ], ["in-memory", true]])
      })),
    600_000
  )

  it.live(
    "doctor --apply-indexes builds the recommended index concurrently on every partition, writes going on meanwhile",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const { url, env } = yield* platform({ partitioned: true, withoutStatusIndex: true })
        assert.strictEqual((yield* cli(["migrate"], env)).code, 0)
        const before = JSON.parse((yield* cli(["doctor", "--json"], env)).stdout) as DoctorReport
        const canceling = before.scans.find((s) => s.batch === "drop-canceling-builds")!
        assert.isFalse(canceling.served)
        assert.lengthOf(canceling.recommended, 5)
        assert.match(
          canceling.recommended[0]!,
          /^CREATE INDEX CONCURRENTLY IF NOT EXISTS index_ci_builds_canceling_on_created_at_project_id ON public\.ci_builds /
        )

        yield* onDatabase(
          url,
          Effect.gen(function*() {
            const sql = yield* PgClient.PgClient
            // An open transaction writing to partition 100: a concurrent build must wait for it to end
            // without taking a lock that stops other writers.
            const release = yield* Deferred.make<void>()
            const holding = yield* Deferred.make<void>()
            const holder = yield* sql.withTransaction(Effect.gen(function*() {
              yield* sql`INSERT INTO ci_builds (id, partition_id, project_id, status, type, created_at, updated_at)
            VALUES (900001, 100, 1, 'running', 'Ci::Build', now(), now())`
              yield* Deferred.succeed(holding, undefined)
              yield* Deferred.await(release)
            })).pipe(Effect.forkScoped)
            yield* Deferred.await(holding)

            const apply = yield* Effect.promise(() => runCli(["doctor", "--apply-indexes", "--json"], env, CLI_TIMEOUT))
              .pipe(Effect.forkScoped)
            // Wait until the index build is waiting on the open transaction; then, meanwhile, another
            // writer gets through (a plain CREATE INDEX would queue it behind its lock until lock_timeout).
            // The holder is released whatever happens, so a failure here fails fast instead of hanging.
            yield* Effect.gen(function*() {
              yield* sql<{ n: string }>`SELECT count(*) AS n FROM pg_stat_activity
            WHERE query LIKE 'CREATE INDEX%' AND wait_event_type = 'Lock'`.pipe(
                Effect.map((rows) => Number(rows[0]!.n)),
                Effect.repeat({ until: (n) => n > 0, schedule: Schedule.spaced("100 millis") })
              )
              yield* sql.withTransaction(Effect.gen(function*() {
                yield* sql`SET LOCAL lock_timeout = '10s'`
                yield* sql`INSERT INTO ci_builds (id, partition_id, project_id, status, type, created_at, updated_at)
              VALUES (900002, 100, 1, 'running', 'Ci::Build', now(), now())`
              }))
            }).pipe(Effect.ensuring(Deferred.succeed(release, undefined)))
            yield* Deferred.succeed(release, undefined)
            yield* Fiber.join(holder)
            const applied = yield* Fiber.join(apply)
            assert.strictEqual(applied.code, 0, applied.stderr)
            const after = JSON.parse(applied.stdout) as DoctorReport
            assert.deepStrictEqual(after.applied, canceling.recommended)
            const served = after.scans.find((s) => s.batch === "drop-canceling-builds")!
            assert.isTrue(served.served)
            assert.deepStrictEqual(served.recommended, [])

            const valid = yield* sql<{ name: string; valid: boolean }>`
          SELECT c.relname AS name, i.indisvalid AS valid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
          WHERE c.relname LIKE 'index_%canceling%' ORDER BY c.relname`
            assert.deepStrictEqual(valid.map((r) => [r.name, r.valid]), [
              ["index_ci_builds_101_canceling_on_created_at_project_id", true],
              ["index_ci_builds_canceling_on_created_at_project_id", true],
              ["index_p_ci_builds_canceling_on_created_at_project_id", true]
            ])
          })
        )
        // Applying again changes nothing: nothing is recommended any more.
        const again = JSON.parse((yield* cli(["doctor", "--apply-indexes", "--json"], env)).stdout) as DoctorReport
        assert.deepStrictEqual(again.applied, [])
      })),
    600_000
  )
})
