/**
 * What every request meets before a handler sees it, whatever its route:
 *
 *   Host     must name this server: its bind address, the address the request came in on,
 *            `localhost`, or a name in SWEEPER_HTTP_ALLOWED_HOSTS; else 421. A page on another
 *            site whose name was rebound to 127.0.0.1 (DNS rebinding) reaches the server from the
 *            operator's browser with its own name as Host, so it can read nothing here.
 *   body     at most MAX_BODY_BYTES: a larger Content-Length is answered 413 before a byte is
 *            read, and a body without one stops being read at the limit (the handler answers 413).
 *   headers  each response says: only our own script, styles and images, never inside a frame
 *            (content security policy, X-Frame-Options), no type sniffing, no Referer sent on.
 *
 * The bearer token of the mutating actions is checked after these (Http.ts, Authorized).
 */
import * as NodeHttpServerRequest from "@effect/platform-node/NodeHttpServerRequest"
import * as ByteSize from "effect/ByteSize"
import * as Effect from "effect/Effect"
import * as HttpIncomingMessage from "effect/http/HttpIncomingMessage"
import * as HttpRouter from "effect/http/HttpRouter"
import * as HttpServerRequest from "effect/http/HttpServerRequest"
import * as HttpServerResponse from "effect/http/HttpServerResponse"
import { SweeperConfig } from "../config/Config.ts"

/** The largest request body read: a run's options are a few dozen bytes. */
export const MAX_BODY_BYTES = 4096

/** The console loads its script, styles and icon from here and talks only to here (fetch, SSE). */
const CONTENT_SECURITY_POLICY = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self'",
  "connect-src 'self'",
  "form-action 'self'",
  "base-uri 'none'",
  "frame-ancestors 'none'"
].join("; ")

const SECURITY_HEADERS = {
  "content-security-policy": CONTENT_SECURITY_POLICY,
  "x-frame-options": "DENY",
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer"
}

/** The name a Host header gives, without its port: lower case, an IPv6 address without its brackets. */
export const hostName = (header: string): string => {
  const value = header.trim().toLowerCase()
  if (value.startsWith("[")) return value.slice(1, value.indexOf("]") === -1 ? undefined : value.indexOf("]"))
  const colon = value.indexOf(":")
  // Several colons: an IPv6 address without brackets, all of it a name.
  return colon === -1 || value.lastIndexOf(":") !== colon ? value : value.slice(0, colon)
}

/** An IPv4 client on a dual-stack socket shows as `::ffff:a.b.c.d`; the Host names `a.b.c.d`. */
const plainAddress = (address: string) => address.toLowerCase().replace(/^::ffff:(?=\d+\.\d+\.\d+\.\d+$)/, "")

/**
 * Whether `host` names this server: `names` (its bind address, `localhost`, the configured ones) or
 * the local address the connection arrived on (a server bound to every address is reached by any).
 */
export const isOwnHost = (host: string, names: ReadonlySet<string>, localAddress: string | undefined): boolean => {
  const name = hostName(host)
  return names.has(name) || (localAddress !== undefined && name === plainAddress(localAddress))
}

const refuse = (status: number, code: string, message: string) =>
  HttpServerResponse.jsonUnsafe({ error: { code, message } }, { status, headers: SECURITY_HEADERS })

/** The 413 every handler that reads a body answers when it was larger than MAX_BODY_BYTES. */
export const payloadTooLarge = {
  error: { code: "payload_too_large" as const, message: `body: larger than ${MAX_BODY_BYTES} bytes` }
}

/** Whether reading a body failed because it passed MAX_BODY_BYTES. */
export const isBodyTooLarge = (error: unknown): boolean =>
  typeof error === "object" && error !== null && "reason" in error && typeof error.reason === "object" &&
  error.reason !== null && "reason" in error.reason && error.reason.reason === "BodyTooLarge"

/** The guards above, on every route of the server (a global router middleware). */
export const HttpGuards = HttpRouter.middleware(
  Effect.gen(function*() {
    const settings = yield* SweeperConfig
    const names = new Set(["localhost", hostName(settings.httpHost), ...settings.httpAllowedHosts.map(hostName)])
    return (httpEffect) =>
      Effect.gen(function*() {
        const request = yield* HttpServerRequest.HttpServerRequest
        const host = request.headers["host"]
        // No Host at all is an HTTP/1.0 client, never a browser; HTTP/1.1 without one Node refuses itself.
        if (host !== undefined) {
          const localAddress = NodeHttpServerRequest.toIncomingMessage(request).socket?.localAddress
          if (!isOwnHost(host, names, localAddress)) {
            return refuse(
              421,
              "misdirected",
              `Host ${JSON.stringify(hostName(host).slice(0, 100))} is not this server's; ` +
                "its other names go in SWEEPER_HTTP_ALLOWED_HOSTS"
            )
          }
        }
        const length = Number(request.headers["content-length"] ?? 0)
        if (!(length <= MAX_BODY_BYTES)) return refuse(413, payloadTooLarge.error.code, payloadTooLarge.error.message)
        const response = yield* Effect.provideService(
          httpEffect,
          HttpIncomingMessage.MaxBodySize,
          ByteSize.bytes(MAX_BODY_BYTES)
        )
        return HttpServerResponse.setHeaders(response, SECURITY_HEADERS)
      })
  }),
  { global: true }
)
