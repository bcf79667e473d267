/**
 * Migration 0013, in every database Sweeper migrates (main's, and ci's on a decomposed GitLab, as
 * 0009): the job outbox as one row per page write, `sweeper_job_outbox_batches`, instead of one row
 * per job in `sweeper_job_outbox`. A 1000-build page owes about 1,500 jobs; writing 1,500 rows (and
 * their index entries) was 5 ms of the page's statement, and the relay's claim and DELETE of them
 * 40 ms a round on the other core (BENCHMARKS.md, 2026-11-26 late). One row of a few kilobytes
 * is written, claimed and deleted as one.
 *
 * A new table, not new columns on the old one: a process of the previous release (a rolling upgrade,
 * or a rollback) relays `sweeper_job_outbox` as it knows it, and a row there without worker, queue
 * and args would be pushed by it as a job of no class and deleted, a job lost. Here it never sees
 * the new rows: they wait for a relay of this release, which every process that writes them runs.
 * The old table stays, and this release's relay keeps draining it: rows left there by the previous
 * release, and rows such a process still writes during the upgrade, each relayed once as before
 * (JobOutbox.ts). Nothing is copied over: a copy would be a second row of the same job, and the
 * markers are per batch, so both would be pushed.
 */
import * as Effect from "effect/Effect"
import * as SqlClient from "effect/sql/SqlClient"

/**
 * `jobs`: the page's jobs in push order, as runs of one worker and queue:
 * `[{"worker": "PipelineProcessWorker", "queue": "default", "args": [[500], [501]]}, …]`, each
 * element of `args` one job's arguments. `size` is the number of jobs. `batch` names the write as in
 * the old table (the Redis markers are per queue and batch); `id` orders the writes.
 */
export const jobOutboxBatches = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE TABLE IF NOT EXISTS sweeper_job_outbox_batches (
    id bigserial PRIMARY KEY,
    batch uuid NOT NULL DEFAULT gen_random_uuid(),
    jobs jsonb NOT NULL,
    size integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    claimed_at timestamptz NULL,
    claimed_by uuid NULL
  )`
})
