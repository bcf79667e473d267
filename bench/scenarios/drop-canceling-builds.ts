/**
 * drop-canceling-builds: a ci_builds table of finished builds over 60 days with every 10th build
 * stuck in canceling (plus canceling bridges and fresh canceling builds that must stay), about 20
 * builds a pipeline. Every phase does a drop's whole work, as GitLab's `drop!` does it: the row
 * (with `processed`), the build's runner-queue and running-build rows deleted, and its jobs pushed
 * to Sidekiq (PipelineProcessWorker per pipeline, Ci::BuildFinishedWorker per build).
 *   raw        one guarded UPDATE of every stuck build with the DELETEs in the same statement, then
 *              the jobs LPUSHed in slices of 1000 (the "raw limit": no outbox, no marker)
 *   per-record GitLab's loop: a keyset page of 100, then per build one UPDATE and its DELETEs in
 *              its own commit, then its two jobs pushed (GitLab's run_after_commit)
 * Extras: a run with nothing to do right after the large repair (dead index entries, no VACUUM)
 * and after VACUUM — the "< 50 ms" figures.
 */
import { PgClient } from "@effect/sql-pg"
import { DateTime, Effect, Option } from "effect"
import { performance } from "node:perf_hooks"
import { DROP_BATCH_SIZE, DROP_BATCH_SIZE_MAX, FailureReason } from "../../src/domain/Build.ts"
import { queueKey, sidekiqJob } from "../../src/domain/Sidekiq.ts"
import { stuckCancelingQuery } from "../../src/layers/postgres/BuildsSql.ts"
import { DropCancelingBuilds } from "../../src/programs/DropCancelingBuilds.ts"
import { seedBuildsWithStuckCanceling } from "../../src/simulator/Fixtures.ts"
import type { PhaseContext, Scenario } from "../support/compare.ts"
import { fmt } from "../support/harness.ts"
import { expectLedgerRows, rawRunId } from "../support/ledger.ts"
import { runOnce, succeeded, withSweeper } from "./platform.ts"

interface Size {
  readonly rows: number
  readonly stuckEvery: number
}

const NOW = new Date("2026-01-01T05:00:00Z")
const CUTOFF = new Date(NOW.getTime() - 3_600_000)

const seed = (size: Size) => seedBuildsWithStuckCanceling({ rows: size.rows, stuckEvery: size.stuckEvery, now: NOW })

const PER_RECORD_PAGE = 100

/**
 * The Sidekiq jobs of dropped builds in GitLab's wire format: PipelineProcessWorker per distinct
 * pipeline (`distinct`: once per statement, as Sweeper; GitLab's own loop pushes one per build) and
 * Ci::BuildFinishedWorker per build.
 */
const jobsOf = (rows: ReadonlyArray<{ id: string; pipeline_id: string | null }>, distinct = true) => {
  const at = NOW.getTime()
  const job = (workerClass: string, arg: number, n: number) =>
    JSON.stringify(
      sidekiqJob({
        workerClass,
        args: [arg],
        queue: "default",
        jid: n.toString(16).padStart(24, "0"),
        nowMillis: at,
        extra: { retry: 3 }
      })
    )
  const pipelines = rows.flatMap((row) => row.pipeline_id === null ? [] : [Number(row.pipeline_id)])
  return [
    ...(distinct ? [...new Set(pipelines)] : pipelines).map((p, i) => job("PipelineProcessWorker", p, i)),
    ...rows.map((row, i) => job("Ci::BuildFinishedWorker", Number(row.id), 1_000_000 + i))
  ]
}

/** LPUSH in slices of 1000, one pipeline each (what a bulk push costs without an outbox or a marker). */
const pushJobs = async (context: PhaseContext, jobs: ReadonlyArray<string>) => {
  await context.redis.sadd("queues", "default")
  for (let i = 0; i < jobs.length; i += 1000) await context.redis.lpush(queueKey("default"), ...jobs.slice(i, i + 1000))
}

/** EXPLAIN (ANALYZE, BUFFERS) of the batch's first page query: its time and the buffers it touched. */
const explainScan = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  const query = stuckCancelingQuery(sql, {
    cutoff: DateTime.makeUnsafe(CUTOFF),
    after: Option.none(),
    limit: DROP_BATCH_SIZE
  })
  const plan = yield* sql<
    { "QUERY PLAN": ReadonlyArray<{ readonly "Execution Time": number; readonly Plan: Record<string, number> }> }
  >`
    EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ${query}`
  const root = plan[0]!["QUERY PLAN"][0]!
  const buffers = (root.Plan["Shared Hit Blocks"] ?? 0) + (root.Plan["Shared Read Blocks"] ?? 0)
  return `${root["Execution Time"].toFixed(1)} ms, ${fmt(buffers)} buffers`
})

