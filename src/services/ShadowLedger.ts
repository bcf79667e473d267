/**
 * Shadow mode's ledger (Sweeper's own table): the proposals shadow runs made, and the verdicts later
 * runs gave them once they read GitLab's state back. Only Sweeper's own rows: nothing here touches
 * GitLab's tables or keys. Reading GitLab's state is the ShadowObserver's.
 */
import * as Context from "effect/Context"
import type * as Effect from "effect/Effect"
import type { SqlError } from "effect/sql/SqlError"
import type { ShadowBatchReport, ShadowCandidate, ShadowProposal, Verdict } from "../domain/Shadow.ts"

/** A verdict given to one open proposal, with what was read back. */
export interface Settled {
  readonly batch: string
  readonly entity: string
  readonly verdict: Exclude<Verdict, "gitlabOnly">
  readonly observed: Readonly<Record<string, unknown>> | null
  readonly at: Date
}

/** A repair of GitLab's that no proposal of the batch names. */
export interface GitLabOnly extends ShadowProposal {
  readonly batch: string
  readonly entity: string
  readonly at: Date
}

export class ShadowLedger extends Context.Service<ShadowLedger, {
  /**
   * Records a run's proposals. An entity already open for the batch keeps its first proposal (and
   * so its due time): GitLab's worker has been late since then, not since this run.
   */
  readonly record: (candidates: ReadonlyArray<ShadowCandidate>) => Effect.Effect<void, SqlError>
  /** The batch's open proposals, oldest first, at most `limit` (a reconcile's bound per run). */
  readonly open: (batch: string, limit: number) => Effect.Effect<ReadonlyArray<ShadowCandidate>, SqlError>
  /** Closes open proposals with their verdicts. */
  readonly settle: (verdicts: ReadonlyArray<Settled>) => Effect.Effect<void, SqlError>
  /**
   * Of these entities, those some proposal of any of `batches` ever named (GitLab repaired what
   * Sweeper proposed: not gitlabOnly, even when the proposal was another batch's).
   */
  readonly proposed: (
    batches: ReadonlyArray<string>,
    entities: ReadonlyArray<string>
  ) => Effect.Effect<ReadonlySet<string>, SqlError>
  /** Records repairs of GitLab's never proposed; one per batch and entity. Returns how many were new. */
  readonly gitlabOnly: (found: ReadonlyArray<GitLabOnly>) => Effect.Effect<number, SqlError>
  /** Counts and samples per batch of verdicts given since `since` (open proposals counted as waiting). */
  readonly report: (
    options: { readonly since: Date; readonly batches: ReadonlyArray<string> }
  ) => Effect.Effect<ReadonlyArray<ShadowBatchReport>, SqlError>
}>()("sweeper/services/ShadowLedger") {}
