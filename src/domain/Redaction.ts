/**
 * The one redaction for everything Sweeper prints — logs, `doctor`, `status`, errors, the console
 * and the API: any text may pass through it, a URL on its own or a message quoting one. It masks
 * each secret in every form the drivers and stores accept, and keeps what says where (scheme, user,
 * host, port, database, the other parameters):
 *
 *   `scheme://user:pass@host`   a URL's password, whatever its scheme (postgres, redis, rediss, http
 *                               …), including one with `@` or spaces that the URL parser accepts
 *   `name=value`                a parameter that carries a secret, in a URL query, a libpq keyword
 *                               string or an Azure connection string (`;`-separated): libpq's
 *                               `password`, `sslpassword`; ioredis's `password`, `sentinelPassword`;
 *                               S3's `X-Amz-Signature`, `X-Amz-Credential`, `X-Amz-Security-Token`;
 *                               an Azure SAS token's `sig`, `AccountKey`, `SharedAccessSignature`;
 *                               any `…password`, `…secret`, `…token`, `…access_key` by name
 *   `"name": "value"`           the same names as JSON keys (object-storage configuration)
 *
 * Not masked: a user name (it says which role), `sslkey`/`passfile` (paths to a file holding the
 * secret, not the secret), an access key id (an identifier; its secret is masked).
 */

const MASK = "***"

/** Names of parameters whose value is a secret (case-insensitive, whole names). */
const SECRET_NAME = "(?:[a-z0-9_.-]*(?:password|passwd|secret|token|credential|signature|access_?key|account_?key)" +
  "|pass|pwd|sig)"

/** `name=value` after a separator (start, `?`, `&`, `;`, `,`, space, quote, brace): a quoted value too. */
const PARAMETER = new RegExp(
  `(^|[?&;,\\s"'{(])(${SECRET_NAME})=('(?:[^'\\\\]|\\\\.)*'|"(?:[^"\\\\]|\\\\.)*"|[^&;,\\s"'}#)]+)`,
  "gi"
)

/** `"name": "value"` with a JSON string value. */
const JSON_FIELD = new RegExp(`("${SECRET_NAME}"\\s*:\\s*)"(?:[^"\\\\]|\\\\.)*"`, "gi")

/** Where a URL starts: its scheme and `//`. */
const SCHEME = /\b[a-z][a-z0-9+.-]*:\/\//gi

/** The first index in [from, to) where `pattern` matches, else `to`. */
const firstOf = (text: string, pattern: RegExp, from: number, to: number): number => {
  const found = text.slice(from, to).search(pattern)
  return found === -1 ? to : from + found
}

/**
 * The span of a URL's password, if it has one: after `user:`, up to the last `@` of its authority
 * (a parser takes the last, so a password may hold `@`; the authority ends at `/`, `?`, `#` or the
 * line's end, so it may hold spaces). A `/`, `?` or `#` in a password makes the URL invalid, but a
 * driver's or our own message may still quote it: then up to the last `@` before the next space.
 * The span never reaches into the next URL (a cluster's seed nodes are separated by commas).
 */
const passwordSpan = (text: string, from: number, nextUrl: number): readonly [number, number] | undefined => {
  const user = /^[^:/?#@\s]*:/.exec(text.slice(from, nextUrl))
  if (user === null) return undefined
  const start = from + user[0].length
  const lineEnd = firstOf(text, /\n/, start, nextUrl)
  let at = text.lastIndexOf("@", firstOf(text, /[/?#]/, start, lineEnd) - 1)
  if (at < start) at = text.lastIndexOf("@", firstOf(text, /\s/, start, lineEnd) - 1)
  return at > start ? [start, at] : undefined
}

/** `text` with every secret in it masked (see the header for the forms). */
export const redact = (text: string): string => {
  // Every form above needs a `:` or an `=`; most texts a log line carries (ids, statuses) have
  // neither, and a page's line carries a thousand of them.
  if (!text.includes(":") && !text.includes("=")) return text
  const starts = [...text.matchAll(SCHEME)].map((match) => ({ at: match.index, from: match.index + match[0].length }))
  let masked = ""
  let done = 0
  starts.forEach(({ from }, i) => {
    const span = passwordSpan(text, from, starts[i + 1]?.at ?? text.length)
    if (span === undefined || span[0] < done) return
    masked += text.slice(done, span[0]) + MASK
    done = span[1]
  })
  masked += text.slice(done)
  return masked
    .replace(PARAMETER, (_match, before: string, name: string) => `${before}${name}=${MASK}`)
    .replace(JSON_FIELD, `$1"${MASK}"`)
}