/**
 * SWEEPER_DROP_BATCH_SIZE as the bench's environment says (e.g. 1000), through the settings like
 * any other configuration; unset keeps the default 100.
 */
const settings = (): { readonly dropBatchSize?: number } => {
  const raw = process.env.SWEEPER_DROP_BATCH_SIZE
  if (raw === undefined || raw === "") return {}
  const size = Number(raw)
  if (!Number.isInteger(size) || size < 1 || size > DROP_BATCH_SIZE_MAX) {
    throw new Error(`SWEEPER_DROP_BATCH_SIZE: ${raw} is not an integer 1..${DROP_BATCH_SIZE_MAX}`)
  }
  return { dropBatchSize: size }
}

/**
 * The raw limit: one guarded UPDATE of every stuck build with GitLab's queue-row DELETEs and (with
 * `ledger`) the INSERT of each dropped build's BuildDropped row in the same statement, then the jobs
 * LPUSHed in slices of 1000. The row is the one Sweeper's page statement writes
 * (BuildsSql.buildEventFields under the default reason set: stream `build:<id>`, `{id, project_id,
 * runner_id, pipeline_id when it has one, failure_reason: 3}`, a run id, the decision time).
 */
const rawDrop = (ledger: boolean) => (context: PhaseContext) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const runId = rawRunId()
    const at = sql`${NOW}::timestamptz AT TIME ZONE 'UTC'`
    const logged = ledger
      ? sql`, logged AS (
        INSERT INTO sweeper_events (stream, type, data, run_id, occurred_at)
        SELECT 'build:' || id, 'BuildDropped', jsonb_build_object('id', id, 'project_id', project_id,
            'runner_id', runner_id, 'failure_reason', ${FailureReason.stuck_or_timeout_failure}::int)
          || CASE WHEN commit_id IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('pipeline_id', commit_id) END,
          ${runId}::uuid, ${NOW}::timestamptz
        FROM dropped ORDER BY id)`
      : sql``
    const start = performance.now()
    const rows = yield* sql<{ id: string; pipeline_id: string | null }>`
      WITH dropped AS (
        UPDATE ci_builds SET status = 'failed', failure_reason = ${FailureReason.stuck_or_timeout_failure},
          finished_at = ${at}, updated_at = ${at},
          lock_version = lock_version + 1, processed = coalesce(retried, false)
        WHERE status = 'canceling' AND type = 'Ci::Build'
          AND created_at < ${CUTOFF}::timestamptz AT TIME ZONE 'UTC'
          AND updated_at < ${CUTOFF}::timestamptz AT TIME ZONE 'UTC'
        RETURNING id, project_id, runner_id, commit_id),
      unqueued AS (DELETE FROM ci_pending_builds q USING dropped d WHERE q.build_id = d.id),
      untracked AS (DELETE FROM ci_running_builds q USING dropped d WHERE q.build_id = d.id)${logged}
      SELECT id, commit_id AS pipeline_id FROM dropped`
    yield* Effect.promise(() => pushJobs(context, jobsOf(rows)))
    const seconds = (performance.now() - start) / 1000
    const events = ledger ? yield* expectLedgerRows("BuildDropped", rows.length) : 0
    // Not timed: what the first scan after a repair that leaves its dead index entries behind
    // costs (the Sweeper phase revisits its pages; this one does not).
    const first = yield* explainScan
    const jobs = yield* Effect.promise(() => context.redis.llen(queueKey("default")))
    return { repaired: rows.length, seconds, notes: { "first scan after": first, jobs, events } }
  })

