/**
 * stuck-export-jobs: queued/started export jobs, half of them with a live Sidekiq status key and
 * half whose Sidekiq job is gone (stuck).
 *   raw        one SELECT, one pipelined MGET of every status key, one UPDATE of the completed ids
 *              with one ExportJobFailed row per failed job (Sweeper's stream, type and payload, a run
 *              id) INSERTed in the same statement; no fence, claim, re-read or relation-export check.
 *              It checks it wrote exactly one ExportJobFailed row per failed job.
 *   raw-no-ledger  the same without the event rows (the baseline before 2026-11-26 late)
 *   per-record the Ruby loop: for each job a GET of its status key, and an UPDATE (own commit) if gone
 */
import { PgClient } from "@effect/sql-pg"
import { Effect } from "effect"
import { performance } from "node:perf_hooks"
import { jobStatusKey } from "../../src/domain/SidekiqStatus.ts"
import { StuckExportJobs } from "../../src/programs/StuckExportJobs.ts"
import { seedExportJobsWithStatuses } from "../../src/simulator/Fixtures.ts"
import type { PhaseContext, Scenario } from "../support/compare.ts"
import { fmt } from "../support/harness.ts"
import { expectLedgerRows, rawRunId } from "../support/ledger.ts"
import { runOnce } from "./platform.ts"

interface Size {
  readonly active: number
}

const NOW = new Date("2026-01-01T05:00:00Z")
const MGET_SLICE = 1_000

const seed = (size: Size) => (context: PhaseContext) =>
  seedExportJobsWithStatuses(context.redis, { active: size.active, now: NOW })

/**
 * The raw limit: one SELECT, one pipelined MGET of every status key, then one UPDATE of the
 * completed ids with (with `ledger`) the INSERT of each failed job's ExportJobFailed row in the same
 * statement: the row ExportJobsSql.failMany writes (stream `export_job:<id>`, `{id, jid, project_id}`,
 * a run id). No fence, claim, re-read or relation-export check.
 */
const rawFail = (ledger: boolean) => (context: PhaseContext) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const runId = rawRunId()
    const start = performance.now()
    const jobs = yield* sql<{ id: string; jid: string }>`SELECT id, jid FROM project_export_jobs WHERE status IN (0, 1)`
    const pipeline = context.redis.pipeline()
    for (let first = 0; first < jobs.length; first += MGET_SLICE) {
      pipeline.mget(jobs.slice(first, first + MGET_SLICE).map((job) => jobStatusKey(job.jid)))
    }
    const replies = (yield* Effect.promise(() => pipeline.exec())) ?? []
    const values = replies.flatMap(([, value]) => value as Array<string | null>)
    const completed = jobs.filter((_, i) => values[i] === null).map((job) => Number(job.id))
    const logged = ledger
      ? sql`, logged AS (
        INSERT INTO sweeper_events (stream, type, data, run_id, occurred_at)
        SELECT 'export_job:' || id, 'ExportJobFailed',
          jsonb_build_object('id', id, 'jid', jid, 'project_id', project_id),
          ${runId}::uuid, ${NOW}::timestamptz
        FROM failed ORDER BY id)`
      : sql``
    const rows = yield* sql<{ n: string }>`
      WITH failed AS (
        UPDATE project_export_jobs SET status = 3, updated_at = ${NOW}
        WHERE id IN (SELECT value::bigint FROM jsonb_array_elements_text(${sql.json(completed)})) AND status IN (0, 1)
        RETURNING id, jid, project_id)${logged}
      SELECT count(*) AS n FROM failed`
    const seconds = (performance.now() - start) / 1000
    const repaired = Number(rows[0]!.n)
    const events = ledger ? yield* expectLedgerRows("ExportJobFailed", repaired) : 0
    return { repaired, seconds, notes: { events } }
  })

export const scenario: Scenario<Size> = {
  name: "stuck-export-jobs",
  description: "export jobs whose Sidekiq job completed without finishing them, failed",
  sizes: {
    // 5 k to fail: five slices, so the run guard's fixed cost does not decide the ratio; small
    // enough for CI's smoke run (the per-record baseline is the slow phase).
    small: { active: 10_000 },
    full: { active: 200_000 }
  },
  describeSize: (size) => `${fmt(size.active)} active jobs, ${fmt(size.active / 2)} completed`,
  seed: (size, context) => seed(size)(context),

  sweeper: () => (context) =>
    Effect.gen(function*() {
      const { summary, seconds } = yield* runOnce(StuckExportJobs, context, { now: NOW })
      return { repaired: Number(summary.failed ?? 0), seconds }
    }),

  raw: () => rawFail(true),
  rawNoLedger: () => rawFail(false),

  perRecord: () => (context) =>
    Effect.gen(function*() {
      const sql = yield* PgClient.PgClient
      const jobs = yield* sql<
        { id: string; jid: string }
      >`SELECT id, jid FROM project_export_jobs WHERE status IN (0, 1) ORDER BY id`
      let repaired = 0
      for (const job of jobs) {
        const status = yield* Effect.promise(() => context.redis.get(jobStatusKey(job.jid)))
        if (status !== null) continue
        const updated = yield* sql<{ id: string }>`
          UPDATE project_export_jobs SET status = 3, updated_at = ${NOW} WHERE id = ${job.id} AND status IN (0, 1) RETURNING id`
        repaired += updated.length
      }
      return { repaired }
    })
}
