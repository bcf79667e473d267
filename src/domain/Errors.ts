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

/**
 * A Redis key holds the wrong type for what Sweeper expects there (WRONGTYPE): permanent — retrying
 * never heals it — so it is not a RedisError; it is isolated to the key (and the worker) it concerns.
 */
export class WrongTypeKey extends Schema.TaggedError<WrongTypeKey>()("WrongTypeKey", {
  key: Schema.String,
  operation: Schema.String,
  message: Schema.String
}) {}

/** The server's reply text of a failed command, whatever shape the cause takes. */
const replyTextOf = (cause: unknown): string =>
  cause instanceof Error ? cause.message : typeof cause === "string" ? cause : ""

/** A RedisError whose server reply is WRONGTYPE (a key holding another data type). */
export const isWrongType = (error: RedisError): boolean => replyTextOf(error.cause).startsWith("WRONGTYPE")

/** The RedisError of a command on `key` as a WrongTypeKey when that is what it is. */
export const refineWrongType = (key: string) => (error: RedisError): RedisError | WrongTypeKey =>
  isWrongType(error) ? new WrongTypeKey({ key, operation: error.operation, message: replyTextOf(error.cause) }) : error
