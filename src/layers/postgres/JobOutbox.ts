/**
 * The relay of the job outbox to Sidekiq: the jobs GitLab pushes after a build's transition
 * commits (PipelineProcessWorker, Ci::BuildFinishedWorker, AssignResourceFromResourceGroupWorker),
 * written by the drop's own statement beside the builds and pushed here after the commit, exactly
 * once whatever dies when. Ci::BuildFinishedWorker is not idempotent in GitLab, so "at least once"
 * would not do; losing one would leave the build's hooks, token and trace archive undone.
 *
 * 1. Claim (one short autocommit statement, never held across a Redis call): the oldest unclaimed
 *    batches, or batches whose claim is older than OUTBOX_CLAIM_LEASE (a relay that died or hangs),
 *    stamped `claimed_at = now()`. A batch is one page write's jobs, named by a uuid PostgreSQL drew
 *    in that write, so it never repeats, not even after a point-in-time restore of the database. It
 *    is one row of `sweeper_job_outbox_batches` (migration 0013), or, written by an older release,
 *    one row per job in `sweeper_job_outbox` (both are drained: see `relayJobOutbox`).
 * 2. Push, per batch and queue: one Lua script on the Queues store sets the marker
 *    `sweeper:job_outbox:{queue:<q>}:<batch>` (NX, TTL PUSHED_MARKER_TTL) and, only if it was not
 *    there, LPUSHes the batch's jobs, in GitLab's wire format. A second push of the same batch, by
 *    this relay after a crash or by another that took over its claim, finds the marker: nothing.
 * 3. DELETE the batch's row (the rows claimed, in the old table: a batch is written by one statement,
 *    so all of them).
 *
 * Killed before 2: the rows wait, claimed, until the lease passes; then relayed. Killed between 2 and
 * 3: the next relay pushes nothing (the marker) and deletes them. A relay runs soon after every drop
 * that wrote jobs, when a relay that failed is owed (every JOB_RELAY_RETRY), at start-up (`start`,
 * `run`) and when the process stops.
 * Separate from the ci event outbox's relay (Outbox.ts): different destination, different ids.
 */
import { PgClient } from "@effect/sql-pg"
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Latch from "effect/Latch"
import * as Layer from "effect/Layer"
import * as Random from "effect/Random"
import * as Ref from "effect/Ref"
import * as Schedule from "effect/Schedule"
import type { SqlError } from "effect/sql/SqlError"
import type * as Statement from "effect/sql/Statement"
import { describeError, type RedisError } from "../../domain/Errors.ts"
import {
  OUTBOX_CLAIM_LEASE,
  PUSHED_MARKER_TTL,
  pushedMarkerKey,
  RELAY_BATCHES,
  TRANSITION_JOB_RETRY
} from "../../domain/TransitionJobs.ts"
import { JobQueue } from "../../services/JobQueue.ts"
import { jobRelayFailuresTotal, jobRelayOwed, jobsRelayedTotal, Metrics } from "../../services/Metrics.ts"

/** A relay's name in `claimed_by`: a version-4 uuid from the fiber's Random. */
const randomUuid = Effect.map(Random.Random, (random) => {
  const hex = Array.from({ length: 32 }, () => Math.floor(random.nextDoubleUnsafe() * 16).toString(16))
  hex[12] = "4"
  hex[16] = (8 + Math.floor(random.nextDoubleUnsafe() * 4)).toString(16)
  const text = hex.join("")
  return `${text.slice(0, 8)}-${text.slice(8, 12)}-${text.slice(12, 16)}-${text.slice(16, 20)}-${text.slice(20)}`
})

/** Sweeper's job outbox, beside the builds: a batch a row (migration 0013). */
export const JOB_OUTBOX = "sweeper_job_outbox_batches"
/** The job outbox of older releases, a job a row (migration 0009): still relayed from, never written. */
export const LEGACY_JOB_OUTBOX = "sweeper_job_outbox"

/**
 * What must follow a drop that wrote jobs into the outbox: the relay. Read once by the drop layers
 * when they are built; without a relay layer (a bare test composition) nothing is pushed and the
 * rows wait in the outbox for the next process that relays.
 */
export const TransitionJobRelay = Context.Reference<{ readonly committed: Effect.Effect<void> }>(
  "sweeper/layers/postgres/TransitionJobRelay",
  { defaultValue: () => ({ committed: Effect.void }) }
)

/** Jobs of one worker for one queue, in push order: `args` holds each job's arguments. */
interface JobRun {
  readonly worker: string
  readonly queue: string
  readonly args: ReadonlyArray<ReadonlyArray<unknown>>
}

