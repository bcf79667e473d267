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

/** Errors the run guard treats as transient infrastructure trouble worth a retry. */
export const isTransient = (error: unknown): boolean => {
  if (!Predicate.isTagged(error, "RedisError") && !Predicate.isTagged(error, "SqlError")) return false
  return !Predicate.hasProperty(error, "isRetryable") || error.isRetryable === true
}

/** `postgres://user:secret@host` → `postgres://user:***@host`: error texts may quote a URL. */
export const redactSecrets = (text: string): string => text.replace(/([a-z][a-z0-9+.-]*:\/\/[^:/@\s]*):[^@\s]*@/gi, "$1:***@")

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
 * 42P01]` rather than only the outermost wrapper. Passwords in quoted URLs are masked.
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
    if (depth === 0 && operation !== undefined && message !== operation) text += text === "" ? operation : ` (${operation})`
    if (message !== undefined && message !== previous) text += text === "" ? message : `: ${message}`
    if (details.length > 0) text += ` [${details.join(", ")}]`
    if (text !== "") parts.push(text)
    if (message !== undefined) previous = message
    node = Predicate.hasProperty(node, "reason") && typeof node.reason === "object" ? node.reason : Predicate.hasProperty(node, "cause") ? node.cause : undefined
  }
  return redactSecrets(parts.length === 0 ? String(error) : parts.join(": "))
}

/** PostgreSQL or Redis could not be reached (or its URL is unusable) at start-up: exit 3. */
export class InfrastructureUnavailable extends Schema.TaggedError<InfrastructureUnavailable>()("InfrastructureUnavailable", {
  service: Schema.Literals(["PostgreSQL", "Redis", "Sweeper supervisor"]),
  /** host:port from the URL, never its credentials. */
  host: Schema.String,
  detail: Schema.String
}) {
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
