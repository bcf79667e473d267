/**
 * The console's reads on a ledger of 1 000 000 events: every read is served by an index
 * of migration 0005 (no sequential scan of sweeper_events or sweeper_runs, no sort of a run's
 * events), on the first page and deep in a 10 000-repair run. Timings are printed, never asserted
 * (the machine is shared); the plans are what is asserted.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { bucketsQuery, historyQuery, repairsQuery, runEndsQuery } from "../../src/layers/postgres/RunHistorySql.ts"
import { PgTest } from "../support/postgres.ts"

const EVENTS = 1_000_000
/** 2000 runs of 6 batches over 60 days, 498 repairs each (plus RunStarted/RunFinished): 1 000 000. */
const RUNS = 2000
const PER_RUN = EVENTS / RUNS

interface Plan {
  readonly "Node Type": string
  readonly "Relation Name"?: string
  readonly "Index Name"?: string
  readonly Plans?: ReadonlyArray<Plan>
}

const nodes = (plan: Plan): Array<Plan> => [plan, ...(plan.Plans ?? []).flatMap(nodes)]

describe("console queries at 1M events", () => {
  it.live(
    "run ends, repair pages (first and deep), 30-day history: index scans, printed timings",
    () =>
      Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        const seededAt = Date.now()
        // Run r (1..RUNS) of batch r % 6 finished r × 43 min ago; its events are contiguous in id, as
        // a real run's are. Every append goes through the trigger (one statement here); a run's row
        // takes its repaired count from what its RunFinished says, as the run guard writes it.
        yield* sql`INSERT INTO sweeper_events (stream, type, data, run_id, occurred_at)
        SELECT CASE WHEN e = 1 OR e = ${PER_RUN} THEN 'batch:b' || (r % 6) ELSE 'build:' || (r * ${PER_RUN} + e) END,
          CASE WHEN e = 1 THEN 'RunStarted' WHEN e = ${PER_RUN} THEN 'RunFinished' WHEN e % 10 = 0 THEN 'BuildDoomed' ELSE 'BuildDropped' END,
          CASE WHEN e = ${PER_RUN} THEN jsonb_build_object('batch', 'b' || (r % 6), 'outcome', 'succeeded', 'duration_ms', 1200,
                 'repaired', ${PER_RUN - 2})
               ELSE jsonb_build_object('batch', 'b' || (r % 6), 'id', r * ${PER_RUN} + e) END,
          md5(r::text)::uuid, now() - r * interval '43 minutes' + e * interval '1 millisecond'
        FROM generate_series(1, ${RUNS}) r, generate_series(1, ${PER_RUN}) e
        ORDER BY r, e`
        yield* sql`ANALYZE sweeper_events`
        yield* sql`ANALYZE sweeper_runs`
        console.log(`seeded ${EVENTS} events (${RUNS} runs) in ${Date.now() - seededAt} ms`)
        const counted = yield* sql<{ n: string }>`SELECT count(*) AS n FROM sweeper_events`
        assert.strictEqual(Number(counted[0]!.n), EVENTS)
        const rolled = yield* sql<
          { n: string; repaired: string }
        >`SELECT count(*) AS n, sum(repaired) AS repaired FROM sweeper_runs`
        assert.strictEqual(Number(rolled[0]!.n), RUNS)
        assert.strictEqual(Number(rolled[0]!.repaired), RUNS * (PER_RUN - 2))

        const run = (yield* sql<{ id: string }>`SELECT md5('700')::uuid AS id`)[0]!.id
        const deep = (yield* sql<
          { id: string }
        >`SELECT id FROM sweeper_events WHERE run_id = ${run} ORDER BY id OFFSET 400 LIMIT 1`)[0]!.id
        /** `index` must serve the read; with `noSort`, in its order (a page never sorts the whole run). */
        const explain = (name: string, query: ReturnType<typeof repairsQuery>, index: string, noSort = true) =>
          Effect.gen(function*() {
            const rows = yield* sql<
              { "QUERY PLAN": ReadonlyArray<{ Plan: Plan; "Execution Time": number }> }
            >`EXPLAIN (ANALYZE, FORMAT JSON) ${query}`
            const result = rows[0]!["QUERY PLAN"][0]!
            const all = nodes(result.Plan)
            console.log(`${name}: ${result["Execution Time"].toFixed(2)} ms (${
              all.map((n) => n["Index Name"] ?? n["Node Type"]).join(" > ")
            })`)
            for (const node of all) {
              assert.notStrictEqual(node["Node Type"], "Seq Scan", `${name}: ${JSON.stringify(node)}`)
              if (noSort) {
                assert.notStrictEqual(node["Node Type"], "Sort", `${name} sorts`)
              }
            }
            assert.isTrue(
              all.some((n) =>
                n["Index Name"]?.startsWith(index) === true
              ),
              `${name} uses ${index}`
            )
          })
        // Two rows: the planner may AND the run_id and type indexes and sort the handful found.
        yield* explain("run ends", runEndsQuery(sql, run), "index_sweeper_events_on_run_id", false)
        yield* explain(
          "repairs, first page",
          repairsQuery(sql, run, { limit: 100 }),
          "index_sweeper_events_on_run_id_and_id"
        )
        yield* explain(
          "repairs, deep page",
          repairsQuery(sql, run, { limit: 100, after: Number(deep) }),
          "index_sweeper_events_on_run_id_and_id"
        )
        // Filtered by type the planner may fetch the run's rows and sort them: bounded by the run's size.
        yield* explain(
          "repairs, by type",
          repairsQuery(sql, run, { limit: 100, type: "BuildDoomed" }),
          "index_sweeper_events_on_run_id",
          false
        )
        // Sorted oldest first after the LIMIT: at most HISTORY_MAX_RUNS rows.
        yield* explain(
          "history 30 d",
          historyQuery(sql, "b3", new Date(Date.now() - 30 * 24 * 3600_000)) as never,
          "index_sweeper_runs_on_batch_and_finished_at",
          false
        )
        // Every run of the window, folded by 12 h buckets: still the rollup's index, never the ledger.
        yield* explain(
          "history buckets 30 d",
          bucketsQuery(sql, "b3", new Date(Date.now() - 30 * 24 * 3600_000), 12 * 3600_000) as never,
          "index_sweeper_runs_on_batch_and_finished_at",
          false
        )
      }).pipe(Effect.provide(PgTest)),
    600_000
  )
})
