/**
 * Repair events of a decomposed GitLab: the repair is in ci, the ledger in main, and no transaction
 * spans the two. So a ci repair writes its events into ci's `sweeper_outbox` in the repair's own
 * statement or transaction (both commit or neither), and the relay then moves them to main's
 * `sweeper_events`, exactly once whatever dies when. Each outbox row carries a random `key`
 * (`gen_random_uuid()`), which no restore or failover of ci can hand out again as it hands out
 * ids again. A relay round, each step its own autocommitted statement (no ci transaction is ever
 * open while main is asked anything):
 *
 * 1. In ci, read the oldest RELAY_BATCH rows, in id order (no lock: a second relay reads them too).
 * 2. In main, ONE statement records each row's key in `sweeper_relayed_keys` (`ON CONFLICT DO
 *    NOTHING`) and appends the events of exactly the keys it recorded, in outbox order, with their
 *    run and time as written.
 * 3. In ci, delete the rows read (each by id and key).
 *
 * Killed before 2 commits: the rows are still in the outbox, nothing in main; relayed later. Killed
 * between 2 and 3: the rows are still there, their keys in main: the next round appends nothing for
 * them and deletes them. Two relays reading the same rows: the second's step 2 waits for the first's
 * keys to commit and appends nothing for them. Main keeps keys for RELAYED_KEYS_KEPT, so rows a ci
 * restored to an earlier point brings back are recognised too.
 *
 * Order: a round reads without skipping anything visible and appends in id order, so in main a run's
 * events keep the order they committed in ci, whichever relay appends them. A row that commits after
 * rows with higher ids (two pages of a run written at once) is read by a later round, never lost:
 * rounds read the oldest rows, not the rows after a cursor. A run's end (RunLedger.eventsOwed) gives
 * the relay a bounded chance to bring all of the run's events before RunFinished; what is still owed
 * then is said in RunFinished (`eventsOwed`) and registered in `sweeper_owed_runs` in the same
 * transaction, and the first pass that finds none of the run's rows left in ci appends its
 * RunEventsRelayed, after all of them. A RunFinished that main could not take at all waits in ci's
 * outbox behind the run's events.
 *
 * The relay runs in a fiber of its own, woken by every ci commit (the next page goes on meanwhile),
 * at start-up (whatever an earlier process left), and every RELAY_RETRY while a failure or an owed
 * run is outstanding; a relay that fails is a degraded state, never a failed start or repair.
 */
import { PgClient } from "@effect/sql-pg"
import * as Cause from "effect/Cause"
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as DateTime from "effect/DateTime"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Queue from "effect/Queue"
import * as Ref from "effect/Ref"
import type { SqlError } from "effect/sql/SqlError"
import { CurrentRun } from "../../domain/Batch.ts"
import { describeError } from "../../domain/Errors.ts"
import { dataOf, type RunFinished, streamOf } from "../../domain/Events.ts"
import { Metrics, outboxRelayFailuresTotal, outboxRelayOwed } from "../../services/Metrics.ts"
import { RunLedger } from "../../services/RunLedger.ts"
import { MainDatabase } from "./Databases.ts"
import type { EventsTable } from "./EventLogSql.ts"

/**
 * Where a repair writes its events in its own transaction, and what follows its commit (told how
 * many events it wrote). Read once by the repair layers when they are built: main's ledger itself
 * by default; a decomposed GitLab's ci repairs get the outbox, whose commit wakes the relay.
 */
export const RepairEvents = Context.Reference<{
  readonly table: EventsTable
  readonly committed: (events: number) => Effect.Effect<void, SqlError>
}>("sweeper/layers/postgres/RepairEvents", {
  defaultValue: () => ({ table: "sweeper_events", committed: () => Effect.void })
})

/** Outbox rows read per relay round: one main statement of at most this many events. */
export const RELAY_BATCH = 1000

/** How soon a relay that failed (main unreachable, a statement refused) is tried again. */
export const RELAY_RETRY = Duration.seconds(5)

/**
 * The least time between two passes' starts: the first commit after a quiet spell is relayed at
 * once, the pages of a burst a few at a time, in one main statement per round instead of one per
 * page (measured: see BENCHMARKS.md, "A decomposed GitLab").
 */
