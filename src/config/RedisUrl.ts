/** Redis store URLs as configured: one server, or a cluster's seed nodes separated by commas. */
import { redact } from "../domain/Redaction.ts"

/** A parsed store URL: one server, or the seed nodes of a cluster plus the shared credentials. */
export type ParsedRedisUrl =
  | { readonly kind: "single"; readonly url: string }
  | {
    readonly kind: "cluster"
    readonly nodes: ReadonlyArray<{ readonly host: string; readonly port: number }>
    readonly username: string | undefined
    readonly password: string | undefined
    readonly tls: boolean
  }

/**
 * A comma in the URL makes it a cluster. Seed nodes must be `redis://` or `rediss://`
 * with a port; credentials come from the first node that has them. A cluster has only database 0,
 * so a path naming another database is refused rather than silently ignored.
 */
export const parseRedisUrl = (raw: string): ParsedRedisUrl | { readonly kind: "invalid"; readonly message: string } => {
  const parts = raw.split(",").map((part) => part.trim()).filter((part) => part.length > 0)
  if (parts.length === 0) return { kind: "invalid", message: "empty Redis URL" }
  const parsed: Array<URL> = []
  for (const part of parts) {
    let url: URL
    try {
      url = new URL(part)
    } catch {
      return {
        kind: "invalid",
        message: parts.length === 1
          ? "expected a redis:// or rediss:// URL (a comma list of them for a cluster)"
          : `seed node ${redact(part)} is not a URL: expected redis:// or rediss://`
      }
    }
    if (url.protocol !== "redis:" && url.protocol !== "rediss:") {
      return { kind: "invalid", message: `expected redis:// or rediss://, got ${url.protocol}//` }
    }
    parsed.push(url)
  }
  if (parts.length === 1) return { kind: "single", url: parts[0]! }
  const nodes: Array<{ host: string; port: number }> = []
  for (const url of parsed) {
    const db = url.pathname.replace(/^\//, "")
    if (db !== "" && db !== "0") return { kind: "invalid", message: `a Redis Cluster has only database 0, got /${db}` }
    // WHATWG URL keeps IPv6 hosts bracketed; ioredis wants them bare.
    nodes.push({ host: url.hostname.replace(/^\[|\]$/g, ""), port: url.port === "" ? 6379 : Number(url.port) })
  }
  const withAuth = parsed.find((url) => url.password !== "" || url.username !== "")
  return {
    kind: "cluster",
    nodes,
    username: withAuth !== undefined && withAuth.username !== "" ? decodeURIComponent(withAuth.username) : undefined,
    password: withAuth !== undefined && withAuth.password !== "" ? decodeURIComponent(withAuth.password) : undefined,
    tls: parsed.some((url) => url.protocol === "rediss:")
  }
}