/** A batch a claim returned: its rows' ids in its table, its jobs in push order. */
interface ClaimedBatch {
  readonly batch: string
  readonly ids: ReadonlyArray<string>
  readonly createdAt: Date
  readonly runs: ReadonlyArray<JobRun>
}

/**
 * Steps 1 and 3 on one of the outbox's two tables. Each statement locks its rows in id order before
 * it stamps or deletes them: two relays on the same rows (a start-up's takeover beside a live
 * relay's DELETE) then wait for each other instead of deadlocking. Left to their plans, the UPDATE
 * locked in its join's order and the DELETE in its bitmap scan's: at 1000-build pages, the two met in
 * a deadlock. Each statement touches one table, so no order between the tables is needed.
 */
interface OutboxTable {
  /** The oldest claimable batches (`claimable`: see `claimableBy`), stamped as `relayer`'s. */
  readonly claim: (
    sql: PgClient.PgClient,
    claimable: Statement.Fragment,
    relayer: string
  ) => Effect.Effect<ReadonlyArray<ClaimedBatch>, SqlError>
  /** Deletes the rows of batches a claim returned. */
  readonly forget: (sql: PgClient.PgClient, ids: ReadonlyArray<string>) => Effect.Effect<unknown, SqlError>
}

/**
 * `sweeper_job_outbox_batches` (migration 0013), a batch a row, written by this release's drops: the
 * oldest claimable rows, locked in the primary key's order under the LIMIT.
 */
const BATCH_ROWS: OutboxTable = {
  claim: (sql, claimable, relayer) =>
    Effect.map(
      sql<{ id: string; batch: string; jobs: ReadonlyArray<JobRun>; created_at: Date }>`
        WITH claimed AS MATERIALIZED (
          SELECT id FROM sweeper_job_outbox_batches WHERE ${claimable}
          ORDER BY id LIMIT ${RELAY_BATCHES} FOR UPDATE)
        UPDATE sweeper_job_outbox_batches o SET claimed_at = now(), claimed_by = ${relayer}::uuid
        FROM claimed WHERE o.id = claimed.id
        RETURNING o.id, o.batch, o.jobs, o.created_at`,
      (rows) =>
        rows.toSorted((a, b) => Number(a.id) - Number(b.id)).map((row) => ({
          batch: row.batch,
          ids: [row.id],
          createdAt: row.created_at,
          runs: row.jobs
        }))
    ),
  forget: (sql, ids) =>
    sql`
      WITH forgotten AS MATERIALIZED (
        SELECT id FROM sweeper_job_outbox_batches WHERE id = ANY (${ids}::bigint[]) ORDER BY id FOR UPDATE)
      DELETE FROM sweeper_job_outbox_batches o USING forgotten WHERE o.id = forgotten.id`
}

/**
 * `sweeper_job_outbox` (migration 0009), a job a row, the batch spread over its rows: rows a previous
 * release left, or still writes while a rolling upgrade runs. Whole batches are claimed (no SKIP
 * LOCKED: a batch claimed in part would have its marker let one part through and refuse the rest).
 */
const JOB_ROWS: OutboxTable = {
  claim: (sql, claimable, relayer) =>
    Effect.map(
      sql<{ id: string; batch: string; worker: string; queue: string; args: ReadonlyArray<unknown>; created_at: Date }>`
        WITH claimed AS MATERIALIZED (
          SELECT id FROM sweeper_job_outbox
          WHERE batch IN (
              SELECT batch FROM sweeper_job_outbox WHERE ${claimable}
              GROUP BY batch ORDER BY min(id) LIMIT ${RELAY_BATCHES})
            AND ${claimable}
          ORDER BY id FOR UPDATE)
        UPDATE sweeper_job_outbox o SET claimed_at = now(), claimed_by = ${relayer}::uuid
        FROM claimed WHERE o.id = claimed.id
        RETURNING o.id, o.batch, o.worker, o.queue, o.args, o.created_at`,
      (rows) => {
        const batches = new Map<string, { ids: Array<string>; createdAt: Date; runs: Array<JobRun> }>()
        for (const row of rows.toSorted((a, b) => Number(a.id) - Number(b.id))) {
          const run = { worker: row.worker, queue: row.queue, args: [row.args] }
          const batch = batches.get(row.batch)
          if (batch === undefined) batches.set(row.batch, { ids: [row.id], createdAt: row.created_at, runs: [run] })
          else {
            batch.ids.push(row.id)
            batch.runs.push(run)
          }
        }
        return Array.from(batches, ([batch, claimed]) => ({ batch, ...claimed }))
      }
    ),
  forget: (sql, ids) =>
    sql`
      WITH forgotten AS MATERIALIZED (
        SELECT id FROM sweeper_job_outbox WHERE id = ANY (${ids}::bigint[]) ORDER BY id FOR UPDATE)
      DELETE FROM sweeper_job_outbox o USING forgotten WHERE o.id = forgotten.id`
}

