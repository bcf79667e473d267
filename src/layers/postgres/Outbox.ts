/**
 * Repair events of a decomposed GitLab: the repair is in ci, the ledger in main, and no transaction
 * spans the two. So a ci repair writes its events into ci's `sweeper_outbox` in the repair's own
 * statement or transaction (both commit or neither), and the relay then moves them to main's
 * `sweeper_events`, exactly once whatever dies when:
 *
 * 1. In ci, a transaction claims the oldest outbox rows `FOR UPDATE SKIP LOCKED` (another relay,
 *    another replica's, passes them over).
 * 2. In main, ONE statement records each row's outbox id in `sweeper_relayed` (`ON CONFLICT DO
 *    NOTHING`) and appends the events of exactly the ids it recorded, in outbox order, with their
 *    run and time as written.
 * 3. In ci, the claimed rows are deleted and the transaction commits; then their ids leave
 *    `sweeper_relayed`.
 *
 * Killed before 2 commits: the rows are still in the outbox, nothing in main; relayed later. Killed
 * between 2 and 3: the rows are back (the claim rolled back) but their ids are in `sweeper_relayed`:
 * the next relay appends nothing for them and deletes them. Killed after 3: ids left in
 * `sweeper_relayed` name rows that no longer exist (outbox ids are never reused); the next relay
 * forgets them. The relay runs after every ci repair commits and when the ci layers start, so a
 * crash's leftovers reach the ledger at the next start or the next repair, whichever comes first;
 * a relay that failed is retried within seconds (OutboxRepairEvents).
 */
import { PgClient } from "@effect/sql-pg"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Ref from "effect/Ref"
import * as Schedule from "effect/Schedule"
import type { SqlError } from "effect/sql/SqlError"
import { describeError } from "../../domain/Errors.ts"
import { Metrics, outboxRelayFailuresTotal, outboxRelayOwed } from "../../services/Metrics.ts"
import { MainDatabase } from "./Databases.ts"
import type { EventRow, EventsTable } from "./EventLogSql.ts"

/**
 * Where a repair writes its events in its own transaction, and what must follow the commit. Read
 * once by the repair layers when they are built: main's ledger itself by default; a decomposed
 * GitLab's ci repairs get the outbox and its relay.
 */
export const RepairEvents = Context.Reference<{
  readonly table: EventsTable
  readonly committed: Effect.Effect<void, SqlError>
}>("sweeper/layers/postgres/RepairEvents", {
  defaultValue: () => ({ table: "sweeper_events", committed: Effect.void })
})

/** Outbox rows claimed per relay round: one main statement of at most this many events. */
export const RELAY_BATCH = 1000

/** Moves everything in ci's outbox to main's ledger, exactly once, RELAY_BATCH rows at a time. */
export const relayOutbox = (ci: PgClient.PgClient, main: PgClient.PgClient): Effect.Effect<void, SqlError> => {
  const round = ci.withTransaction(Effect.gen(function*() {
    const rows = yield* ci<EventRow>`SELECT id, stream, type, data, run_id, occurred_at FROM sweeper_outbox
      ORDER BY id LIMIT ${RELAY_BATCH} FOR UPDATE SKIP LOCKED`
    if (rows.length === 0) return []
    const records = rows.map((row) => ({
      id: String(row.id),
      stream: row.stream,
      type: row.type,
      data: row.data,
      run_id: row.run_id,
      occurred_at: row.occurred_at.toISOString()
    }))
    yield* main`WITH batch AS (
        SELECT * FROM jsonb_to_recordset(${main.json(records)})
          AS e(id bigint, stream text, type text, data jsonb, run_id uuid, occurred_at timestamptz)),
      fresh AS (
        INSERT INTO sweeper_relayed (outbox_id) SELECT id FROM batch ON CONFLICT DO NOTHING RETURNING outbox_id)
      INSERT INTO sweeper_events (stream, type, data, run_id, occurred_at)
      SELECT stream, type, data, run_id, occurred_at FROM batch WHERE id IN (SELECT outbox_id FROM fresh) ORDER BY id`
    const ids = records.map((record) => record.id)
    yield* ci`DELETE FROM sweeper_outbox WHERE id = ANY (${ids}::bigint[])`
    return ids
  }))

  return Effect.gen(function*() {
    while (true) {
      const ids = yield* round
      if (ids.length === 0) return
      // Committed away in ci: their ids are no longer needed to recognise a repeated relay.
      yield* main`DELETE FROM sweeper_relayed WHERE outbox_id = ANY (${ids}::bigint[])`
      if (ids.length < RELAY_BATCH) return
    }
  })
}

