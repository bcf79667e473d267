/**
 * Existence checks against the platform's own tables (`namespaces`, `projects`): GitLab's
 * `Namespace.id_in(ids)` / `Project.id_in(ids)` reduced to the ids, for batches that hold ids from
 * Redis which may outlive their rows.
 */
import * as Context from "effect/Context"
import type * as Effect from "effect/Effect"
import type { SqlError } from "effect/sql/SqlError"

export class PlatformRecords extends Context.Service<PlatformRecords, {
  /** The subset of `ids` with a row in `namespaces`, ascending. Empty input → no query. */
  existingNamespaceIds(ids: ReadonlyArray<number>): Effect.Effect<ReadonlyArray<number>, SqlError>
  /** The subset of `ids` with a row in `projects`, ascending. Empty input → no query. */
  existingProjectIds(ids: ReadonlyArray<number>): Effect.Effect<ReadonlyArray<number>, SqlError>
}>()("sweeper/services/PlatformRecords") {}