/**
 * What a relay `relayer` may claim: unclaimed batches, its own (a retry of its own failed push), those
 * whose claim passed OUTBOX_CLAIM_LEASE, and with `takeOver` (start-up: whoever claimed them before
 * may have died a moment ago) every one. Claims only save work: a batch claimed twice is still
 * pushed once (the marker).
 */
const claimableBy = (sql: PgClient.PgClient, relayer: string, takeOver: boolean) => {
  const stale = sql`now() - ${`${Duration.toSeconds(OUTBOX_CLAIM_LEASE)} seconds`}::interval`
  return takeOver
    ? sql`TRUE`
    : sql`(claimed_at IS NULL OR claimed_at < ${stale} OR claimed_by = ${relayer}::uuid)`
}

/** Step 2 for claimed batches, in order: per batch and queue, its jobs in order; the number pushed now. */
const pushAll = (queue: JobQueue["Service"], batches: ReadonlyArray<ClaimedBatch>) =>
  Effect.gen(function*() {
    let pushed = 0
    for (const { batch, createdAt, runs } of batches) {
      const queues = new Map<string, Array<JobRun>>()
      for (const run of runs) {
        const same = queues.get(run.queue)
        if (same === undefined) queues.set(run.queue, [run])
        else same.push(run)
      }
      for (const [name, sameQueue] of queues) {
        const jobs = sameQueue.flatMap((run) =>
          run.args.map((args) => ({
            workerClass: run.worker,
            args,
            createdAtMillis: createdAt.getTime(),
            retry: TRANSITION_JOB_RETRY
          }))
        )
        const outcome = yield* queue.pushOnce({
          queue: name,
          marker: pushedMarkerKey(name, batch),
          ttlSeconds: Duration.toSeconds(PUSHED_MARKER_TTL),
          jobs
        })
        if (outcome === "pushed") pushed += jobs.length
      }
    }
    return pushed
  })

/**
 * Relays everything in the outbox `relayer` may claim (see `claimableBy`), RELAY_BATCHES batches a
 * round from each table (the old one first: its rows are the older release's; with `legacy: false`
 * only the new one); the jobs pushed now (a batch refused by its marker counts none). A round whose
 * claims took fewer than RELAY_BATCHES batches took every claimable one, so the relay stops there
 * rather than asking again: a batch committed since wakes the relay itself (`committed`), and that
 * empty claim was one statement in two during a large drop (measured: 186 claims for 100 pages).
 */
export const relayJobOutbox = (
  sql: PgClient.PgClient,
  queue: JobQueue["Service"],
  relayer: string,
  options: { readonly takeOver?: boolean; readonly legacy?: boolean } = {}
): Effect.Effect<number, SqlError | RedisError> =>
  Effect.gen(function*() {
    const claimable = claimableBy(sql, relayer, options.takeOver === true)
    const tables = options.legacy === false ? [BATCH_ROWS] : [JOB_ROWS, BATCH_ROWS]
    let pushed = 0
    while (true) {
      let full = false
      for (const table of tables) {
        const batches = yield* table.claim(sql, claimable, relayer)
        if (batches.length === 0) continue
        pushed += yield* pushAll(queue, batches)
        yield* table.forget(sql, batches.flatMap((batch) => batch.ids))
        full ||= batches.length >= RELAY_BATCHES
      }
      if (!full) return pushed
    }
  })

/** How soon a relay that failed (Redis or the database unreachable) is tried again. */
export const JOB_RELAY_RETRY = Duration.seconds(5)

/**
 * How often the relay fiber also claims from the older table (`sweeper_job_outbox`), and wakes for it
 * when no drop woke it. Only a process of the previous release writes there (a rolling upgrade), and
 * its own relay pushes what it writes; this release drains what such a process left. Claiming there
 * in every round cost a statement a page beside the page's own (measured: 7 ms a round on a loaded
 * machine, on an empty table). The relay at start-up and the last one at release always claim there.
 */
export const LEGACY_OUTBOX_EVERY = Duration.seconds(30)

