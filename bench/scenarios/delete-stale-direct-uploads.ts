/**
 * delete-stale-direct-uploads without an object store (the fields of a known location with no store
 * configured are removed, as GitLab does): a pending_direct_uploads hash where every fifth entry is
 * older than 3 hours.
 *   raw        HSCAN COUNT 1000; per 1000 stale entries one INSERT … SELECT of their
 *              StaleDirectUploadEntryRemoved rows (the event Sweeper writes for an entry of a location
 *              without a store: its stream, type and payload, a run id), then one HDEL of their fields;
 *              no fence, HMGET re-read or compare-and-delete. It checks it wrote exactly one row per
 *              field removed.
 *   raw-no-ledger  HSCAN COUNT 1000, each page's stale fields removed by one HDEL (the baseline
 *              before 2026-11-26 late)
 *   per-record GitLab's loop: HSCAN, and one HDEL round trip per stale entry
 * Repaired = fields gone from the hash, whatever the summary calls them.
 */
import { PgClient } from "@effect/sql-pg"
import { Duration, Effect } from "effect"
import { performance } from "node:perf_hooks"
import { PENDING_DIRECT_UPLOADS_KEY } from "../../src/domain/DirectUpload.ts"
import { DeleteStaleDirectUploads } from "../../src/programs/DeleteStaleDirectUploads.ts"
import { seedPendingUploadFields } from "../../src/simulator/Fixtures.ts"
import type { PhaseContext, Scenario } from "../support/compare.ts"
import { fmt } from "../support/harness.ts"
import { expectLedgerRows, rawRunId } from "../support/ledger.ts"
import { runOnce } from "./platform.ts"

interface Size {
  readonly entries: number
  readonly staleEvery: number
}

/** Real time: the entries' ages are relative to now, and the batch reads the real clock. */
const nowSeconds = () => Math.floor(Date.now() / 1000)
const STALE_BEFORE_AGE = 3 * 3600

const hlen = (context: PhaseContext) => Effect.promise(() => context.redis.hlen(PENDING_DIRECT_UPLOADS_KEY))

const seed = (size: Size, context: PhaseContext) => seedPendingUploadFields(context.redis, size)

/**
 * Fields removed by `phase`, as HLEN before minus after; with `ledgerType`, the phase must have
 * written exactly one row of that type per field removed (support/ledger.ts).
 */
const removedBy = <E, R>(
  context: PhaseContext,
  phase: Effect.Effect<{ readonly seconds?: number }, E, R>,
  ledgerType?: string
) =>
  Effect.gen(function*() {
    const before = yield* hlen(context)
    const { seconds } = yield* phase
    const repaired = before - (yield* hlen(context))
    const notes = ledgerType === undefined ? {} : { events: yield* expectLedgerRows(ledgerType, repaired) }
    return { repaired, ...(seconds === undefined ? {} : { seconds }), notes }
  })

const isStale = (value: string, now: number) => Number(value) < now - STALE_BEFORE_AGE

/** Stale entries per ledger INSERT and HDEL of the raw baseline. */
const RAW_SLICE = 1000

/**
 * The raw limit: HSCAN COUNT 1000; every RAW_SLICE stale entries found (and the rest at the end),
 * with `ledger` one INSERT … SELECT of their StaleDirectUploadEntryRemoved rows (the rows
 * StaleUploadRepairLive writes for a location without a store: stream
 * `direct_upload:<location>:<path>`, `{location, path, preparedAt, reason: "no object store"}`, a run
 * id), built in the statement from two arrays, then one HDEL of their fields. No fence, no HMGET
 * re-read, no compare-and-delete; without `ledger`, each page's stale fields go in one HDEL.
 */
const rawRemove = (ledger: boolean) => (context: PhaseContext) =>
  removedBy(
    context,
    Effect.gen(function*() {
      const sql = yield* PgClient.PgClient
      const runId = rawRunId()
      const start = performance.now()
      const now = nowSeconds()
      const fields: Array<string> = []
      const values: Array<string> = []
      const flush = Effect.gen(function*() {
        if (fields.length === 0) return
        if (ledger) {
          yield* sql`INSERT INTO sweeper_events (stream, type, data, run_id, occurred_at)
            SELECT 'direct_upload:' || f, 'StaleDirectUploadEntryRemoved', jsonb_build_object(
                'location', split_part(f, ':', 1), 'path', substr(f, strpos(f, ':') + 1),
                'preparedAt', v::numeric, 'reason', 'no object store'),
              ${runId}::uuid, now()
            FROM unnest(${fields}::text[], ${values}::text[]) WITH ORDINALITY AS e(f, v, n) ORDER BY n`
        }
        yield* Effect.promise(() => context.redis.hdel(PENDING_DIRECT_UPLOADS_KEY, ...fields))
        fields.length = 0
        values.length = 0
      })
      let cursor = "0"
      do {
        const [next, flat] = yield* Effect.promise(() =>
          context.redis.hscan(PENDING_DIRECT_UPLOADS_KEY, cursor, "COUNT", 1000)
        )
        for (let i = 0; i + 1 < flat.length; i += 2) {
          if (isStale(flat[i + 1]!, now)) {
            fields.push(flat[i]!)
            values.push(flat[i + 1]!)
          }
        }
        if (!ledger || fields.length >= RAW_SLICE) yield* flush
        cursor = next
      } while (cursor !== "0")
      yield* flush
      return { seconds: (performance.now() - start) / 1000 }
    }),
    ledger ? "StaleDirectUploadEntryRemoved" : undefined
  )

export const scenario: Scenario<Size> = {
  name: "delete-stale-direct-uploads",
  description: "stale pending_direct_uploads entries removed (no object store)",
  sizes: {
    small: { entries: 20_000, staleEvery: 5 },
    full: { entries: 1_000_000, staleEvery: 5 }
  },
  describeSize: (size) => `${fmt(size.entries)} fields, ${fmt(Math.ceil(size.entries / size.staleEvery))} stale`,
  seed: (size, context) => seed(size, context),

  sweeper: () => (context) =>
    removedBy(
      context,
      Effect.map(
        runOnce(DeleteStaleDirectUploads, context, { budget: Duration.hours(1) }),
        ({ seconds }) => ({ seconds })
      )
    ),

  raw: () => rawRemove(true),
  rawNoLedger: () => rawRemove(false),

  perRecord: () => (context) =>
    removedBy(
      context,
      Effect.promise(async () => {
        const now = nowSeconds()
        let cursor = "0"
        do {
          const [next, flat] = await context.redis.hscan(PENDING_DIRECT_UPLOADS_KEY, cursor, "COUNT", 100)
          for (let i = 0; i + 1 < flat.length; i += 2) {
            if (isStale(flat[i + 1]!, now)) await context.redis.hdel(PENDING_DIRECT_UPLOADS_KEY, flat[i]!)
          }
          cursor = next
        } while (cursor !== "0")
        return {}
      })
    )
}
