import * as Predicate from "effect/Predicate"
import * as Schema from "effect/Schema"
import { redact } from "./Redaction.ts"

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
    : cause === undefined || Predicate.isObject(cause)
    ? ""
    : String(cause)
  if (message.length > 0) return message
  // Node's AggregateError (every address refused) has no message of its own, only a code.
  return Predicate.hasProperty(cause, "code") && typeof cause.code === "string" ? cause.code : ""
}

/**
 * The error-reply code a Redis server (or the in-memory store, which mimics it) puts first in its
 * message: an upper-case word such as `WRONGTYPE` or `ERR`.
 */
export const redisReplyCode = (cause: unknown): string | undefined =>
  /^([A-Z][A-Z_-]+)(?: |$)/.exec(causeMessage(cause))?.[1]

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

/**
 * Why a fenced write may not happen: the lease is no longer ours (LeaseLost: stop for good), or its
 * store could not be read (RedisError: the lease is unknown, so nothing is written; transient, so
 * the run guard retries the run, which checks again).
 */
export type FenceError = LeaseLost | RedisError

/**
 * The row a single-row repair would write is locked by another open transaction, and a
 * run must progress past it: the write skipped it instead of waiting (`SKIP LOCKED`), nothing was
 * written. Not transient for the run guard: the program counts it as skipped and goes on; the next
 * run finds the row again once the lock is gone. `key` names the row (`build:123`).
 */
export class RowLocked extends Schema.TaggedError<RowLocked>()("RowLocked", {
  key: Schema.String
}) {
  override get message() {
    return `${this.key} is locked by another transaction; skipped, the next run retries it`
  }
}

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

/**
 * A pause or resume whose BatchPaused / BatchResumed could not be written (the database refused).
 * The event is the state every replica folds, so nothing was changed: answering success would be
 * undone by the next refresh from the event log and never seen by the other replicas.
 */
export class PauseNotRecorded extends Schema.TaggedError<PauseNotRecorded>()("PauseNotRecorded", {
  batch: Schema.String,
  action: Schema.Literals(["pause", "resume"]),
  detail: Schema.String
}) {
  override get message() {
    return `${this.action} of ${this.batch} could not be recorded, nothing changed: ${this.detail}`
  }
}

/** A batch listed in SWEEPER_DISABLED_BATCHES, asked to run without `--force`. */
export class BatchDisabled extends Schema.TaggedError<BatchDisabled>()("BatchDisabled", {
  name: Schema.String
}) {
  override get message() {
    return `batch ${this.name} is disabled (SWEEPER_DISABLED_BATCHES); pass --force to run it anyway`
  }
}

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
const TRANSIENT_ERRNOS = new Set([
  "ECONNRESET",
  "ECONNREFUSED",
  "ECONNABORTED",
  "EPIPE",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "ENETUNREACH"
])
/** Messages of a connection lost under a query, where no code says so. */
const LOST_CONNECTION =
  /connection (terminated|closed|is closed|ended|timed out)|terminating connection|server closed the connection/i

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
    if (code !== undefined && (TRANSIENT_SQLSTATES.has(code) || code.startsWith("08") || TRANSIENT_ERRNOS.has(code))) {
      return true
    }
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

const MAX_CHAIN = 8

const stringField = (value: unknown, key: string): string | undefined => {
  if (!Predicate.hasProperty(value, key)) return undefined
  const field = value[key]
  return typeof field === "string" && field.length > 0 ? field : typeof field === "number" ? String(field) : undefined
}

/** What one link of a chain adds beyond its message: SQL state, errno code, host. */
const detailsOf = (error: unknown): Array<string> => {
  const details: Array<string> = []
  const code = stringField(error, "code")
  if (code !== undefined) details.push(/^[0-9A-Z]{5}$/.test(code) ? `SQLSTATE ${code}` : code)
  const host = stringField(error, "host") ?? stringField(error, "address")
  const port = stringField(error, "port")
  if (host !== undefined) details.push(port === undefined ? `host ${host}` : `host ${host}:${port}`)
  const detail = stringField(error, "detail")
  if (detail !== undefined) details.push(detail)
  return details
}

/**
 * An error as one line that keeps its cause: every link of its `reason`/`cause` chain that says
 * something new, e.g. `SqlError: PgConnection: Query failed: relation "x" does not exist [SQLSTATE
 * 42P01]` rather than only the outermost wrapper. Secrets it quotes are masked (Redaction.ts).
 */
export const describeError = (error: unknown): string => {
  const parts: Array<string> = []
  const seen = new Set<unknown>()
  let previous: string | undefined
  let node: unknown = error
  for (let depth = 0; depth < MAX_CHAIN && node !== undefined && node !== null && !seen.has(node); depth++) {
    seen.add(node)
    if (typeof node !== "object") {
      parts.push(String(node))
      break
    }
    const tag = stringField(node, "_tag") ?? (node instanceof Error ? node.name : undefined)
    const operation = stringField(node, "operation")
    let message = stringField(node, "message")
    if (message === undefined && Predicate.hasProperty(node, "errors") && Array.isArray(node.errors)) {
      // AggregateError (e.g. a connect to both ::1 and 127.0.0.1): its own message is often empty.
      message = node.errors.map((inner: unknown) => describeError(inner)).join("; ")
    }
    const details = detailsOf(node)
    let text = ""
    if (depth === 0 && tag !== undefined) text = tag
    if (depth === 0 && operation !== undefined && !(message ?? "").includes(operation)) {
      text += text === ""
        ? operation
        : ` (${operation})`
    }
    // A wrapper often repeats its cause's text (or the cause repeats the wrapper's): say it once.
    if (message !== undefined && !(previous ?? "").includes(message)) text += text === "" ? message : `: ${message}`
    if (details.length > 0) {
      const bracket = `[${details.join(", ")}]`
      // A cause that only adds details (a code, a host) adds them to the part before, not a segment of its own.
      if (text !== "") text += ` ${bracket}`
      else if (parts.length > 0) parts[parts.length - 1] += ` ${bracket}`
      else text = bracket
    }
    if (text !== "") parts.push(text)
    if (message !== undefined) previous = message
    node = Predicate.hasProperty(node, "reason") && typeof node.reason === "object"
      ? node.reason
      : Predicate.hasProperty(node, "cause")
      ? node.cause
      : undefined
  }
  return redact(parts.length === 0 ? String(error) : parts.join(": "))
}

/** PostgreSQL or Redis could not be reached (or its URL is unusable) at start-up: exit 3. */
export class InfrastructureUnavailable
  extends Schema.TaggedError<InfrastructureUnavailable>()("InfrastructureUnavailable", {
    service: Schema.Literals(["PostgreSQL", "Redis", "Sweeper supervisor"]),
    /** host:port from the URL, never its credentials. */
    host: Schema.String,
    detail: Schema.String
  })
{
  override get message() {
    return `cannot reach ${this.service} at ${this.host}: ${this.detail}`
  }
}

/** `postgres://u:p@db:5432/x` → `db:5432`; what an operator needs to find the server, nothing secret. */
export const hostOfUrl = (url: string): string => {
  try {
    const parsed = new URL(url)
    return parsed.host === "" ? "(no host in URL)" : parsed.host
  } catch {
    return "(unparsable URL)"
  }
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
