import { assert, describe, it } from "@effect/vitest"
import { DateTime, Duration, Result } from "effect"
import {
  type InvalidReason,
  isStale,
  LOCATIONS,
  MAX_EXEC_DURATION,
  parseEntry,
  type PendingDirectUpload,
  STALE_AFTER,
  staleCutoff
} from "../../src/domain/DirectUpload.ts"

const parsed = (field: string, value: string): PendingDirectUpload => {
  const result = parseEntry({ field, value })
  if (Result.isFailure(result)) return assert.fail(`expected ${field}=${value} to parse, got ${result.failure.reason}`)
  return result.success
}

const reasonOf = (field: string, value: string): InvalidReason => {
  const result = parseEntry({ field, value })
  if (Result.isSuccess(result)) return assert.fail(`expected ${field}=${value} to be invalid`)
  assert.deepStrictEqual({ field: result.failure.field, value: result.failure.value }, { field, value })
  return result.failure.reason
}

describe("DirectUpload.parseEntry", () => {
  it("splits the field at the first colon and reads the value as epoch seconds", () => {
    assert.deepStrictEqual(parsed("artifacts:tmp/uploads/abc123", "1767225600"), {
      field: "artifacts:tmp/uploads/abc123",
      location: "artifacts",
      path: "tmp/uploads/abc123",
      preparedAt: 1767225600
    })
  })

  it("keeps every further colon in the path", () => {
    const upload = parsed("lfs:a:b:c", "10")
    assert.strictEqual(upload.location, "lfs")
    assert.strictEqual(upload.path, "a:b:c")
    assert.strictEqual(upload.field, "lfs:a:b:c")
  })

  it("accepts every GitLab location and nothing else", () => {
    assert.strictEqual(LOCATIONS.length, 9)
    for (const location of LOCATIONS) assert.strictEqual(parsed(`${location}:p`, "1").location, location)
    for (const location of ["Artifacts", "artifact", "", "uploads ", "tmp"]) {
      assert.strictEqual(reasonOf(`${location}:p`, "1"), "unknown_location")
    }
  })

  it("a field without a colon is invalid", () => {
    assert.strictEqual(reasonOf("artifacts", "1"), "no_colon")
    assert.strictEqual(reasonOf("", "1"), "no_colon")
  })

  it("a location with an empty path is invalid (it would name the root)", () => {
    assert.strictEqual(reasonOf("uploads:", "1"), "empty_path")
  })

  it("a value that is not decimal epoch seconds is invalid", () => {
    for (const value of ["", "abc", "12abc", " 12", "0x10", "1e9", "-5", "NaN", "Infinity", "1.2.3"]) {
      assert.strictEqual(reasonOf("artifacts:p", value), "non_numeric_value", JSON.stringify(value))
    }
    assert.strictEqual(parsed("artifacts:p", "1767225600.25").preparedAt, 1767225600.25)
    assert.strictEqual(parsed("artifacts:p", "0").preparedAt, 0)
  })
})

describe("DirectUpload staleness", () => {
  const now = DateTime.makeUnsafe("2026-03-01T12:00:00Z")
  const nowSeconds = DateTime.toEpochMillis(now) / 1000

  it("constants are GitLab's", () => {
    assert.strictEqual(Duration.toSeconds(STALE_AFTER), 10800)
    assert.strictEqual(Duration.toSeconds(MAX_EXEC_DURATION), 250)
    assert.strictEqual(DateTime.formatIso(staleCutoff(now)), "2026-03-01T09:00:00.000Z")
  })

  it("stale strictly before now − 3 h", () => {
    assert.isFalse(isStale({ preparedAt: nowSeconds - 10800 }, now), "exactly 3 h")
    assert.isTrue(isStale({ preparedAt: nowSeconds - 10801 }, now), "3 h + 1 s")
    assert.isFalse(isStale({ preparedAt: nowSeconds - 10799 }, now), "3 h − 1 s")
    assert.isTrue(isStale({ preparedAt: 0 }, now))
    assert.isFalse(isStale({ preparedAt: nowSeconds + 60 }, now), "in the future")
  })

  it("sub-second precision on both sides", () => {
    assert.isTrue(isStale({ preparedAt: nowSeconds - 10800.5 }, now))
    const later = DateTime.makeUnsafe("2026-03-01T12:00:00.500Z")
    assert.isTrue(isStale({ preparedAt: nowSeconds - 10800 }, later))
  })
})
