/**
 * How a failed ioredis call becomes a RedisError: the operation, the server's own words (kept in
 * `cause`) and the server's address. The address comes from the client's parsed options, never from
 * the URL, so a password in REDIS_URL cannot reach a log line.
 */
import { RedisError } from "../../domain/Errors.ts"

/** `host:port` of a client, or its unix socket path. */
export const serverName = (
  options: {
    readonly host?: string | undefined
    readonly port?: number | undefined
    readonly path?: string | undefined
  }
): string =>
  options.path !== undefined && options.path !== ""
    ? options.path
    : `${options.host ?? "localhost"}:${options.port ?? 6379}`

/** A `catch` for `Effect.tryPromise` around one command on `server`. */
export const toRedisError = (operation: string, server: string) => (cause: unknown): RedisError =>
  new RedisError({ operation, cause, server })
