/**
 * drop-canceling-builds: what a page's write costs by shape, measured in one process on the same
 * data (BENCHMARKS.md, "What bounds it"). One keyset walk over a fresh ci_builds table; each page is
 * written by the next variant in turn, so every variant sees the same load and table state:
 *
 *   five             BEGIN, fence upsert, guarded UPDATE … FROM jsonb, events INSERT, COMMIT (the
 *                    version before the one-statement page)
 *   single           Sweeper's page: fence, UPDATE and events as data-modifying CTEs, one statement
 *   single-noevents  the same without the events INSERT (what one event row per build costs)
 *   single-sqlev     the same with the event data built in SQL from RETURNING (not adopted: it
 *                    would duplicate the domain's event encoding)
 *   noevents         five without the events INSERT
 *   raw              a bare guarded UPDATE of the page with its commit (the raw baseline's work)
 *
 * Prints each variant's median and minimum per page. Figures only.
 *
 *   PAGE=1000 ROWS=400000 VARIANTS=five,single,single-noevents,raw npm run bench -- detail/drop-canceling-page-shapes
 */
import { NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Effect, Layer } from "effect"
import { performance } from "node:perf_hooks"
import { benchDatabase, migratedDatabase } from "../support/harness.ts"

const ROWS = Number(process.env.ROWS ?? 200_000)
const PAGE = Number(process.env.PAGE ?? 100)
const NOW = new Date("2026-01-01T05:00:00Z")
const CUTOFF = new Date(NOW.getTime() - 3_600_000)
const VARIANTS = (process.env.VARIANTS ?? "five,single").split(",")
const runId = "00000000-0000-0000-0000-000000000001"