/** The relay at start-up: first forgets ids a crash left behind whose rows are gone, then relays. */
const recoverOutbox = (ci: PgClient.PgClient, main: PgClient.PgClient) =>
  Effect.gen(function*() {
    const relayed = yield* main<{ readonly id: string }>`SELECT outbox_id AS id FROM sweeper_relayed`
    if (relayed.length > 0) {
      const ids = relayed.map((row) => String(row.id))
      const present = yield* ci<
        { readonly id: string }
      >`SELECT id FROM sweeper_outbox WHERE id = ANY (${ids}::bigint[])`
      const still = new Set(present.map((row) => String(row.id)))
      const gone = ids.filter((id) => !still.has(id))
      if (gone.length > 0) yield* main`DELETE FROM sweeper_relayed WHERE outbox_id = ANY (${gone}::bigint[])`
    }
    yield* relayOutbox(ci, main)
  })

/** How soon a relay that failed (main unreachable, a statement refused) is tried again. */
export const RELAY_RETRY = Duration.seconds(5)

/**
 * The ci repairs' RepairEvents, on ci's PgClient with main's MainDatabase (and Metrics: the relay's
 * sweeper_outbox_relay_owed and _failures_total): events into the outbox,
 * the relay after every commit. With `recover` (commands that write: `start`, `run`), building it
 * relays whatever an earlier process left; commands that only read write nothing, this included.
 *
 * A relay that fails does not fail the repair that committed before it: the builds are failed and
 * their events are safe in ci's outbox, so the page counts what it did (a failed page would be
 * retried, find its builds no longer stuck, and count nothing). The failure is logged and the relay
 * owed: tried again every RELAY_RETRY while this layer lives (not only at the next repair, which
 * may be hours away) and once more when it is released.
 */
export const OutboxRepairEvents = (options: { readonly recover: boolean }) =>
  Layer.effect(
    RepairEvents,
    Effect.gen(function*() {
      const ci = yield* PgClient.PgClient
      const main = yield* MainDatabase
      if (options.recover) yield* recoverOutbox(ci, main)
      const metrics = yield* Metrics
      const owed = yield* Ref.make(false)
      /** Sets whether a relay is owed; answers whether it was before. */
      const setOwed = (value: boolean) =>
        Ref.getAndSet(owed, value).pipe(Effect.tap(metrics.setGauge(outboxRelayOwed, value ? 1 : 0)))
      yield* setOwed(false)
      // Logged when the relay starts failing and when it recovers, not at every page or retry of an
      // outage (the failures counter counts those).
      const relay = relayOutbox(ci, main).pipe(
        Effect.andThen(setOwed(false)),
        Effect.flatMap((wasOwed) =>
          wasOwed ? Effect.logInfo("Repair events relayed from ci's outbox to main's ledger again") : Effect.void
        ),
        Effect.catch((error) =>
          Effect.all([setOwed(true), metrics.increment(outboxRelayFailuresTotal, 1)]).pipe(
            Effect.flatMap(([wasOwed]) =>
              wasOwed ? Effect.void : Effect.logWarning(
                "Repair events not yet relayed from ci's outbox to main's ledger; retrying",
                describeError(error)
              )
            )
          )
        )
      )
      const relayIfOwed = Effect.when(relay, Ref.get(owed))
      yield* relayIfOwed.pipe(Effect.repeat(Schedule.spaced(RELAY_RETRY)), Effect.forkScoped)
      yield* Effect.addFinalizer(() => relayIfOwed.pipe(Effect.timeout(RELAY_RETRY), Effect.ignore))
      return { table: "sweeper_outbox" as const, committed: relay }
    })
  )
