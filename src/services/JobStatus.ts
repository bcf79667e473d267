/**
 * Sidekiq job status: which jids have completed, i.e. have no
 * `gitlab-sidekiq-status:<jid>` key any more. `track` / `untrack` are what a Sidekiq job does while
 * it runs; Sweeper itself only reads, tests and the simulator write.
 */
import * as Context from "effect/Context"
import type * as Duration from "effect/Duration"
import type * as Effect from "effect/Effect"
import type { RedisError } from "../domain/Errors.ts"

export class JobStatus extends Context.Service<JobStatus, {
  /**
   * The jids whose status key is absent (never tracked, finished or expired), in input order.
   * Empty input makes no Redis call; otherwise one MGET per `JOB_STATUS_LOOKUP_SLICE` jids.
   */
  completedJids(jids: ReadonlyArray<string>): Effect.Effect<ReadonlyArray<string>, RedisError>
  /** Marks a job as queued/running for `ttl` (SET key "1" EX ttl). */
  track(jid: string, ttl: Duration.Duration): Effect.Effect<void, RedisError>
  /** Marks a job as completed (DEL key). */
  untrack(jid: string): Effect.Effect<void, RedisError>
}>()("sweeper/services/JobStatus") {}