export const RELAY_COALESCE = Duration.millis(25)

/** How long a run's end waits for the relay to bring its events before RunFinished says they are owed. */
export const SETTLE_WAIT = Duration.seconds(10)

/** How long a run's end waits for one answer from ci or main about its events (they may hang). */
const ASK_WAIT = Duration.seconds(2)

/**
 * How long main keeps the key of an outbox row it has appended: a ci restored to a point less than
 * this far back brings back rows the relay then recognises; further back, their events would be
 * appended a second time.
 */
export const RELAYED_KEYS_KEPT = Duration.days(30)

/**
 * How often a relay looks for owed runs when it knows of none of its own (another process's, which
 * stopped before they were closed); with one of its own, every pass does.
 */
const OWED_RUNS_CHECK_EVERY = Duration.minutes(1)

/** How often a relay forgets keys older than RELAYED_KEYS_KEPT, and how many at a time. */
const FORGET_EVERY = Duration.hours(1)
const FORGET_AT_ONCE = 10_000

interface OutboxRow {
  readonly id: string | number
  readonly key: string
  readonly stream: string
  readonly type: string
  readonly data: Record<string, unknown>
  readonly run_id: string | null
  readonly occurred_at: Date
}

/** One round (steps 1–3 above): how many rows it read. */
const relayRound = (ci: PgClient.PgClient, main: PgClient.PgClient) =>
  Effect.gen(function*() {
    const rows = yield* ci<OutboxRow>`SELECT id, key, stream, type, data, run_id, occurred_at
      FROM sweeper_outbox ORDER BY id LIMIT ${RELAY_BATCH}`
    if (rows.length === 0) return 0
    const records = rows.map((row) => ({
      key: row.key,
      stream: row.stream,
      type: row.type,
      data: row.data,
      run_id: row.run_id,
      occurred_at: row.occurred_at.toISOString()
    }))
    // A RunFinished that waited in ci's outbox is appended unless the run has one already (closed
    // as abandoned by a process that could not see it there).
    yield* main`WITH batch AS (
        SELECT * FROM ROWS FROM (jsonb_to_recordset(${main.json(records)})
          AS (key uuid, stream text, type text, data jsonb, run_id uuid, occurred_at timestamptz))
          WITH ORDINALITY AS e(key, stream, type, data, run_id, occurred_at, n)),
      fresh AS (
        INSERT INTO sweeper_relayed_keys (key) SELECT key FROM batch ORDER BY n ON CONFLICT DO NOTHING RETURNING key)
      INSERT INTO sweeper_events (stream, type, data, run_id, occurred_at)
      SELECT stream, type, data, run_id, occurred_at FROM batch
      WHERE key IN (SELECT key FROM fresh) AND (type <> 'RunFinished' OR NOT EXISTS (
        SELECT FROM sweeper_runs r WHERE r.run_id = batch.run_id AND r.outcome IS NOT NULL))
      ORDER BY n`
    const read = rows.map((row) => ({ id: String(row.id), key: row.key }))
    yield* ci`DELETE FROM sweeper_outbox o USING jsonb_to_recordset(${ci.json(read)}) AS r(id bigint, key uuid)
      WHERE o.id = r.id AND o.key = r.key`
    return rows.length
  })

/**
 * Appends RunEventsRelayed for every owed run none of whose rows is left in ci (all of them are in
 * main, since a row leaves ci only after main has its event). Answers how many owed runs remain.
 */
const closeOwedRuns = (ci: PgClient.PgClient, main: PgClient.PgClient) =>
  Effect.gen(function*() {
    const owed = yield* main<{ readonly run_id: string }>`SELECT run_id FROM sweeper_owed_runs`
    if (owed.length === 0) return 0
    const ids = owed.map((row) => row.run_id)
    const waiting = yield* ci<{ readonly run_id: string }>`SELECT DISTINCT run_id FROM sweeper_outbox
      WHERE run_id = ANY (${ids}::uuid[])`
    const still = new Set(waiting.map((row) => row.run_id))
    const done = ids.filter((id) => !still.has(id))
    if (done.length === 0) return ids.length
    // DELETE … RETURNING: a run is closed once, whichever relays find it done at the same time.
    yield* main`WITH closed AS (
        DELETE FROM sweeper_owed_runs WHERE run_id = ANY (${done}::uuid[]) RETURNING run_id, batch, events, finished_at)
      INSERT INTO sweeper_events (stream, type, data, run_id, occurred_at)
      SELECT 'batch:' || batch, 'RunEventsRelayed', jsonb_build_object('batch', batch, 'events', events), run_id, now()
      FROM closed ORDER BY finished_at`
    return ids.length - done.length
  })

