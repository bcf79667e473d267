/**
 * Migration 0011: shadow mode's ledger, `sweeper_shadow_candidates` in main (both modes; Sweeper's
 * own table). One row per proposal a shadow run made (an entity, the rule, the outcome it would
 * have written, the facts it read) and per repair of GitLab's that Sweeper never proposed
 * (`gitlabOnly`). `verdict` is null until a later run reads the entity back and judges it; at most
 * one open proposal per batch and entity (a later run's proposal of the same entity only refreshes
 * it), and one gitlabOnly row per entity and batch, so counts never repeat across runs.
 */
import * as Effect from "effect/Effect"
import * as SqlClient from "effect/sql/SqlClient"

export const shadowCandidates = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE TABLE IF NOT EXISTS sweeper_shadow_candidates (
    id bigserial PRIMARY KEY,
    batch text NOT NULL,
    entity text NOT NULL,
    rule text NOT NULL,
    outcome jsonb NOT NULL,
    facts jsonb NOT NULL,
    run_id uuid NULL,
    proposed_at timestamptz NOT NULL,
    last_proposed_at timestamptz NOT NULL,
    due_at timestamptz NOT NULL,
    verdict text NULL,
    observed jsonb NULL,
    settled_at timestamptz NULL
  )`
  yield* sql`CREATE UNIQUE INDEX IF NOT EXISTS index_sweeper_shadow_candidates_open
    ON sweeper_shadow_candidates (batch, entity) WHERE verdict IS NULL`
  yield* sql`CREATE UNIQUE INDEX IF NOT EXISTS index_sweeper_shadow_candidates_gitlab_only
    ON sweeper_shadow_candidates (batch, entity) WHERE verdict = 'gitlabOnly'`
  yield* sql`CREATE INDEX IF NOT EXISTS index_sweeper_shadow_candidates_on_batch_settled_at
    ON sweeper_shadow_candidates (batch, settled_at)`
  yield* sql`CREATE INDEX IF NOT EXISTS index_sweeper_shadow_candidates_on_entity
    ON sweeper_shadow_candidates (entity)`
})
