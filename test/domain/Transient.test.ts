/**
 * Which errors the run guard retries: lost connections — however @effect/sql-pg reports
 * them — are transient; errors in the statement or the data are permanent.
 */
import { assert, describe, it } from "@effect/vitest"
import {
  ConnectionError,
  ConstraintError,
  SqlError,
  SqlSyntaxError,
  UniqueViolation,
  UnknownError
} from "effect/sql/SqlError"
import { isTransient, isTransientSqlError, RedisError } from "../../src/domain/Errors.ts"

/** A server error as @effect/sql-pg builds it: an Error carrying the ErrorResponse fields. */
const serverError = (code: string, message: string) => Object.assign(new Error(message), { code, severity: "ERROR" })
const unknown = (cause: unknown) =>
  new SqlError({ reason: new UnknownError({ cause, message: "PgConnection: Query failed", operation: "query" }) })

const transient: ReadonlyArray<readonly [string, unknown]> = [
  [
    "socket closed (ConnectionError)",
    new SqlError({
      reason: new ConnectionError({ cause: new Error("Connection closed"), message: "PgConnection: Connection closed" })
    })
  ],
  [
    "57P01 admin_shutdown (pg_terminate_backend)",
    unknown(serverError("57P01", "terminating connection due to administrator command"))
  ],
  [
    "57P02 crash_shutdown",
    unknown(serverError("57P02", "terminating connection because of crash of another server process"))
  ],
  ["57P03 cannot_connect_now", unknown(serverError("57P03", "the database system is starting up"))],
  ["53300 too_many_connections", unknown(serverError("53300", "sorry, too many clients already"))],
  ["08006 connection_failure", unknown(serverError("08006", "connection failure"))],
  ["ECONNRESET", unknown(Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET" }))],
  ["EPIPE", unknown(Object.assign(new Error("write EPIPE"), { code: "EPIPE" }))],
  ["\"Connection terminated\" without a code", unknown(new Error("Connection terminated unexpectedly"))],
  [
    "a lost connection nested one cause deeper",
    unknown(new Error("query failed", { cause: Object.assign(new Error("x"), { code: "ECONNRESET" }) }))
  ],
  ["RedisError", new RedisError({ operation: "get", cause: new Error("ECONNRESET") })]
]

const permanent: ReadonlyArray<readonly [string, unknown]> = [
  [
    "42601 syntax_error",
    new SqlError({
      reason: new SqlSyntaxError({ cause: serverError("42601", "syntax error at or near \"SELEC\""), message: "x" })
    })
  ],
  [
    "42P01 undefined_table",
    new SqlError({
      reason: new SqlSyntaxError({ cause: serverError("42P01", "relation \"ci_builds\" does not exist"), message: "x" })
    })
  ],
  [
    "23505 unique_violation",
    new SqlError({
      reason: new UniqueViolation({ cause: serverError("23505", "duplicate key"), message: "x", constraint: "pk" })
    })
  ],
  [
    "23502 not_null_violation",
    new SqlError({ reason: new ConstraintError({ cause: serverError("23502", "null value"), message: "x" }) })
  ],
  [
    "22P02 invalid_text_representation (UnknownError)",
    unknown(serverError("22P02", "invalid input syntax for type bigint"))
  ],
  ["an UnknownError with no connection trouble", unknown(new Error("COMMIT rolled back an aborted transaction"))],
  ["a plain Error", new Error("ECONNRESET")],
  ["a string", "Connection terminated"]
]

describe("isTransient", () => {
  for (const [name, error] of transient) {
    it(`retries ${name}`, () => assert.isTrue(isTransient(error)))
  }
  for (const [name, error] of permanent) {
    it(`does not retry ${name}`, () => assert.isFalse(isTransient(error)))
  }
  it("isTransientSqlError answers only for SqlError", () => {
    assert.isFalse(isTransientSqlError(new RedisError({ operation: "get", cause: new Error("ECONNRESET") })))
    assert.isTrue(isTransientSqlError(transient[1]![1]))
  })
})
