/**
 * The job outbox relay layer (JobOutbox.ts) on a real PostgreSQL: its relay rounds never overlap.
 * The final drain, when the layer is released, used to start while the background fiber was still
 * in a round; both claim as the same relayer, so the drain took the rows the round held and both
 * pushed and deleted them at once. Under load (1000-build pages) their UPDATE and DELETE locked the
 * same rows in different orders: PostgreSQL's `deadlock detected` (40P01) at every shutdown.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Context, Deferred, Effect, Exit, Layer, Logger, Ref, Scope } from "effect"
import { JobQueueMemory } from "../../src/layers/memory/JobQueueMemory.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { JobOutboxRelay, TransitionJobRelay } from "../../src/layers/postgres/JobOutbox.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { JobQueue } from "../../src/services/JobQueue.ts"
import { PgTest } from "../support/postgres.ts"

const BATCHES = 5
const JOBS_A_BATCH = 200

/**
 * The in-memory JobQueue, watched: how many pushes are in flight at once (the most seen), the args
 * of every job pushed, and the first push held until interrupted, with `firstPush` completed as it
 * starts (a round in flight when the layer is released).
 */
const watchedQueue = Effect.gen(function*() {
  const memory = yield* JobQueue
  const firstPush = yield* Deferred.make<void>()
  const calls = yield* Ref.make(0)
  const inFlight = yield* Ref.make(0)
  const mostInFlight = yield* Ref.make(0)
  const pushed = yield* Ref.make<ReadonlyArray<string>>([])
  const queue: JobQueue["Service"] = {
    ...memory,
    pushOnce: (request) =>
      Effect.gen(function*() {
        const now = yield* Ref.updateAndGet(inFlight, (n) => n + 1)
        yield* Ref.update(mostInFlight, (most) => Math.max(most, now))
        if ((yield* Ref.getAndUpdate(calls, (n) => n + 1)) === 0) {
          yield* Deferred.succeed(firstPush, undefined)
          return yield* Effect.never
        }
        const outcome = yield* memory.pushOnce(request)
        if (outcome === "pushed") {
          yield* Ref.update(pushed, (all) => [...all, ...request.jobs.map((job) => JSON.stringify(job.args))])
        }
        return outcome
      }).pipe(Effect.ensuring(Ref.update(inFlight, (n) => n - 1)))
  }
  return { queue, firstPush, mostInFlight, pushed }
})

describe("JobOutboxRelay", () => {
  it.live(
    "releasing the layer while a relay round is in flight: one round at a time, every job pushed once",
    () =>
      Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        yield* sql`INSERT INTO sweeper_job_outbox (batch, worker, queue, args)
          SELECT b.batch, 'Ci::BuildFinishedWorker', 'default', jsonb_build_array(b.n * 1000 + j)
          FROM (SELECT n, gen_random_uuid() AS batch FROM generate_series(1, ${BATCHES}) AS n) AS b,
            generate_series(1, ${JOBS_A_BATCH}) AS j
          ORDER BY b.n, j`
        const watched = yield* watchedQueue
        // A relay that fails (a deadlock among them) logs one warning and is retried.
        const warnings: Array<unknown> = []
        const collector = Logger.make((options) => {
          if (options.logLevel === "Warn") warnings.push(options.message)
        })
        const scope = yield* Scope.make()
        const relay = yield* Layer.buildWithScope(JobOutboxRelay({ recover: false }), scope).pipe(
          Effect.provideService(JobQueue, watched.queue),
          Effect.provide(Logger.layer([collector]))
        )
        // A drop committed: the background fiber claims every batch and starts pushing the first.
        yield* Context.get(relay, TransitionJobRelay).committed
        yield* Deferred.await(watched.firstPush)
        // The process stops with that push still in flight.
        yield* Scope.close(scope, Exit.void)
        assert.strictEqual(yield* Ref.get(watched.mostInFlight), 1, "two relay rounds pushed at once")
        const pushed = yield* Ref.get(watched.pushed)
        assert.lengthOf(pushed, BATCHES * JOBS_A_BATCH)
        assert.strictEqual(new Set(pushed).size, pushed.length, "a job pushed twice")
        assert.deepStrictEqual(yield* sql`SELECT id FROM sweeper_job_outbox`, [])
        assert.deepStrictEqual(warnings, [], "a relay failed")
      }).pipe(
        Effect.provide(
          Layer.mergeAll(PgTest, MetricsPrometheus, JobQueueMemory.pipe(Layer.provide(MemoryRedis.layer)))
        )
      ),
    60_000
  )
})
