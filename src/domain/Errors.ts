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

/**
 * SQLSTATEs that mean "this connection (or the server) went away", not "this statement is wrong":
 * class 08 (connection exception), 57P01 admin_shutdown (pg_terminate_backend), 57P02
 * crash_shutdown, 57P03 cannot_connect_now (starting up / shutting down), 53300
 * too_many_connections. @effect/sql-pg classifies only class 08 as a retryable ConnectionError;
 * the others arrive as a non-retryable UnknownError carrying the code on its cause.
 */
const TRANSIENT_SQLSTATES = new Set(["57P01", "57P02", "57P03", "53300"])
/** Socket-level failures (Node errno codes) of a connection that was cut, refused or timed out. */
const TRANSIENT_ERRNOS = new Set(["ECONNRESET", "ECONNREFUSED", "ECONNABORTED", "EPIPE", "ETIMEDOUT", "EHOSTUNREACH", "ENETUNREACH"])
/** Messages of a connection lost under a query, where no code says so. */
const LOST_CONNECTION = /connection (terminated|closed|is closed|ended|timed out)|terminating connection|server closed the connection/i

const codeOf = (value: unknown): string | undefined =>
  Predicate.hasProperty(value, "code") && typeof value.code === "string" ? value.code : undefined

/** Looks at an error and the chain of its causes (bounded: causes can be cyclic). */
const someCause = (error: unknown, test: (value: unknown) => boolean): boolean => {
  let current: unknown = error
  for (let depth = 0; depth < 5 && current !== undefined && current !== null; depth++) {
    if (test(current)) return true
    current = Predicate.hasProperty(current, "cause") ? current.cause : undefined
  }
  return false
}

/**
 * A SqlError worth retrying: its own `isRetryable` (connection, deadlock, serialization, lock and
 * statement timeouts), or a lost connection that @effect/sql-pg reports as UnknownError (a
 * terminated backend's 57P01, ECONNRESET, "Connection terminated"). Everything else — syntax and
 * undefined objects (42xxx), constraint violations, authentication — is permanent: retrying
 * cannot help and would only hide the fault for three more attempts.
 */
export const isTransientSqlError = (error: unknown): boolean => {
  if (!Predicate.isTagged(error, "SqlError")) return false
  if (Predicate.hasProperty(error, "isRetryable") && error.isRetryable === true) return true
  const reason = Predicate.hasProperty(error, "reason") ? error.reason : undefined
  if (!Predicate.isTagged(reason, "UnknownError")) return false
  return someCause(reason, (value) => {
    const code = codeOf(value)
    if (code !== undefined && (TRANSIENT_SQLSTATES.has(code) || code.startsWith("08") || TRANSIENT_ERRNOS.has(code))) return true
    return value instanceof Error && LOST_CONNECTION.test(value.message)
  })
}

/**
 * Errors the run guard treats as transient infrastructure trouble worth a retry. The run guard
 * also asks this of defects: a transaction whose connection was cut fails its ROLLBACK too, and
 * @effect/sql turns that into a defect carrying the same SqlError.
 */
export const isTransient = (error: unknown): boolean => {
  if (Predicate.isTagged(error, "SqlError")) return isTransientSqlError(error)
  if (!Predicate.isTagged(error, "RedisError")) return false
  return !Predicate.hasProperty(error, "isRetryable") || error.isRetryable === true
}