const program = Effect.scoped(Effect.gen(function*() {
  const db = yield* benchDatabase(undefined)
  yield* Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    yield* sql`
      INSERT INTO ci_builds (id, project_id, commit_id, name, type, status, failure_reason, runner_id, lock_version, created_at, updated_at, started_at, finished_at)
      SELECT i, 1 + (i * 7919) % 5000, i / 20, 'job ' || (i % 40), 'Ci::Build',
        CASE WHEN i % 10 = 0 THEN 'canceling' WHEN i % 10 < 7 THEN 'success' ELSE 'failed' END,
        NULL, 1 + i % 300, i % 3, ts, ts + interval '5 minutes', ts + interval '1 minute', NULL
      FROM (SELECT i, ${NOW}::timestamptz AT TIME ZONE 'UTC' - interval '2 hours' - ((${ROWS} - i) * (interval '60 days' / ${ROWS})) AS ts
        FROM generate_series(1::bigint, ${ROWS}::bigint) AS i) AS s`
    yield* sql`ANALYZE`
    const times: Record<string, Array<number>> = Object.fromEntries(VARIANTS.map((v) => [v, []]))
    let after: any = undefined
    let pages = 0
    while (true) {
      const keyset = after === undefined
        ? sql``
        : sql`AND (created_at, project_id, id) > (${after.created_at}::timestamp, ${after.project_id}, ${after.id})`
      const page = yield* sql<
        any
      >`SELECT id, project_id, runner_id, lock_version, to_char(created_at, 'YYYY-MM-DD HH24:MI:SS.US') AS created_at_exact FROM ci_builds
        WHERE status = 'canceling' AND type = 'Ci::Build' AND created_at < ${CUTOFF}::timestamptz AT TIME ZONE 'UTC' AND updated_at < ${CUTOFF}::timestamptz AT TIME ZONE 'UTC' ${keyset}
        ORDER BY created_at, project_id, id LIMIT ${PAGE}`
      if (page.length === 0) break
      after = {
        created_at: page[page.length - 1].created_at_exact,
        project_id: page[page.length - 1].project_id,
        id: page[page.length - 1].id
      }
      const v = VARIANTS[pages++ % VARIANTS.length]!
      const rows = page.map((b: any) => ({ id: Number(b.id), read_lock_version: b.lock_version }))
      const evs = page.map((b: any) => ({
        key: String(b.id),
        stream: `build:${b.id}`,
        type: "BuildDropped",
        data: {
          id: Number(b.id),
          project_id: Number(b.project_id),
          runner_id: b.runner_id === null ? null : Number(b.runner_id),
          failure_reason: "stuck_or_timeout_failure"
        }
      }))
      const s = performance.now()
      if (v === "five" || v === "noevents") {
        yield* sql.withTransaction(Effect.gen(function*() {
          yield* sql`INSERT INTO sweeper_lease_fences (name, epoch) VALUES ('x', 1) ON CONFLICT (name) DO UPDATE SET epoch = EXCLUDED.epoch WHERE sweeper_lease_fences.epoch <= EXCLUDED.epoch RETURNING epoch`
          const upd = yield* sql<
            any
          >`UPDATE ci_builds AS b SET status = 'failed', failure_reason = 3, finished_at = ${NOW}, updated_at = ${NOW}, lock_version = b.lock_version + 1
            FROM jsonb_to_recordset(${sql.json(rows)}) AS r(id bigint, read_lock_version integer)
            WHERE b.id = r.id AND b.status = 'canceling' AND b.lock_version = r.read_lock_version RETURNING b.id`
          if (v === "five") {
            const won = new Set(upd.map((r: any) => String(r.id)))
            const batch = evs.filter((e: any) => won.has(e.key)).map(({ key: _key, ...e }: any) => e)
            yield* sql`INSERT INTO sweeper_events (stream, type, data, run_id, occurred_at)
              SELECT e.stream, e.type, e.data, ${runId}::uuid, ${NOW}::timestamptz
              FROM ROWS FROM (jsonb_to_recordset(${
              sql.json(batch)
            }) AS (stream text, type text, data jsonb)) WITH ORDINALITY AS e(stream, type, data, n) ORDER BY e.n`
          }
        }))
      } else if (v === "single" || v === "single-noevents") {
        const ev = v === "single" ?
          sql`, logged AS (INSERT INTO sweeper_events (stream, type, data, run_id, occurred_at)
            SELECT e.stream, e.type, e.data, ${runId}::uuid, ${NOW}::timestamptz
            FROM ROWS FROM (jsonb_to_recordset(${
            sql.json(evs)
          }) AS (key text, stream text, type text, data jsonb)) WITH ORDINALITY AS e(key, stream, type, data, n)
            WHERE e.key IN (SELECT key FROM dropped) ORDER BY e.n)` :
          sql``
        yield* sql<any>`WITH fenced AS (
            INSERT INTO sweeper_lease_fences (name, epoch) VALUES ('x', 1) ON CONFLICT (name) DO UPDATE SET epoch = EXCLUDED.epoch WHERE sweeper_lease_fences.epoch <= EXCLUDED.epoch RETURNING epoch),
          dropped AS (UPDATE ci_builds AS b SET status = 'failed', failure_reason = 3, finished_at = ${NOW}, updated_at = ${NOW}, lock_version = b.lock_version + 1
            FROM jsonb_to_recordset(${sql.json(rows)}) AS r(id bigint, read_lock_version integer)
            WHERE b.id = r.id AND b.status = 'canceling' AND b.lock_version = r.read_lock_version AND EXISTS (SELECT FROM fenced) RETURNING b.id::text AS key)
          ${ev}
          SELECT (SELECT count(*) FROM fenced) AS fenced, (SELECT coalesce(jsonb_agg(key), '[]') FROM dropped) AS keys`
      } else if (v === "single-sqlev") {
        yield* sql<any>`WITH fenced AS (
            INSERT INTO sweeper_lease_fences (name, epoch) VALUES ('x', 1) ON CONFLICT (name) DO UPDATE SET epoch = EXCLUDED.epoch WHERE sweeper_lease_fences.epoch <= EXCLUDED.epoch RETURNING epoch),
          dropped AS (UPDATE ci_builds AS b SET status = 'failed', failure_reason = 3, finished_at = ${NOW}, updated_at = ${NOW}, lock_version = b.lock_version + 1
            FROM jsonb_to_recordset(${sql.json(rows)}) AS r(id bigint, read_lock_version integer)
            WHERE b.id = r.id AND b.status = 'canceling' AND b.lock_version = r.read_lock_version AND EXISTS (SELECT FROM fenced) RETURNING b.id, b.project_id, b.runner_id, b.created_at),
          logged AS (INSERT INTO sweeper_events (stream, type, data, run_id, occurred_at)
            SELECT 'build:' || d.id, 'BuildDropped', jsonb_build_object('id', d.id, 'project_id', d.project_id, 'runner_id', d.runner_id, 'failure_reason', 3), ${runId}::uuid, ${NOW}::timestamptz
            FROM dropped d ORDER BY d.created_at, d.project_id, d.id)
          SELECT (SELECT count(*) FROM fenced) AS fenced, (SELECT coalesce(jsonb_agg(id::text), '[]') FROM dropped) AS keys`
      } else if (v === "raw") {
        yield* sql`UPDATE ci_builds AS b SET status = 'failed', failure_reason = 3, finished_at = ${NOW}, updated_at = ${NOW}, lock_version = b.lock_version + 1
            WHERE id IN (SELECT (x->>'id')::bigint FROM jsonb_array_elements(${
          sql.json(rows)
        }) x) AND status = 'canceling'`
      }
      times[v]!.push(performance.now() - s)
    }
    const med = (a: Array<number>) => {
      const b = [...a].sort((x, y) => x - y)
      return b[Math.floor(b.length / 2)]!
    }
    console.log(
      JSON.stringify({
        PAGE,
        ...Object.fromEntries(
          Object.entries(times).map((
            [k, a]
          ) => [k, `median ${med(a).toFixed(2)} ms, min ${Math.min(...a).toFixed(2)} (n=${a.length})`])
        )
      })
    )
  }).pipe(Effect.provide(Layer.orDie(migratedDatabase(db.url))))
}))
NodeRuntime.runMain(program)
