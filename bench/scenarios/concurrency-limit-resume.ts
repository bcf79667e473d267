/**
 * concurrency-limit-resume with limit 0 (unlimited): one worker's deferred list holds GitLab's
 * `{args, context, buffered_at}` elements; all of them go back to its Sidekiq queue.
 *   raw        a Lua script that pops 5000 elements and pushes the Sidekiq jobs it builds with cjson,
 *              called until the list is empty (the issue's "Lua move building Sidekiq jobs"), each
 *              call followed by one INSERT of its ConcurrencyLimitJobsResumed row: Sweeper writes one
 *              per move (the journaled move's: `{worker, queue, count, limit, jids}`), not one per
 *              job, so the raw baseline does the same. It checks it wrote one row per call that
 *              moved jobs and that their counts sum to the jobs queued.
 *   raw-no-ledger  the script alone (the baseline before 2026-11-26 late)
 *   per-record GitLab's loop: LPOP one element, build its job, LPUSH it — two round trips a job
 * Repaired = jobs in queue:default afterwards.
 */
import { PgClient } from "@effect/sql-pg"
import { Duration, Effect } from "effect"
import { performance } from "node:perf_hooks"
import { workerKeys } from "../../src/domain/ConcurrencyLimit.ts"
import { queueKey } from "../../src/domain/Sidekiq.ts"
import { ConcurrencyLimitResume } from "../../src/programs/ConcurrencyLimitResume.ts"
import { seedDeferredJobs } from "../../src/simulator/Fixtures.ts"
import type { PhaseContext, Scenario } from "../support/compare.ts"
import { fmt } from "../support/harness.ts"
import { expectLedgerRows, rawRunId } from "../support/ledger.ts"
import { runOnce } from "./platform.ts"

interface Size {
  readonly jobs: number
}

const WORKER = "Releases::CreateEvidenceWorker"
const QUEUE = "default"
const keys = workerKeys(WORKER)
const RAW_MOVE = 5_000

const seed = (size: Size, context: PhaseContext) => seedDeferredJobs(context.redis, { worker: WORKER, jobs: size.jobs })

const queued = (context: PhaseContext) => Effect.promise(() => context.redis.llen(queueKey(QUEUE)))

// KEYS: deferred list, queue, queues set. ARGV: n, worker, queue, now, jid seed.
const RAW_SCRIPT = `
local items = redis.call('LPOP', KEYS[1], ARGV[1])
if not items then return 0 end
local now = tonumber(ARGV[4])
for i, raw in ipairs(items) do
  local deferred = cjson.decode(raw)
  local job = {
    class = ARGV[2], args = deferred.args, queue = ARGV[3], retry = true,
    jid = string.sub(redis.sha1hex(ARGV[5] .. ':' .. i), 1, 24),
    created_at = now, enqueued_at = now,
    concurrency_limit_resume = true, concurrency_limit_buffered_at = deferred.buffered_at
  }
  for k, v in pairs(deferred.context or {}) do job[k] = v end
  redis.call('LPUSH', KEYS[2], cjson.encode(job))
end
redis.call('SADD', KEYS[3], ARGV[3])
return #items`

// RAW_SCRIPT that also answers the jids it built, as a JSON array (empty list: nothing moved).
const RAW_SCRIPT_JIDS = RAW_SCRIPT
  .replace("if not items then return 0 end", "if not items then return '[]' end\nlocal jids = {}")
  .replace(
    "redis.call('LPUSH', KEYS[2], cjson.encode(job))",
    "jids[i] = job.jid\n  redis.call('LPUSH', KEYS[2], cjson.encode(job))"
  )
  .replace("return #items", "return cjson.encode(jids)")

/**
 * The raw limit: RAW_SCRIPT called until the list is empty; with `ledger`, after each call one
 * INSERT of its ConcurrencyLimitJobsResumed row (the row Sweeper's journaled move writes per move:
 * stream `concurrency_limit:<worker>`, `{worker, queue, count, limit: 0, jids}`, a run id), the jids
 * the script answered passed through as jsonb. No journal, reservation, marker or lease.
 */
const rawMove = (ledger: boolean) => (context: PhaseContext) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const runId = rawRunId()
    let moves = 0
    let events = 0
    const start = performance.now()
    while (true) {
      const call = moves++
      const args = [keys.deferred, queueKey(QUEUE), "queues", RAW_MOVE, WORKER, QUEUE, Date.now() / 1000, `raw-${call}`]
      if (!ledger) {
        const moved = yield* Effect.promise(() => context.redis.eval(RAW_SCRIPT, 3, ...args) as Promise<number>)
        if (moved === 0) break
        continue
      }
      const jids = yield* Effect.promise(() => context.redis.eval(RAW_SCRIPT_JIDS, 3, ...args) as Promise<string>)
      if (jids === "[]") break
      events++
      yield* sql`INSERT INTO sweeper_events (stream, type, data, run_id, occurred_at)
        SELECT ${`concurrency_limit:${WORKER}`}, 'ConcurrencyLimitJobsResumed', jsonb_build_object(
            'worker', ${WORKER}::text, 'queue', ${QUEUE}::text, 'count', jsonb_array_length(j), 'limit', 0, 'jids', j),
          ${runId}::uuid, now()
        FROM (SELECT ${jids}::jsonb AS j) AS moved`
    }
    const seconds = (performance.now() - start) / 1000
    const repaired = yield* queued(context)
    if (ledger) yield* expectLedgerRows("ConcurrencyLimitJobsResumed", events, repaired)
    return { repaired, seconds, notes: { scriptCalls: moves, events } }
  })

export const scenario: Scenario<Size> = {
  name: "concurrency-limit-resume",
  description: "deferred jobs of a throttled worker with limit 0 moved back to its queue",
  sizes: {
    small: { jobs: 20_000 },
    full: { jobs: 1_000_000 }
  },
  describeSize: (size) => `${fmt(size.jobs)} deferred jobs, limit 0`,
  seed: (size, context) => seed(size, context),

  sweeper: (size) => (context) =>
    Effect.gen(function*() {
      const { summary, seconds } = yield* runOnce(ConcurrencyLimitResume, context, {
        // Long enough to drain the list at one pass of 1000 a second, whatever the implementation.
        budget: Duration.seconds(Math.ceil(size.jobs / 1000) * 2 + 60),
        settings: { concurrencyLimits: { [WORKER]: { limit: 0, queue: QUEUE } } }
      })
      return { repaired: yield* queued(context), seconds, notes: { resumedJobs: Number(summary.resumedJobs ?? 0) } }
    }),

  raw: () => rawMove(true),
  rawNoLedger: () => rawMove(false),

  perRecord: () => (context) =>
    Effect.gen(function*() {
      yield* Effect.promise(async () => {
        let i = 0
        while (true) {
          const raw = await context.redis.lpop(keys.deferred)
          if (raw === null) break
          const deferred = JSON.parse(raw) as { args: unknown; context?: Record<string, unknown>; buffered_at?: number }
          const now = Date.now() / 1000
          await context.redis.lpush(
            queueKey(QUEUE),
            JSON.stringify({
              class: WORKER,
              args: deferred.args,
              jid: (i++).toString(16).padStart(24, "0"),
              queue: QUEUE,
              retry: true,
              created_at: now,
              enqueued_at: now,
              ...deferred.context,
              concurrency_limit_resume: true,
              concurrency_limit_buffered_at: deferred.buffered_at ?? null
            })
          )
        }
        await context.redis.sadd("queues", QUEUE)
      })
      return { repaired: yield* queued(context) }
    })
}
