import { assert, describe, it } from "@effect/vitest"
import { DateTime, Duration, Option, Result, Schema } from "effect"
import { escapeBytes } from "../../src/domain/Bytes.ts"
import {
  decodeEpochSeconds,
  decodeLocation,
  EpochSeconds,
  type InvalidReason,
  isStale,
  Location,
  LOCATIONS,
  MAX_EXEC_DURATION,
  parseEntry,
  type PendingDirectUpload,
  STALE_AFTER,
  staleCutoff,
  tallyOutcomes
} from "../../src/domain/DirectUpload.ts"

const utf8 = (text: string) => new TextEncoder().encode(text)
const bytes = (...parts: ReadonlyArray<string | ReadonlyArray<number>>) =>
  Uint8Array.from(parts.flatMap((part) => (typeof part === "string" ? [...utf8(part)] : [...part])))

const parsed = (field: string | Uint8Array, value: string): PendingDirectUpload => {
  const result = parseEntry({ field: typeof field === "string" ? utf8(field) : field, value: utf8(value) })
  if (Result.isFailure(result)) {
    return assert.fail(`expected ${String(field)}=${value} to parse, got ${result.failure.reason}`)
  }
  return result.success
}

const reasonOf = (field: string | Uint8Array, value: string | Uint8Array): InvalidReason => {
  const raw = {
    field: typeof field === "string" ? utf8(field) : field,
    value: typeof value === "string" ? utf8(value) : value
  }
  const result = parseEntry(raw)
  if (Result.isSuccess(result)) return assert.fail(`expected ${String(field)}=${String(value)} to be invalid`)
  assert.deepStrictEqual(
    { field: result.failure.field, value: result.failure.value },
    { field: escapeBytes(raw.field), value: escapeBytes(raw.value) }
  )
  return result.failure.reason
}

describe("DirectUpload's plain decoders answer as the schemas do", () => {
  it("locations: every known one, and names that only look like one", () => {
    const names = [...LOCATIONS, "Artifacts", "artifacts ", " lfs", "", "lfs\0", "__proto__", "toString", "constructor"]
    for (const name of names) {
      assert.deepStrictEqual(decodeLocation(name), Schema.decodeUnknownOption(Location)(name), JSON.stringify(name))
    }
  })

  it("epoch seconds: edge cases and 5000 strings drawn from the characters a number is made of", () => {
    const edges = [
      "0",
      "1700000000",
      "1.5",
      "01",
      "1.",
      ".5",
      "1e9",
      "-1",
      "+1",
      " 1",
      "1 ",
      "0x10",
      "",
      "Infinity",
      "NaN",
      "١٢",
      "1,5",
      "9".repeat(400),
      `${"9".repeat(400)}.5`,
      "1.2.3",
      "12\n"
    ]
    const alphabet = ["0", "1", "9", ".", "e", "-", "+", " ", "x", "\n", "١"]
    let seed = 7
    const next = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31)
    const drawn = Array.from(
      { length: 5000 },
      () => Array.from({ length: next() % 8 }, () => alphabet[next() % alphabet.length]!).join("")
    )
    for (const text of [...edges, ...drawn]) {
      assert.deepStrictEqual(
        decodeEpochSeconds(text),
        Schema.decodeUnknownOption(EpochSeconds)(text),
        JSON.stringify(text)
      )
    }
    assert.deepStrictEqual(decodeEpochSeconds("1.5"), Option.some(1.5))
  })
})

describe("DirectUpload.parseEntry", () => {
  it("splits the field at the first colon and reads the value as epoch seconds", () => {
    assert.deepStrictEqual(parsed("artifacts:tmp/uploads/abc123", "1767225600"), {
      field: utf8("artifacts:tmp/uploads/abc123"),
      location: "artifacts",
      path: "tmp/uploads/abc123",
      preparedAt: 1767225600
    })
  })

  it("keeps every further colon in the path", () => {
    const upload = parsed("lfs:a:b:c", "10")
    assert.strictEqual(upload.location, "lfs")
    assert.strictEqual(upload.path, "a:b:c")
    assert.deepStrictEqual(upload.field, utf8("lfs:a:b:c"))
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

describe("DirectUpload.parseEntry on bytes", () => {
  it("a field or value that is not UTF-8 is invalid (not_utf8), never decoded with replacement characters", () => {
    assert.strictEqual(reasonOf(bytes("uploads:ok/bin", [0xff]), "1"), "not_utf8")
    assert.strictEqual(reasonOf("uploads:ok/bin", bytes("1", [0xff])), "not_utf8")
    // A lone surrogate's CESU-8 bytes, an overlong "/", a truncated sequence, a bare continuation byte.
    for (const bad of [[0xed, 0xa0, 0x80], [0xc0, 0xaf], [0xe2, 0x82], [0x80]]) {
      assert.strictEqual(reasonOf(bytes("uploads:a", bad, "b"), "1"), "not_utf8", JSON.stringify(bad))
    }
    // Even when the rest would be malformed too: bytes come first.
    assert.strictEqual(reasonOf(bytes([0xff]), "x"), "not_utf8")
  })

  it("a valid entry keeps the exact bytes read as its field; the path is their text", () => {
    const field = bytes("uploads:", [0xef, 0xbb, 0xbf], "ünï/", [0], "x")
    const upload = parsed(field, "5")
    assert.strictEqual(upload.field, field)
    assert.strictEqual(upload.path, "\uFEFFünï/\u0000x")
    assert.deepStrictEqual(utf8(`uploads:${upload.path}`), field)
  })

  it("a leading byte-order mark is kept, so it is no location", () => {
    assert.strictEqual(reasonOf(bytes([0xef, 0xbb, 0xbf], "uploads:a"), "1"), "unknown_location")
  })

  it("escapeBytes: UTF-8 as itself, other bytes as \\xNN, a backslash doubled", () => {
    assert.strictEqual(escapeBytes(bytes("ok/bin", [0xff])), "ok/bin\\xff")
    assert.strictEqual(escapeBytes(bytes("é", [0xed, 0xa0, 0x80], "\\x")), "é\\xed\\xa0\\x80\\\\x")
    assert.strictEqual(escapeBytes(bytes([0xf0, 0x9f, 0x98, 0x80, 0xf0, 0x9f])), "😀\\xf0\\x9f")
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

describe("tallyOutcomes", () => {
  it("counts a step's outcomes as the summary does: missing is deleted, vanished is its own count", () => {
    assert.deepStrictEqual(
      tallyOutcomes<string>([
        "deleted",
        "missing",
        "unconfigured",
        "vanished",
        "vanished",
        { failed: "403" },
        "deleted"
      ]),
      { deleted: 3, skippedNoStore: 1, vanished: 2, failed: ["403"] }
    )
    assert.deepStrictEqual(tallyOutcomes([]), { deleted: 0, skippedNoStore: 0, vanished: 0, failed: [] })
  })
})
