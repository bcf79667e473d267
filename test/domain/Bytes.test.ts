import { assert, describe, it } from "@effect/vitest"
import { Option } from "effect"
import { decodeUtf8 } from "../../src/domain/Bytes.ts"
import { parseDeferred, parseJournalHeader } from "../../src/domain/ConcurrencyLimit.ts"

const BOM = [0xef, 0xbb, 0xbf]
const bytes = (...parts: ReadonlyArray<string | ReadonlyArray<number>>) =>
  Uint8Array.from(parts.flatMap((part) => typeof part === "string" ? [...new TextEncoder().encode(part)] : [...part]))

describe("decodeUtf8 (the one strict decoder for Redis bytes)", () => {
  it("keeps a leading byte-order mark: the text re-encodes to exactly the bytes read", () => {
    const raw = bytes(BOM, "uploads:a")
    const text = Option.getOrThrow(decodeUtf8(raw))
    assert.strictEqual(text, "\uFEFFuploads:a")
    assert.deepStrictEqual(new TextEncoder().encode(text), raw)
  })

  it("bytes that are not UTF-8 have no text (never a lossy U+FFFD copy)", () => {
    assert.isTrue(Option.isNone(decodeUtf8(bytes("ok/bin", [0xff]))))
    assert.isTrue(Option.isNone(decodeUtf8(bytes([0xed, 0xa0, 0x80]))))
    assert.deepStrictEqual(decodeUtf8(bytes("ünï")), Option.some("ünï"))
  })
})

describe("a byte-order mark before GitLab's JSON", () => {
  // JSON has no BOM (RFC 8259 §8.1) and GitLab's JSON.parse (Ruby) raises on one: an element GitLab
  // could not read is not resumed by Sweeper either; it goes to the dead list, byte for byte.
  it("a deferred element starting with a BOM is not a deferred job", () => {
    const json = `{"args":[1],"buffered_at":1772366400.25}`
    assert.isTrue(Option.isSome(parseDeferred(bytes(json))))
    assert.isTrue(Option.isNone(parseDeferred(bytes(BOM, json))))
  })

  it("a journal header starting with a BOM is unreadable (the journal is buried, not replayed)", () => {
    const header = `{"sweeper_move":1,"batch":"0123456789abcdef01234567","queue":"default","worker":"W","dead":0}`
    assert.isTrue(Option.isSome(parseJournalHeader(bytes(header))))
    assert.isTrue(Option.isNone(parseJournalHeader(bytes(BOM, header))))
  })
})
