/**
 * The job outbox relay layer (JobOutbox.ts) on a real PostgreSQL: its relay rounds never overlap.
 * The final drain, when the layer is released, used to start while the background fiber was still
 * in a round; both claim as the same relayer, so the drain took the rows the round held and both
 * pushed and deleted them at once. Under load (1000-build pages) their UPDATE and DELETE locked the
 * same rows in different orders: PostgreSQL's `deadlock detected` (40P01) at every shutdown.
 * Both shapes of the outbox are relayed: a batch a row (migration 0013) and, written by an older
 * release, a job a row (0009), each job once and in its batch's order.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Context, Deferred, Effect, Exit, Layer, Logger, Ref, Scope } from "effect"
import { TestClock } from "effect/testing"
import { JobQueueMemory } from "../../src/layers/memory/JobQueueMemory.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import {
  JobOutboxRelay,
  LEGACY_OUTBOX_EVERY,
  relayJobOutbox,
  TransitionJobRelay
} from "../../src/layers/postgres/JobOutbox.ts"
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

/** BATCHES batches of JOBS_A_BATCH jobs, a batch a row (this release's shape) or a job a row (the older). */
const seedOutbox = (sql: PgClient.PgClient, shape: "batch rows" | "job rows") =>
  shape === "batch rows"
    ? sql`INSERT INTO sweeper_job_outbox_batches (jobs, size)
        SELECT jsonb_build_array(jsonb_build_object('worker', 'Ci::BuildFinishedWorker', 'queue', 'default',
          'args', (SELECT jsonb_agg(jsonb_build_array(n * 1000 + j) ORDER BY j)
            FROM generate_series(1, ${JOBS_A_BATCH}) AS j))), ${JOBS_A_BATCH}
        FROM generate_series(1, ${BATCHES}) AS n ORDER BY n`
    : sql`INSERT INTO sweeper_job_outbox (batch, worker, queue, args)
        SELECT b.batch, 'Ci::BuildFinishedWorker', 'default', jsonb_build_array(b.n * 1000 + j)
        FROM (SELECT n, gen_random_uuid() AS batch FROM generate_series(1, ${BATCHES}) AS n) AS b,
          generate_series(1, ${JOBS_A_BATCH}) AS j
        ORDER BY b.n, j`

