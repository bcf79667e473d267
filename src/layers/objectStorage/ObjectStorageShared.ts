/** Helpers the bucket-backed ObjectStorage layers (S3, Azure) share. */
import * as Effect from "effect/Effect"
import * as Predicate from "effect/Predicate"
import type { Location } from "../../domain/DirectUpload.ts"
import { ObjectStorageError } from "../../domain/Errors.ts"

/**
 * A key with a `.` or `..` segment is refused: S3 and Azure store it verbatim, but an HTTP client or
 * server on the way may normalise the URL (`prefix/../x` → `x`) and delete an object outside the
 * location's prefix. GitLab never writes such paths; the entry is kept for a human to look at.
 */
export const refuseDotSegments = (location: Location, path: string): Effect.Effect<void, ObjectStorageError> =>
  path.split("/").some((segment) => segment === "." || segment === "..")
    ? Effect.fail(
      new ObjectStorageError({
        location,
        path,
        message: "path has a . or .. segment; refused (a server could resolve it outside the prefix)"
      })
    )
    : Effect.void

/** One line for an SDK or network error: name, HTTP status and message (never request headers). */
export const describeCause = (cause: unknown): string => {
  const name = Predicate.hasProperty(cause, "name") && typeof cause.name === "string" ? cause.name : "Error"
  const code = Predicate.hasProperty(cause, "code") && typeof cause.code === "string" ? cause.code : undefined
  const status = Predicate.hasProperty(cause, "$metadata") && Predicate.hasProperty(cause.$metadata, "httpStatusCode")
    ? cause.$metadata.httpStatusCode
    : Predicate.hasProperty(cause, "statusCode")
    ? cause.statusCode
    : undefined
  const message = cause instanceof Error ? cause.message : String(cause)
  const head = [
    name,
    code !== undefined && code !== name ? code : undefined,
    typeof status === "number" ? `HTTP ${status}` : undefined
  ]
    .filter((part) => part !== undefined)
    .join(" ")
  return `${head}: ${message.replace(/\s*\n\s*/g, " ").slice(0, 500)}`
}
