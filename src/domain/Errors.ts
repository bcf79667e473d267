import { Predicate, Schema } from "effect"

/** A Redis command failed (connection lost, timeout, script error). Transient: the run guard retries it. */
export class RedisError extends Schema.TaggedError<RedisError>()("RedisError", {
  operation: Schema.String,
  cause: Schema.Defect()
}) {}

/** The exclusive lease a run depends on is no longer ours: stop writing at the next safe point. */
export class LeaseLost extends Schema.TaggedError<LeaseLost>()("LeaseLost", {
  lease: Schema.String,
  epoch: Schema.Number
}) {}

/** Configuration (environment) that cannot be used; names the variable. */
export class InvalidConfig extends Schema.TaggedError<InvalidConfig>()("InvalidConfig", {
  variable: Schema.String,
  message: Schema.String
}) {}

/** A batch name nobody registered. */
export class UnknownBatch extends Schema.TaggedError<UnknownBatch>()("UnknownBatch", {
  name: Schema.String,
  known: Schema.Array(Schema.String)
}) {}

/** An object-storage operation failed for a reason other than "already gone". */
export class ObjectStorageError extends Schema.TaggedError<ObjectStorageError>()("ObjectStorageError", {
  location: Schema.String,
  path: Schema.String,
  message: Schema.String
}) {}

/** Errors the run guard treats as transient infrastructure trouble worth a retry. */
export const isTransient = (error: unknown): boolean => {
  if (!Predicate.isTagged(error, "RedisError") && !Predicate.isTagged(error, "SqlError")) return false
  return !Predicate.hasProperty(error, "isRetryable") || error.isRetryable === true
}
