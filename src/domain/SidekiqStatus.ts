/**
 * Gitlab::SidekiqStatus: while a job is queued or running, Sidekiq keeps
 * `gitlab-sidekiq-status:<jid>` = "1" with a TTL; the key disappears when the job finishes (or the
 * TTL lapses after a crash). An absent key therefore means "completed", whatever the outcome.
 */
import * as Duration from "effect/Duration"

export const jobStatusKey = (jid: string) => `gitlab-sidekiq-status:${jid}`

/** The value Sidekiq stores; only presence matters. */
export const JOB_STATUS_VALUE = "1"

/** Gitlab::SidekiqStatus::DEFAULT_EXPIRATION. */
export const DEFAULT_JOB_STATUS_TTL = Duration.seconds(1800)

/** Project exports can run for hours, so their workers keep their status this long. */
export const EXPORT_JOB_STATUS_TTL = Duration.seconds(21600)

/** Status look-ups go to Redis as one MGET per this many jids. */
export const JOB_STATUS_LOOKUP_SLICE = 1000
