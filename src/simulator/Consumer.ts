/**
 * A Sidekiq-style consumer for the queues Sweeper writes to: `Issues::RebalancingWorker` (a real
 * `relative_position` rebalance, then the rebalancer's own clean-up: SREM from the running set and
 * the `until_executed` claim released), the jobs a build drop pushes (`PipelineProcessWorker`: the
 * pipeline's status recomputed from its latest builds, Pipelines.ts; `Ci::BuildFinishedWorker` and
 * `AssignResourceFromResourceGroupWorker`: counted), and the throttled workers, run under GitLab's
 * concurrency limit the way its server middleware does:
 *
 * - a fresh job of a limited worker is deferred (RPUSH `{args, context, buffered_at}`) when jobs
 *   are already deferred or the worker is at its limit (HLEN executing + pending_resumed), else it
 *   runs;
 * - a resumed job (`concurrency_limit_resume`) always runs, and takes its reserved slot: its
 *   executing tracker field is written first, then `pending_resumed` is decremented, so for the
 *   instant in between the job counts twice rather than not at all;
 * - every job of a limited worker is tracked in `…:executing` (`<pid>:tid:<tid>` → start time) while
 *   it runs, and the consumer records the most it ever saw at once.
 *
 * Job starts of limited workers are serialised in this process (one mutex), so the consumer's own
 * threads never race each other past a limit: what the ledger records is Sweeper's doing.
 */
import { PgClient } from "@effect/sql-pg"
import * as Cause from "effect/Cause"
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import * as Semaphore from "effect/Semaphore"
import { parseCounter, parseLimitOverride, workerKeys } from "../domain/ConcurrencyLimit.ts"
import { RebalanceContainer, rebalanceMember, REBALANCING_QUEUE, REBALANCING_WORKER } from "../domain/Rebalancing.ts"
import { queueKey } from "../domain/Sidekiq.ts"
import {
  ASSIGN_RESOURCE_WORKER,
  BUILD_FINISHED_WORKER,
  PIPELINE_PROCESS_WORKER,
  type TransitionQueues
} from "../domain/TransitionJobs.ts"
import { duplicateKey } from "../layers/protocols/JobQueueShared.ts"
import { RebalancingState } from "../services/RebalancingState.ts"
import type { Ledger } from "./Ledger.ts"
import { processPipeline } from "./Pipelines.ts"
import { deferJob } from "./Seed.ts"
import { SimulatorStores } from "./Stores.ts"

const PoppedJob = Schema.fromJsonString(Schema.Struct({
  class: Schema.String,
  args: Schema.Array(Schema.Unknown),
  jid: Schema.String,
  concurrency_limit_resume: Schema.optionalKey(Schema.Boolean)
}))
const decodeJob = Schema.decodeUnknownOption(PoppedJob)

export interface ConsumerOptions {
  readonly ledger: Ledger
  /** Where a drop's jobs go (SWEEPER_TRANSITION_QUEUES), and the builds table they name builds of. */
  readonly transitionQueues: TransitionQueues
  readonly builds: "ci_builds" | "p_ci_builds"
  /** Limited workers: class name → configured limit and queue (a Redis `current_limit` wins). */
  readonly limited: Readonly<Record<string, { readonly limit: number; readonly queue: string }>>
  /** Concurrent fetchers ("Sidekiq threads"). */
  readonly threads: number
  /** How long one throttled job runs. */
  readonly jobMillis: number
}

/** `relative_position`s spread evenly over the integer range, in today's order (nulls last). */
const rebalance = Effect.fn("Consumer.rebalance")(function*(projectIds: ReadonlyArray<number>) {
  const sql = yield* PgClient.PgClient
  yield* sql`WITH ordered AS (
      SELECT id, row_number() OVER (ORDER BY relative_position ASC NULLS LAST, id) AS n, count(*) OVER () AS total
      FROM issues WHERE project_id IN ${sql.in(projectIds)})
    UPDATE issues SET relative_position = (-2147483648 + ordered.n * floor(4294967295.0 / (ordered.total + 1)))::integer
    FROM ordered WHERE issues.id = ordered.id`
})

const runRebalancingWorker = Effect.fn("Consumer.RebalancingWorker")(
  function*(ledger: Ledger, args: ReadonlyArray<unknown>) {
    const sql = yield* PgClient.PgClient
    const stores = yield* SimulatorStores
    const [, projectId, namespaceId] = args as ReadonlyArray<number | null>
    const member = typeof namespaceId === "number"
      ? rebalanceMember(RebalanceContainer.namespace, namespaceId)
      : rebalanceMember(RebalanceContainer.project, Number(projectId))
    const projectIds = typeof namespaceId === "number"
      ? (yield* sql<{ id: string }>`SELECT id FROM projects WHERE namespace_id = ${namespaceId}`).map((row) =>
        Number(row.id)
      )
      : [Number(projectId)]
    if (projectIds.length > 0) yield* rebalance(projectIds)
    // What GitLab's rebalancer does when it finishes (the member out, the recently_finished mark),
    // and Sidekiq's until_executed when the job ran.
    yield* (yield* RebalancingState).finish(
      typeof namespaceId === "number" ? RebalanceContainer.namespace : RebalanceContainer.project,
      typeof namespaceId === "number" ? namespaceId : Number(projectId)
    ).pipe(Effect.orDie)
    yield* stores.del("queuesMetadata", duplicateKey(REBALANCING_QUEUE, REBALANCING_WORKER, args))
    ledger.rebalances.ran[member] = (ledger.rebalances.ran[member] ?? 0) + 1
  }
)