describe("JobOutboxRelay", () => {
  for (const shape of ["batch rows", "job rows"] as const) {
    it.live(
      `releasing the layer while a relay round is in flight: one round at a time, every job pushed once (${shape})`,
      () =>
        Effect.gen(function*() {
          const sql = yield* PgClient.PgClient
          yield* seedOutbox(sql, shape)
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
          assert.deepStrictEqual(yield* sql`SELECT id FROM sweeper_job_outbox_batches`, [])
          assert.deepStrictEqual(warnings, [], "a relay failed")
        }).pipe(
          Effect.provide(
            Layer.mergeAll(PgTest, MetricsPrometheus, JobQueueMemory.pipe(Layer.provide(MemoryRedis.layer)))
          )
        ),
      60_000
    )
  }

  it.live(
    "rows of the old shape (a job a row: left by, or written during a rolling upgrade by, an older release) " +
      "are relayed beside the new: each job once, in order per queue, also when a relay dies after a push",
    () =>
      Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        const queue = yield* JobQueue
        const [a, b, c] = [
          "00000000-0000-4000-8000-0000000000a1",
          "00000000-0000-4000-8000-0000000000b2",
          "00000000-0000-4000-8000-0000000000c3"
        ]
        // Batches a and b as the previous release writes them (a's jobs on two queues, interleaved),
        // c as this one does.
        yield* sql`INSERT INTO sweeper_job_outbox (batch, worker, queue, args) VALUES
          (${a}::uuid, 'PipelineProcessWorker', 'default', '[500]'),
          (${a}::uuid, 'Ci::BuildFinishedWorker', 'other', '[1]'),
          (${a}::uuid, 'Ci::BuildFinishedWorker', 'default', '[2]'),
          (${a}::uuid, 'Ci::BuildFinishedWorker', 'other', '[3]'),
          (${b}::uuid, 'PipelineProcessWorker', 'default', '[501]'),
          (${b}::uuid, 'Ci::BuildFinishedWorker', 'default', '[4]')`
        yield* sql`INSERT INTO sweeper_job_outbox_batches (batch, jobs, size) VALUES (${c}::uuid, ${
          JSON.stringify([
            { worker: "PipelineProcessWorker", queue: "default", args: [[502]] },
            { worker: "Ci::BuildFinishedWorker", queue: "other", args: [[5], [6]] }
          ])
        }::jsonb, 3)`
        // A relay dies right after its first push reached Redis (a's jobs on default), having claimed
        // the old table's batches only; another leaves its claims alone and relays c.
        const dying: JobQueue["Service"] = {
          ...queue,
          pushOnce: (request) => Effect.andThen(queue.pushOnce(request), Effect.interrupt)
        }
        assert.strictEqual(
          (yield* Effect.exit(relayJobOutbox(sql, dying, "00000000-0000-4000-8000-00000000000a")))._tag,
          "Failure"
        )
        assert.strictEqual(yield* relayJobOutbox(sql, queue, "00000000-0000-4000-8000-00000000000b"), 3)
        // A fresh process takes over every claim: what the dead relay pushed is refused by its marker.
        assert.strictEqual(
          yield* relayJobOutbox(sql, queue, "00000000-0000-4000-8000-00000000000c", { takeOver: true }),
          4
        )
        assert.strictEqual(yield* relayJobOutbox(sql, queue, "00000000-0000-4000-8000-00000000000c"), 0)
        assert.deepStrictEqual(yield* sql`SELECT id FROM sweeper_job_outbox`, [])
        assert.deepStrictEqual(yield* sql`SELECT id FROM sweeper_job_outbox_batches`, [])
        // LPUSHed, and Sidekiq takes from the tail: each queue reversed is the order its jobs run in.
        // Each batch's jobs in a queue keep their order; b, held by the dead relay's claim, went after c.
        const inOrder = (name: string) =>
          Effect.map(queue.peek(name, 100), (payloads) =>
            payloads.toReversed().map((payload) => {
              const job = JSON.parse(new TextDecoder().decode(payload)) as { class: string; args: Array<number> }
              return `${job.class} ${job.args}`
            }))
        assert.deepStrictEqual(yield* inOrder("default"), [
          "PipelineProcessWorker 500",
          "Ci::BuildFinishedWorker 2",
          "PipelineProcessWorker 502",
          "PipelineProcessWorker 501",
          "Ci::BuildFinishedWorker 4"
        ])
        assert.deepStrictEqual(yield* inOrder("other"), [
          "Ci::BuildFinishedWorker 5",
          "Ci::BuildFinishedWorker 6",
          "Ci::BuildFinishedWorker 1",
          "Ci::BuildFinishedWorker 3"
        ])
      }).pipe(
        Effect.provide(
          Layer.mergeAll(PgTest, MetricsPrometheus, JobQueueMemory.pipe(Layer.provide(MemoryRedis.layer)))
        )
      ),
    60_000
  )

  it.effect(
    "the relay fiber claims from the old table at most every LEGACY_OUTBOX_EVERY, and wakes for it unasked: " +
      "a row an older release left there is pushed within that",
    () =>
      Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        const queue = yield* JobQueue
        const legacyRow = (n: number) =>
          sql`INSERT INTO sweeper_job_outbox (batch, worker, queue, args)
            VALUES (gen_random_uuid(), 'Ci::BuildFinishedWorker', 'default', jsonb_build_array(${n}::int))`
        const pushed = Effect.map(queue.peek("default", 100), (payloads) =>
          payloads.map((payload) =>
            (JSON.parse(new TextDecoder().decode(payload)) as { args: [number] }).args[0]
          )
            .toSorted((a, b) => a - b))
        // Real time, not the test clock's: the relay's statements take it.
        const until = <A>(check: Effect.Effect<A, unknown>, done: (a: A) => boolean) =>
          Effect.gen(function*() {
            for (let i = 0; i < 200; i++) {
              if (done(yield* Effect.orDie(check))) return
              yield* Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 25)))
            }
            assert.fail("timed out")
          })
        yield* legacyRow(1)
        const scope = yield* Scope.make()
        const relay = yield* Layer.buildWithScope(JobOutboxRelay({ recover: false }), scope)
        // Its first round claims there: row 1.
        yield* until(pushed, (jobs) => jobs.length === 1)
        // Drops commit within the period: their batches go, the old table waits.
        yield* legacyRow(2)
        yield* sql`INSERT INTO sweeper_job_outbox_batches (jobs, size)
          VALUES ('[{"worker": "Ci::BuildFinishedWorker", "queue": "default", "args": [[3]]}]', 1)`
        yield* Context.get(relay, TransitionJobRelay).committed
        yield* until(pushed, (jobs) => jobs.length === 2)
        assert.deepStrictEqual(yield* pushed, [1, 3])
        assert.lengthOf(yield* sql`SELECT FROM sweeper_job_outbox`, 1)
        // The period passes with no drop: the fiber wakes itself and takes row 2.
        yield* TestClock.adjust(LEGACY_OUTBOX_EVERY)
        yield* until(pushed, (jobs) => jobs.length === 3)
        assert.deepStrictEqual(yield* pushed, [1, 2, 3])
        assert.lengthOf(yield* sql`SELECT FROM sweeper_job_outbox`, 0)
        yield* Scope.close(scope, Exit.void)
      }).pipe(
        Effect.provide(
          Layer.mergeAll(PgTest, MetricsPrometheus, JobQueueMemory.pipe(Layer.provide(MemoryRedis.layer)))
        )
      ),
    60_000
  )
})