/** Rounds until one reads fewer than RELAY_BATCH rows. */
const relayRounds = (ci: PgClient.PgClient, main: PgClient.PgClient) =>
  Effect.gen(function*() {
    while ((yield* relayRound(ci, main)) === RELAY_BATCH) {
      // Full round: there may be more.
    }
  })

/**
 * One relay pass: rounds until one reads fewer than RELAY_BATCH rows, then closes the owed runs
 * that are complete. Answers how many owed runs remain open.
 */
export const relayOutbox = (ci: PgClient.PgClient, main: PgClient.PgClient): Effect.Effect<number, SqlError> =>
  Effect.andThen(relayRounds(ci, main), closeOwedRuns(ci, main))

/** Keys older than RELAYED_KEYS_KEPT leave main, FORGET_AT_ONCE at a time. */
const forgetOldKeys = (main: PgClient.PgClient) =>
  main`DELETE FROM sweeper_relayed_keys WHERE key IN (
    SELECT key FROM sweeper_relayed_keys WHERE relayed_at < now() - ${
    Duration.toSeconds(RELAYED_KEYS_KEPT)
  } * interval '1 second'
    LIMIT ${FORGET_AT_ONCE})`

/** The relay of one process: its fiber, the ci repairs' RepairEvents and the run guard's RunLedger. */
const makeRelay = (options: { readonly recover: boolean }) =>
  Effect.gen(function*() {
    const ci = yield* PgClient.PgClient
    const main = yield* MainDatabase
    const metrics = yield* Metrics
    /** A failed relay is owed (the metric, the alert, the log once per outage). */
    const owed = yield* Ref.make(false)
    /** Owed runs remain open (this process's or another's): keep passing until they are closed. */
    const openRuns = yield* Ref.make(false)
    /** Something was committed (or deferred) since the last pass that succeeded. */
    const dirty = yield* Ref.make(options.recover)
    /** Events each run of this process committed to the outbox (for a run's end when ci is unreachable). */
    const written = yield* Ref.make<ReadonlyMap<string, number>>(new Map())
    const wake = yield* Queue.sliding<void>(1)
    /** Completed, with whether it succeeded, when the pass under way (or, idle, the next one) ends. */
    const passEnd = yield* Ref.make(yield* Deferred.make<boolean>())

    /** Sets whether a relay is owed; answers whether it was before. */
    const setOwed = (value: boolean) =>
      Ref.getAndSet(owed, value).pipe(Effect.tap(metrics.setGauge(outboxRelayOwed, value ? 1 : 0)))
    yield* setOwed(false)

    // Logged when the relay starts failing and when it recovers, not at every page or retry of an
    // outage (the failures counter counts those).
    const failed = (cause: Cause.Cause<SqlError>) =>
      Effect.all([setOwed(true), metrics.increment(outboxRelayFailuresTotal, 1)]).pipe(
        Effect.flatMap(([wasOwed]) =>
          wasOwed ? Effect.void : Effect.logWarning(
            "Repair events not yet relayed from ci's outbox to main's ledger; retrying",
            describeError(Cause.squash(cause))
          )
        )
      )
    const succeeded = (open: number) =>
      Effect.gen(function*() {
        yield* Ref.set(openRuns, open > 0)
        if (yield* setOwed(false)) {
          yield* Effect.logInfo("Repair events relayed from ci's outbox to main's ledger again")
        }
      })

    // Only the worker fiber reads and writes these two.
    let forgotAt = Number.NEGATIVE_INFINITY
    let owedRunsCheckedAt = Number.NEGATIVE_INFINITY
    const ended = (succeededOrNot: boolean) =>
      Effect.flatMap(
        Effect.flatMap(Deferred.make<boolean>(), (next) => Ref.getAndSet(passEnd, next)),
        (end) => Deferred.succeed(end, succeededOrNot)
      )
    const pass = Effect.gen(function*() {
      yield* Ref.set(dirty, false)
      const startedAt = yield* Clock.currentTimeMillis
      // Owed runs: every pass while this process knows of one, else now and then.
      const checkOwed = (yield* Ref.get(openRuns)) ||
        startedAt - owedRunsCheckedAt >= Duration.toMillis(OWED_RUNS_CHECK_EVERY)
      const work = checkOwed
        ? Effect.andThen(relayRounds(ci, main), closeOwedRuns(ci, main)).pipe(
          Effect.tap(() => Effect.sync(() => (owedRunsCheckedAt = startedAt)))
        )
        : Effect.as(relayRounds(ci, main), 0) // no owed run of its own, or checkOwed would be set
      const exit = yield* Effect.exit(
        work.pipe(Effect.onInterrupt(() => Effect.andThen(Ref.set(dirty, true), ended(false))))
      )
      // Stopped (the process is stopping): not a failed relay; the finalizer takes over.
      if (Exit.isFailure(exit) && Cause.hasInterruptsOnly(exit.cause)) return
      if (Exit.isSuccess(exit)) yield* succeeded(exit.value)
      else {
        yield* Ref.set(dirty, true)
        yield* failed(exit.cause)
      }
      yield* ended(Exit.isSuccess(exit))
      if (Exit.isSuccess(exit) && startedAt - forgotAt >= Duration.toMillis(FORGET_EVERY)) {
        forgotAt = startedAt
        yield* forgetOldKeys(main).pipe(Effect.ignore)
      }
    })
    const worker = Effect.gen(function*() {
      let lastPassAt = Number.NEGATIVE_INFINITY
      while (true) {
        const retrying = (yield* Ref.get(owed)) || (yield* Ref.get(openRuns))
        if (retrying) yield* Queue.take(wake).pipe(Effect.timeoutOption(RELAY_RETRY))
        else yield* Queue.take(wake)
        // A burst of pages is relayed several pages a pass: fewer statements and commits in ci and main.
        const since = (yield* Clock.currentTimeMillis) - lastPassAt
        if (since < Duration.toMillis(RELAY_COALESCE)) yield* Effect.sleep(Duration.toMillis(RELAY_COALESCE) - since)
        lastPassAt = yield* Clock.currentTimeMillis
        yield* pass
      }
    })
    const wakeUp = Queue.offer(wake, undefined).pipe(Effect.asVoid)
    // Whatever an earlier process left, relayed in the background: a main that refuses it is a
    // degraded state (logged, the owed metric), never a failed start.
    if (options.recover) yield* wakeUp
    const fiber = yield* Effect.forkScoped(worker)
    // Stopping: once more what is still due, briefly (the next process relays the rest at start).
    yield* Effect.addFinalizer(() =>
      Effect.gen(function*() {
        yield* Fiber.interrupt(fiber)
        const due = (yield* Ref.get(dirty)) || (yield* Ref.get(owed)) || (yield* Ref.get(openRuns))
        if (due) yield* relayOutbox(ci, main).pipe(Effect.timeout(RELAY_RETRY), Effect.ignore)
      })
    )

    const committed = (events: number) =>
      Effect.gen(function*() {
        const run = yield* CurrentRun
        const runId = run.runId
        if (runId !== null) {
          yield* Ref.update(written, (map) => new Map(map).set(runId, (map.get(runId) ?? 0) + events))
        }
        yield* Ref.set(dirty, true)
        yield* wakeUp
      })

    /** The keys of the run's rows still in ci's outbox. */
    const waitingKeys = (runId: string) =>
      Effect.map(
        ci<{ readonly key: string }>`SELECT key FROM sweeper_outbox WHERE run_id = ${runId}::uuid`,
        (rows) => rows.map((row) => row.key)
      )

    /**
     * Until none of the run's rows is left in ci: each time, the end of the pass under way (which
     * may have read before the run's last commit) or of the next one. Stops at a pass that fails.
     */
    const untilRelayed = (runId: string) =>
      Effect.gen(function*() {
        while (true) {
          const end = yield* Ref.get(passEnd)
          yield* wakeUp
          if (!(yield* Deferred.await(end))) return
          if ((yield* waitingKeys(runId)).length === 0) return
        }
      })

    const eventsOwed = (runId: string) =>
      Effect.gen(function*() {
        // Every run's end asks, a run of main's batches too: a ci that hangs delays it ASK_WAIT at most.
        if ((yield* waitingKeys(runId).pipe(Effect.timeout(ASK_WAIT))).length === 0) return 0
        yield* untilRelayed(runId).pipe(Effect.timeoutOption(SETTLE_WAIT))
        const keys = yield* waitingKeys(runId).pipe(Effect.timeout(ASK_WAIT))
        if (keys.length === 0) return 0
        // Rows main has already taken (relayed, not yet cleared from ci) are not owed; with main
        // unreachable, every one of them counts.
        const taken = yield* main<{ readonly n: string }>`SELECT count(*) AS n FROM sweeper_relayed_keys
          WHERE key = ANY (${keys}::uuid[])`.pipe(
          Effect.timeout(ASK_WAIT),
          Effect.map((rows) => Number(rows[0]?.n ?? 0)),
          Effect.orElseSucceed(() => 0)
        )
        return keys.length - taken
      }).pipe(
        // ci unreachable: what this process saw the run commit there may all be owed.
        Effect.catch((error) =>
          Effect.flatMap(Ref.get(written), (map) => {
            const committedThere = map.get(runId) ?? 0
            return committedThere > 0 ? Effect.succeed(committedThere) : Effect.fail(error)
          })
        ),
        Effect.ensuring(Ref.update(written, (map) => {
          const rest = new Map(map)
          rest.delete(runId)
          return rest
        }))
      )

    const appendFinished = (finished: RunFinished, runId: string, append: Effect.Effect<void, SqlError>) => {
      const events = finished.eventsOwed ?? 0
      if (events === 0) return append
      return main.withTransaction(Effect.andThen(
        append,
        main`INSERT INTO sweeper_owed_runs (run_id, batch, events) VALUES (${runId}::uuid, ${finished.batch}, ${events})
          ON CONFLICT (run_id) DO NOTHING`
      )).pipe(Effect.andThen(Ref.set(openRuns, true)), Effect.andThen(wakeUp))
    }

    const deferFinished = (finished: RunFinished, runId: string) =>
      Effect.gen(function*() {
        const at = DateTime.toDateUtc(yield* DateTime.now)
        yield* ci`INSERT INTO sweeper_outbox (stream, type, data, run_id, occurred_at) VALUES (
          ${streamOf(finished)}, 'RunFinished', ${ci.json(dataOf(finished))}, ${runId}::uuid, ${at})`
        yield* Ref.set(dirty, true)
        yield* wakeUp
        return true
      }).pipe(Effect.orElseSucceed(() => false))

    const finishDeferred = (runId: string) =>
      Effect.map(
        ci<{ readonly found: boolean }>`SELECT EXISTS (
          SELECT FROM sweeper_outbox WHERE run_id = ${runId}::uuid AND type = 'RunFinished') AS found`,
        (rows) => rows[0]?.found === true
      )

    return {
      repairEvents: { table: "sweeper_outbox" as const, committed },
      runLedger: { eventsOwed, appendFinished, deferFinished, finishDeferred }
    }
  })

/**
 * The ci repairs' RepairEvents and the run guard's RunLedger, on ci's PgClient with main's
 * MainDatabase (and Metrics: the relay's sweeper_outbox_relay_owed and _failures_total), sharing
 * one relay. With `recover` (commands that write: `start`, `run`), the relay first takes whatever
 * an earlier process left, in the background; commands that only read write nothing, this included.
 */
export const OutboxRepairEvents = (options: { readonly recover: boolean }) =>
  Layer.effectContext(
    Effect.map(makeRelay(options), (relay) =>
      Context.make(RepairEvents, relay.repairEvents).pipe(Context.add(RunLedger, relay.runLedger)))
  )