export const scenario: Scenario<Size> = {
  name: "drop-canceling-builds",
  description: "builds stuck in canceling, failed with stuck_or_timeout_failure, their jobs pushed to Sidekiq",
  sizes: {
    // 10 k stuck: enough pages (100 at the default size) that the run guard's fixed cost (≈ 5 ms)
    // does not decide the ratio, small enough for CI's smoke run.
    small: { rows: 100_000, stuckEvery: 10 },
    full: { rows: 1_000_000, stuckEvery: 10 }
  },
  describeSize: (size) => `${fmt(size.rows)} builds, ${fmt(Math.floor(size.rows / size.stuckEvery))} stuck`,
  seed: (size) => seed(size),

  sweeper: () => (context) =>
    Effect.gen(function*() {
      const { summary, seconds } = yield* runOnce(DropCancelingBuilds, context, { now: NOW, settings: settings() })
      const dropped = Number(summary.dropped ?? 0) + Number(summary.doomed ?? 0)
      const jobs = yield* Effect.promise(() => context.redis.llen(queueKey("default")))
      return {
        repaired: dropped,
        seconds,
        notes: { pages: Number(summary.batches ?? 0), batchSize: settings().dropBatchSize ?? DROP_BATCH_SIZE, jobs }
      }
    }),

  raw: () => rawDrop(true),
  rawNoLedger: () => rawDrop(false),

  perRecord: () => (context) =>
    Effect.gen(function*() {
      const sql = yield* PgClient.PgClient
      let repaired = 0
      let pages = 0
      let after: { created_at: string; project_id: string; id: string } | undefined
      while (true) {
        const keyset = after === undefined
          ? sql``
          : sql`AND (created_at, project_id, id) > (${after.created_at}::timestamp, ${after.project_id}, ${after.id})`
        const page = yield* sql<{ id: string; project_id: string; lock_version: number; created_at: string }>`
          SELECT id, project_id, lock_version, to_char(created_at, 'YYYY-MM-DD HH24:MI:SS.US') AS created_at FROM ci_builds
          WHERE status = 'canceling' AND type = 'Ci::Build'
            AND created_at < ${CUTOFF}::timestamptz AT TIME ZONE 'UTC' AND updated_at < ${CUTOFF}::timestamptz AT TIME ZONE 'UTC'
            ${keyset}
          ORDER BY created_at, project_id, id LIMIT ${PER_RECORD_PAGE}`
        if (page.length === 0) break
        pages++
        for (const build of page) {
          const updated = yield* sql.withTransaction(Effect.gen(function*() {
            const rows = yield* sql<{ id: string; pipeline_id: string | null }>`
              UPDATE ci_builds SET status = 'failed', failure_reason = 3,
                finished_at = ${NOW}::timestamptz AT TIME ZONE 'UTC', updated_at = ${NOW}::timestamptz AT TIME ZONE 'UTC',
                lock_version = lock_version + 1, processed = coalesce(retried, false)
              WHERE id = ${build.id} AND status = 'canceling' AND lock_version = ${build.lock_version}
              RETURNING id, commit_id AS pipeline_id`
            if (rows.length > 0) {
              yield* sql`DELETE FROM ci_pending_builds WHERE build_id = ${build.id}`
              yield* sql`DELETE FROM ci_running_builds WHERE build_id = ${build.id}`
            }
            return rows
          }))
          // After commit, as GitLab's run_after_commit: its two jobs, one push each.
          for (const job of jobsOf(updated, false)) {
            yield* Effect.promise(() => context.redis.lpush(queueKey("default"), job))
          }
          repaired += updated.length
        }
        after = page[page.length - 1]!
      }
      return { repaired, notes: { pages, jobs: yield* Effect.promise(() => context.redis.llen(queueKey("default"))) } }
    }),

  extras: () => (context) =>
    Effect.gen(function*() {
      const sql = yield* PgClient.PgClient
      const [afterRepair, afterVacuum, scan] = yield* withSweeper(context, { now: NOW, settings: settings() }, (run) =>
        Effect.gen(function*() {
          const timedRun = Effect.gen(function*() {
            const { result, seconds } = yield* run(DropCancelingBuilds)
            const summary = yield* succeeded(result)
            return { ms: seconds * 1000, dropped: Number(summary.dropped ?? 0) }
          })
          yield* timedRun
          const repaired = yield* timedRun
          const plan = yield* explainScan.pipe(Effect.provideService(PgClient.PgClient, sql))
          yield* sql`VACUUM ANALYZE ci_builds`
          return [repaired, yield* timedRun, plan] as const
        }))
      return {
        repaired: 0,
        notes: {
          "nothing to do, right after the repair (run wall time)": `${
            afterRepair.ms.toFixed(1)
          } ms (${afterRepair.dropped} dropped)`,
          "its scan then (EXPLAIN ANALYZE)": scan,
          "nothing to do, after VACUUM (run wall time)": `${
            afterVacuum.ms.toFixed(1)
          } ms (${afterVacuum.dropped} dropped)`
        }
      }
    })
}
