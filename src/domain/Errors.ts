import { Predicate, Schema } from "effect"

/**
 * Redis error replies that say the request itself is wrong: the same request gets the same answer,
 * so retrying cannot help (a WRONGTYPE key never heals by itself; NOSCRIPT reaching us means
 * ioredis's own EVAL fallback failed too). Every other failure — a closed or refused connection, a
 * timeout, and the replies that say "try again" (LOADING, TRYAGAIN, CLUSTERDOWN, BUSY, MASTERDOWN,
 * READONLY after a failover, MISCONF, OOM) — is transient, which is also the safe default for a
 * failure we do not recognise.
 */
const PERMANENT_REPLIES = new Set([
  "WRONGTYPE",
  "ERR",
  "NOSCRIPT",
  "CROSSSLOT",
  "NOAUTH",
  "WRONGPASS",
  "NOPERM",
  "EXECABORT",
  "BUSYKEY",
  "NOGROUP",
  "UNKILLABLE"
])

/** `ERR` replies that are about the server's load, not the request. */
const TRANSIENT_ERR = /^ERR max number of clients reached/

const causeMessage = (cause: unknown): string => {
  const message = Predicate.hasProperty(cause, "message") && typeof cause.message === "string"
    ? cause.message
    : cause === undefined || Predicate.isObject(cause) ? "" : String(cause)
  if (message.length > 0) return message
  // Node's AggregateError (every address refused) has no message of its own, only a code.
  return Predicate.hasProperty(cause, "code") && typeof cause.code === "string" ? cause.code : ""
}

/**
 * The error-reply code a Redis server (or the in-memory store, which mimics it) puts first in its
 * message: an upper-case word such as `WRONGTYPE` or `ERR`.
 */
export const redisReplyCode = (cause: unknown): string | undefined => /^([A-Z][A-Z_-]+)(?: |$)/.exec(causeMessage(cause))?.[1]

/** Whether repeating the command can succeed (see PERMANENT_REPLIES). */
export const isTransientRedisCause = (cause: unknown): boolean => {
  const code = redisReplyCode(cause)
  if (code === undefined || !PERMANENT_REPLIES.has(code)) return true
  return TRANSIENT_ERR.test(causeMessage(cause))
}

/**
 * A Redis command failed. The message carries the server's (or the client's) own words, the
 * operation and the server's host:port — never the URL, which may hold a password — so a log line
 * or RunFinished reads e.g. `WRONGTYPE Operation against a key holding the wrong kind of value
 * (HSCAN pending_direct_uploads on 127.0.0.1:6379)`. `isRetryable` tells the run guard whether a
 * retry can help (see `isTransientRedisCause`).
 */
export class RedisError extends Schema.TaggedError<RedisError>()("RedisError", {
  operation: Schema.String,
  cause: Schema.Defect(),
  /** `host:port` (or the socket path) of the server that answered; absent for the in-memory store. */
  server: Schema.optional(Schema.String)
}) {
  override get message(): string {
    const where = this.server === undefined ? this.operation : `${this.operation} on ${this.server}`
    const said = causeMessage(this.cause)
    return said.length > 0 ? `${said} (${where})` : `failed (${where})`
  }

  get isRetryable(): boolean {
    return isTransientRedisCause(this.cause)
  }
}

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
 * Errors the run guard treats as transient infrastructure trouble worth a retry: a RedisError by
 * its own `isRetryable` (see `isTransientRedisCause`), a SqlError by `isTransientSqlError`. The run
 * guard also asks this of defects: a transaction whose connection was cut fails its ROLLBACK too, and
 * @effect/sql turns that into a defect carrying the same SqlError.
 */
export const isTransient = (error: unknown): boolean => {
  if (Predicate.isTagged(error, "SqlError")) return isTransientSqlError(error)
  if (!Predicate.isTagged(error, "RedisError")) return false
  return !Predicate.hasProperty(error, "isRetryable") || error.isRetryable === true
}
