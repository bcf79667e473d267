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
 * Errors the run guard treats as transient infrastructure trouble worth a retry. An error that says
 * whether it is (`isRetryable`, on RedisError and effect's SqlError) is taken at its word.
 */
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
