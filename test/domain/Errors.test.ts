/** A failure keeps its cause: the one-line rendering walks the whole reason/cause chain. */
import { assert, describe, it } from "@effect/vitest"
import { ConnectionError, SqlError, SqlSyntaxError } from "effect/sql/SqlError"
import { describeError, RedisError } from "../../src/domain/Errors.ts"
import { redact } from "../../src/domain/Redaction.ts"

/** What PostgreSQL's driver hands over for `SELECT * FROM nope` (fields as observed on a real server). */
const pgError = (message: string, code: string) => Object.assign(new Error(message), { severity: "ERROR", code })

describe("describeError", () => {
  it("keeps the SQL state and the server's message under effect's wrapper", () => {
    const error = new SqlError({
      reason: new SqlSyntaxError({
        cause: pgError("relation \"ci_builds\" does not exist", "42P01"),
        message: "PgConnection: Query failed",
        operation: "execute"
      })
    })
    const text = describeError(error)
    assert.include(text, "SqlError")
    assert.include(text, "PgConnection: Query failed")
    assert.include(text, "relation \"ci_builds\" does not exist")
    assert.include(text, "SQLSTATE 42P01")
  })

  it("names the host of a refused connection", () => {
    const refused = Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:5999"), {
      code: "ECONNREFUSED",
      address: "127.0.0.1",
      port: 5999
    })
    const text = describeError(
      new SqlError({ reason: new ConnectionError({ cause: refused, message: "PgConnection: Failed to connect" }) })
    )
    assert.include(text, "ECONNREFUSED")
    assert.include(text, "host 127.0.0.1:5999")
  })

  it("a RedisError says which operation and what Redis answered", () => {
    const text = describeError(
      new RedisError({
        operation: "hscan",
        server: "127.0.0.1:6379",
        cause: new Error("WRONGTYPE Operation against a key holding the wrong kind of value")
      })
    )
    assert.strictEqual(
      text,
      "RedisError: WRONGTYPE Operation against a key holding the wrong kind of value (hscan on 127.0.0.1:6379)"
    )
  })

  it("a refused Redis connection is one clean line: its details join the part before, no empty segment", () => {
    const refused = Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:6399"), {
      code: "ECONNREFUSED",
      address: "127.0.0.1",
      port: 6399
    })
    const text = describeError(new RedisError({ operation: "connect", server: "127.0.0.1:6399", cause: refused }))
    assert.strictEqual(
      text,
      "RedisError: connect ECONNREFUSED 127.0.0.1:6399 (connect on 127.0.0.1:6399) [ECONNREFUSED, host 127.0.0.1:6399]"
    )
  })

  it("an AggregateError lists its inner errors; a plain value is itself", () => {
    assert.include(
      describeError(
        new AggregateError([
          new Error("connect ECONNREFUSED ::1:6379"),
          new Error("connect ECONNREFUSED 127.0.0.1:6379")
        ], "")
      ),
      "127.0.0.1:6379"
    )
    assert.strictEqual(describeError("boom"), "boom")
  })

  it("never shows a password", () => {
    const text = describeError(new Error("could not reach postgres://gitlab:hunter2@db.internal:5432/gitlab"))
    assert.notInclude(text, "hunter2")
    assert.include(text, "postgres://gitlab:***@db.internal:5432/gitlab")
    assert.strictEqual(redact("redis://:s3cret@cache:6379/0"), "redis://:***@cache:6379/0")
  })
})
