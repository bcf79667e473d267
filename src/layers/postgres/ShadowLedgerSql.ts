/** ShadowLedger on PostgreSQL: `sweeper_shadow_candidates` in main (migration 0011). */
import { PgClient } from "@effect/sql-pg"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import {
  agreementOf,
  DISAGREEMENTS,
  SHADOW_SAMPLES,
  type ShadowBatchReport,
  type ShadowCandidate,
  type ShadowSample,
  type Verdict,
  VERDICTS
} from "../../domain/Shadow.ts"
import { ShadowLedger } from "../../services/ShadowLedger.ts"

interface CandidateRow {
  readonly batch: string
  readonly entity: string
  readonly rule: string
  readonly outcome: Record<string, unknown>
  readonly facts: Record<string, unknown>
  readonly run_id: string | null
  readonly proposed_at: Date
  readonly due_at: Date
}

interface SampleRow {
  readonly batch: string
  readonly entity: string
  readonly verdict: Verdict
  readonly rule: string
  readonly outcome: Record<string, unknown>
  readonly facts: Record<string, unknown>
  readonly observed: Record<string, unknown> | null
  readonly settled_at: Date
}

/** Rows per INSERT: well under PostgreSQL's parameter limit at nine columns a row. */
const SLICE = 1000

export const ShadowLedgerSql = Layer.effect(
  ShadowLedger,
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const slices = <A>(items: ReadonlyArray<A>) =>
      Array.from({ length: Math.ceil(items.length / SLICE) }, (_, i) => items.slice(i * SLICE, (i + 1) * SLICE))

    return ShadowLedger.of({
      record: (candidates) =>
        Effect.forEach(slices(candidates), (slice) =>
          sql`INSERT INTO sweeper_shadow_candidates
              (batch, entity, rule, outcome, facts, run_id, proposed_at, last_proposed_at, due_at)
            SELECT c.batch, c.entity, c.rule, c.outcome, c.facts, c.run_id::uuid, c.proposed_at::timestamptz,
              c.proposed_at::timestamptz, c.due_at::timestamptz
            FROM jsonb_to_recordset(${
            sql.json(slice.map((c) => ({
              batch: c.batch,
              entity: c.entity,
              rule: c.rule,
              outcome: c.outcome,
              facts: c.facts,
              run_id: c.runId,
              proposed_at: c.proposedAt.toISOString(),
              due_at: c.dueAt.toISOString()
            })))
          }) AS c(batch text, entity text, rule text, outcome jsonb, facts jsonb, run_id text, proposed_at text,
              due_at text)
            ON CONFLICT (batch, entity) WHERE verdict IS NULL
            DO UPDATE SET last_proposed_at = EXCLUDED.last_proposed_at`, { discard: true }),
      open: (batch, limit) =>
        Effect.map(
          sql<CandidateRow>`SELECT batch, entity, rule, outcome, facts, run_id, proposed_at, due_at
            FROM sweeper_shadow_candidates WHERE batch = ${batch} AND verdict IS NULL
            ORDER BY proposed_at, id LIMIT ${limit}`,
          (rows) =>
            rows.map((row): ShadowCandidate => ({
              batch: row.batch,
              entity: row.entity,
              rule: row.rule,
              outcome: row.outcome,
              facts: row.facts,
              runId: row.run_id,
              proposedAt: row.proposed_at,
              dueAt: row.due_at
            }))
        ),
      settle: (verdicts) =>
        Effect.forEach(slices(verdicts), (slice) =>
          sql`UPDATE sweeper_shadow_candidates c
            SET verdict = v.verdict, observed = v.observed::jsonb, settled_at = v.at::timestamptz
            FROM jsonb_to_recordset(${sql.json(slice.map((v) => ({ ...v, at: v.at.toISOString() })))})
              AS v(batch text, entity text, verdict text, observed jsonb, at text)
            WHERE c.batch = v.batch AND c.entity = v.entity AND c.verdict IS NULL`, { discard: true }),
      proposed: (batches, entities) =>
        entities.length === 0 ? Effect.succeed(new Set<string>()) : Effect.map(
          sql<{ entity: string }>`SELECT DISTINCT entity FROM sweeper_shadow_candidates
            WHERE entity IN ${sql.in(entities)} AND batch IN ${
            sql.in(batches)
          } AND verdict IS DISTINCT FROM 'gitlabOnly'`,
          (rows) => new Set(rows.map((row) => row.entity))
        ),
      gitlabOnly: (found) =>
        Effect.map(
          Effect.forEach(slices(found), (slice) =>
            sql<{ id: string }>`INSERT INTO sweeper_shadow_candidates
                (batch, entity, rule, outcome, facts, proposed_at, last_proposed_at, due_at, verdict, settled_at)
              SELECT f.batch, f.entity, f.rule, f.outcome, f.facts, f.at::timestamptz, f.at::timestamptz,
                f.at::timestamptz, 'gitlabOnly', f.at::timestamptz
              FROM jsonb_to_recordset(${
              sql.json(slice.map((f) => ({
                batch: f.batch,
                entity: f.entity,
                rule: f.rule,
                outcome: f.outcome,
                facts: f.facts,
                at: f.at.toISOString()
              })))
            }) AS f(batch text, entity text, rule text, outcome jsonb, facts jsonb, at text)
              ON CONFLICT (batch, entity) WHERE verdict = 'gitlabOnly' DO NOTHING RETURNING id`),
          (inserted) => inserted.reduce((n, rows) => n + rows.length, 0)
        ),
      report: ({ batches, since }) =>
        Effect.gen(function*() {
          if (batches.length === 0) return []
          const counts = yield* sql<{ batch: string; verdict: string | null; n: string }>`
            SELECT batch, verdict, count(*) AS n FROM sweeper_shadow_candidates
            WHERE batch IN ${sql.in(batches)} AND (verdict IS NULL OR settled_at >= ${since})
            GROUP BY batch, verdict`
          const samples = yield* sql<
            SampleRow
          >`SELECT batch, entity, verdict, rule, outcome, facts, observed, settled_at
            FROM (SELECT *, row_number() OVER (PARTITION BY batch ORDER BY settled_at DESC, id DESC) AS rank
              FROM sweeper_shadow_candidates
              WHERE batch IN ${sql.in(batches)} AND verdict IN ${sql.in(DISAGREEMENTS)} AND settled_at >= ${since}) s
            WHERE rank <= ${SHADOW_SAMPLES} ORDER BY batch, settled_at DESC, id DESC`
          return batches.map((batch): ShadowBatchReport => {
            const of = (verdict: Verdict | null) =>
              Number(counts.find((row) => row.batch === batch && row.verdict === verdict)?.n ?? 0)
            const tally = Object.fromEntries(VERDICTS.map((verdict) => [verdict, of(verdict)])) as Record<
              Verdict,
              number
            >
            return {
              batch,
              ...tally,
              waiting: of(null),
              agreement: agreementOf(tally),
              samples: samples.filter((row) => row.batch === batch).map((row): ShadowSample => ({
                entity: row.entity,
                verdict: row.verdict,
                rule: row.rule,
                outcome: row.outcome,
                facts: row.facts,
                observed: row.observed,
                settledAt: row.settled_at.toISOString()
              }))
            }
          })
        })
    })
  })
)
