/**
 * Redis values are bytes. Where they name an object or are compared, Sweeper keeps the bytes and
 * decodes a copy strictly: bytes that are not UTF-8 have no text, so they can neither name an object
 * nor be matched against one (a lossy decoder turns `ok/bin\\xff` into `ok/bin\uFFFD`, the name of a
 * different object).
 */
import * as Option from "effect/Option"

/**
 * Strict UTF-8. `ignoreBOM` keeps a leading U+FEFF in the text instead of silently dropping it, so
 * the text always re-encodes to exactly the bytes read.
 */
const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true })

export const decodeUtf8 = (bytes: Uint8Array): Option.Option<string> => {
  try {
    return Option.some(utf8.decode(bytes))
  } catch {
    return Option.none()
  }
}

const hex = (byte: number) => `\\x${byte.toString(16).padStart(2, "0")}`
/** Bytes a UTF-8 sequence starting with `lead` claims (0: not a lead byte). */
const sequenceLength = (lead: number) =>
  lead < 0x80
    ? 1
    : lead >= 0xc2 && lead <= 0xdf
    ? 2
    : lead >= 0xe0 && lead <= 0xef
    ? 3
    : lead >= 0xf0 && lead <= 0xf4
    ? 4
    : 0

/**
 * Untrusted bytes as unambiguous text for a log line: valid UTF-8 as itself, every byte that is not
 * part of a valid sequence as `\xNN`, a backslash as `\\`.
 */
export const escapeBytes = (bytes: Uint8Array): string => {
  let text = ""
  let i = 0
  while (i < bytes.length) {
    const n = sequenceLength(bytes[i]!)
    const char = n === 0 || i + n > bytes.length ? Option.none<string>() : decodeUtf8(bytes.subarray(i, i + n))
    if (Option.isSome(char)) {
      text += char.value === "\\" ? "\\\\" : char.value
      i += n
    } else {
      text += hex(bytes[i]!)
      i += 1
    }
  }
  return text
}