/**
 * The drops' TransitionJobRelay on the builds' database (the PgClient in context: ci's on a
 * decomposed GitLab) and the JobQueue (and Metrics: sweeper_job_relay_owed, _failures_total and
 * sweeper_jobs_relayed_total). With `recover` (commands that write: `start`, `run`), building it
 * relays what an earlier process left, taking over every claim.
 *
 * One fiber relays; a drop that wrote jobs only wakes it (a latch), so a page never waits for Redis
 * and the jobs of many pages go out in one relay round (RELAY_BATCHES batches a claim) instead of
 * three more round trips a page. A relay that fails does not fail the drop that committed before it
 * (its jobs are safe in the outbox): logged once, owed, tried again every JOB_RELAY_RETRY while the
 * layer lives; releasing the layer stops the fiber, then relays once more (a `sweeper run` pushes
 * its jobs before it exits): one relay round at a time, always.
 */
export const JobOutboxRelay = (options: { readonly recover: boolean }) =>
  Layer.effect(
    TransitionJobRelay,
    Effect.gen(function*() {
      const sql = yield* PgClient.PgClient
      const queue = yield* JobQueue
      const metrics = yield* Metrics
      const relayer = yield* randomUuid
      const owed = yield* Ref.make(false)
      /** Sets whether a relay is owed; answers whether it was before. */
      const setOwed = (value: boolean) =>
        Ref.getAndSet(owed, value).pipe(Effect.tap(metrics.setGauge(jobRelayOwed, value ? 1 : 0)))
      yield* setOwed(false)
      const legacyAt = yield* Ref.make(Number.NEGATIVE_INFINITY)
      /** Whether a round claims from the older table too: always unless `sometimes`, then every LEGACY_OUTBOX_EVERY. */
      const legacyDue = (sometimes: boolean) =>
        Effect.flatMap(Clock.currentTimeMillis, (now) =>
          Ref.modify(legacyAt, (last) =>
            !sometimes || now - last >= Duration.toMillis(LEGACY_OUTBOX_EVERY) ? [true, now] : [false, last]))
      const relayWith = (takeOver: boolean, sometimes = false) =>
        Effect.flatMap(legacyDue(sometimes), (legacy) =>
          relayJobOutbox(sql, queue, relayer, { takeOver, legacy })).pipe(
            Effect.tap((pushed) =>
              pushed > 0 ? metrics.increment(jobsRelayedTotal, pushed) : Effect.void
            ),
            Effect.andThen(setOwed(false)),
            Effect.flatMap((wasOwed) =>
              wasOwed ? Effect.logInfo("Transition jobs relayed from the job outbox to Sidekiq again") : Effect.void
            ),
            Effect.catch((error) =>
              Effect.all([setOwed(true), metrics.increment(jobRelayFailuresTotal, 1)]).pipe(
                Effect.flatMap(([wasOwed]) =>
                  wasOwed ? Effect.void : Effect.logWarning(
                    "Transition jobs not yet relayed from the job outbox to Sidekiq; retrying",
                    describeError(error)
                  )
                )
              )
            )
          )
      const relay = relayWith(false)
      if (options.recover) yield* relayWith(true)
      // Woken by every drop that wrote jobs, every JOB_RELAY_RETRY while a relay is owed, and every
      // LEGACY_OUTBOX_EVERY for the older table.
      const wake = yield* Latch.make(false)
      const relayWhenWoken = Latch.await(wake).pipe(
        Effect.andThen(Latch.close(wake)),
        Effect.andThen(relayWith(false, true))
      )
      const relaying = yield* relayWhenWoken.pipe(Effect.forever, Effect.forkScoped)
      yield* Effect.when(Latch.open(wake), Ref.get(owed)).pipe(
        Effect.repeat(Schedule.spaced(JOB_RELAY_RETRY)),
        Effect.forkScoped
      )
      yield* Latch.open(wake).pipe(Effect.repeat(Schedule.spaced(LEGACY_OUTBOX_EVERY)), Effect.forkScoped)
      // Releasing the layer relays whatever is left, but never beside a round of the fiber: both claim
      // as `relayer`, so the last relay would take the rows that round holds and both would push and
      // delete them at once (their UPDATE and DELETE locking the same rows in different orders: a
      // deadlock). The fiber is stopped first, its round left as a crash would leave it (claimed rows
      // are the relayer's own to claim again, a batch it pushed is refused by its marker), and its
      // statement in flight ends before the interruption does.
      yield* Effect.addFinalizer(() =>
        Fiber.interrupt(relaying).pipe(Effect.andThen(relay), Effect.timeout(JOB_RELAY_RETRY), Effect.ignore)
      )
      return { committed: Effect.asVoid(Latch.open(wake)) }
    })
  )