/** The consumer: `threads` fetchers over every queue a simulated job can land in; runs until interrupted. */
export const runConsumer = Effect.fn("Consumer.run")(function*(options: ConsumerOptions) {
  const stores = yield* SimulatorStores
  const { ledger } = options
  const starting = yield* Semaphore.make(1)
  const queues = [
    ...new Set([
      REBALANCING_QUEUE,
      ...Object.values(options.transitionQueues),
      ...Object.values(options.limited).map((w) => w.queue)
    ])
  ]

  /** GitLab's PipelineProcessWorker, as Pipelines.ts plays it; logs a pipeline it finished. */
  const runPipelineProcess = Effect.fn("Consumer.PipelineProcessWorker")(function*(args: ReadonlyArray<unknown>) {
    const pipelineId = Number(args[0])
    const processed = yield* processPipeline(pipelineId, yield* Clock.currentTimeMillis, options.builds)
    ledger.pipelines.processed[pipelineId] = (ledger.pipelines.processed[pipelineId] ?? 0) + 1
    if (processed === null) return
    ledger.pipelines.status[pipelineId] = processed.to
    if (processed.changed) {
      yield* Effect.logInfo(`Pipeline #${pipelineId} ${processed.to}`, {
        pipeline_id: pipelineId,
        from: processed.from
      })
    }
  })

  const limitOf = Effect.fn(function*(worker: string) {
    const override = parseLimitOverride(yield* stores.get("queuesMetadata", workerKeys(worker).currentLimit))
    const limit = Option.getOrElse(override, () => options.limited[worker]!.limit)
    ledger.throttled.limits[worker] = limit
    return limit
  })
  const observe = Effect.fn(function*(worker: string) {
    const executing = yield* stores.hlen("queuesMetadata", workerKeys(worker).executing)
    ledger.throttled.maxExecuting[worker] = Math.max(ledger.throttled.maxExecuting[worker] ?? 0, executing)
  })

  const runLimited = Effect.fn("Consumer.limitedJob")(
    function*(tid: string, worker: string, args: ReadonlyArray<unknown>, resumed: boolean) {
      const keys = workerKeys(worker)
      const field = `simulator:${process.pid}:tid:${tid}`
      const started = yield* Semaphore.withPermit(starting)(Effect.gen(function*() {
        const nowMillis = yield* Clock.currentTimeMillis
        const now = nowMillis / 1000
        if (resumed) {
          yield* stores.hset("queuesMetadata", keys.executing, { [field]: String(now) })
          yield* stores.decrIfPositive("queuesMetadata", keys.pendingResumed)
          ledger.throttled.resumedRan++
        } else {
          const limit = yield* limitOf(worker)
          const deferred = yield* stores.llen("sharedState", keys.deferred)
          const current = (yield* stores.hlen("queuesMetadata", keys.executing)) +
            parseCounter(yield* stores.get("queuesMetadata", keys.pendingResumed))
          if (limit < 0 || deferred > 0 || (limit > 0 && current >= limit)) {
            yield* deferJob(worker, args, nowMillis)
            ledger.throttled.deferred++
            return false
          }
          yield* stores.hset("queuesMetadata", keys.executing, { [field]: String(now) })
          ledger.throttled.directRan++
        }
        yield* observe(worker)
        return true
      }))
      if (!started) return
      yield* Effect.sleep(options.jobMillis)
      yield* stores.hdel("queuesMetadata", keys.executing, field)
      const id = Number(args[0])
      ledger.throttled.ran[id] = (ledger.throttled.ran[id] ?? 0) + 1
    }
  )

  const fetcher = (tid: string) =>
    Effect.gen(function*() {
      while (true) {
        let popped: string | null = null
        for (const queue of queues) {
          popped = yield* stores.rpop("queues", queueKey(queue))
          if (popped !== null) break
        }
        if (popped === null) {
          yield* Effect.sleep(100)
          continue
        }
        const job = decodeJob(popped)
        if (Option.isNone(job)) {
          ledger.unknownJobs++
          continue
        }
        const { class: workerClass, args } = job.value
        if (workerClass === REBALANCING_WORKER) yield* runRebalancingWorker(ledger, args)
        else if (workerClass === PIPELINE_PROCESS_WORKER) yield* runPipelineProcess(args)
        else if (workerClass === BUILD_FINISHED_WORKER) {
          const id = Number(args[0])
          ledger.transitionJobs.buildFinished[id] = (ledger.transitionJobs.buildFinished[id] ?? 0) + 1
        } else if (workerClass === ASSIGN_RESOURCE_WORKER) ledger.transitionJobs.assignResource++
        else if (options.limited[workerClass] !== undefined) {
          yield* runLimited(tid, workerClass, args, job.value.concurrency_limit_resume === true)
        } else ledger.unknownJobs++
      }
    }).pipe(
      // A failed job is logged and the thread carries on, as a Sidekiq thread would.
      Effect.catchCause((cause) =>
        Cause.hasInterruptsOnly(cause)
          ? Effect.failCause(cause)
          : Effect.logWarning("Simulator consumer job failed", cause)
      ),
      Effect.forever
    )

  yield* Effect.forEach(Array.from({ length: options.threads }, (_, i) => `t${i}`), fetcher, {
    concurrency: "unbounded",
    discard: true
  })
})
