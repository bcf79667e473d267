/**
 * ObjectStorage on an S3-compatible store (AWS, MinIO, Ceph, s3rver) through `@aws-sdk/client-s3`.
 * The object of `<location>:<path>` is the key `<prefix>/<path>` in that location's bucket.
 *
 * DeleteObject is idempotent on S3: a key that is not there still answers 204, so "deleted" also
 * covers "was already gone" (a 404 NoSuchKey from a stricter server counts the same). A 404
 * NoSuchBucket does NOT: a wrong or missing bucket must not look like every object already deleted,
 * so it is an ObjectStorageError like auth, network and 5xx failures — the entry stays.
 */
import type { S3Client } from "@aws-sdk/client-s3"
import * as Arr from "effect/Array"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Redacted from "effect/Redacted"
import * as Result from "effect/Result"
import { type BucketRef, objectKey, type S3Connection } from "../../config/ObjectStorageConfig.ts"
import type { Location } from "../../domain/DirectUpload.ts"
import { ObjectStorageError } from "../../domain/Errors.ts"
import { type BulkDeleteOutcome, type DeleteOutcome, ObjectStorage } from "../../services/ObjectStorage.ts"
import { describeCause, refuseDotSegments } from "./ObjectStorageShared.ts"

/** S3's limit of keys per DeleteObjects request. */
export const DELETE_OBJECTS_MAX_KEYS = 1000

/** Error codes that mean "this key is not there". */
const NOT_THERE = new Set(["NoSuchKey", "NotFound"])

export interface S3Settings {
  readonly connection: S3Connection
  readonly buckets: Partial<Record<Location, BucketRef>>
}

/** Loaded when the layer is built: the SDK costs seconds of start-up that only S3 users should pay. */
export const loadSdk = Effect.promise(() => import("@aws-sdk/client-s3"))
type Sdk = Effect.Success<typeof loadSdk>

/** The S3 client for a connection (also used by the simulator to write the objects it abandons). */
export const clientOf = (sdk: Sdk, connection: S3Connection): S3Client =>
  new sdk.S3Client({
    region: connection.region,
    ...Option.match(connection.endpoint, { onNone: () => ({}), onSome: (endpoint) => ({ endpoint }) }),
    forcePathStyle: connection.pathStyle,
    // Explicit keys, or the SDK's default chain (env, profile, instance role) for use_iam_profile.
    ...(Option.isSome(connection.accessKeyId) && Option.isSome(connection.secretAccessKey)
      ? {
        credentials: {
          accessKeyId: Redacted.value(connection.accessKeyId.value),
          secretAccessKey: Redacted.value(connection.secretAccessKey.value)
        }
      }
      : {}),
    // A failed delete is retried by the next run six minutes later: few quick retries here, and a
    // bounded wait so one hung connection cannot eat the run's budget.
    maxAttempts: 3,
    requestHandler: { connectionTimeout: 5_000, requestTimeout: 30_000 }
  })

export const ObjectStorageS3 = (settings: S3Settings) =>
  Layer.effect(
    ObjectStorage,
    Effect.gen(function*() {
      const sdk = yield* loadSdk
      const { DeleteObjectCommand, DeleteObjectsCommand, S3ServiceException } = sdk
      const codeOf = (cause: unknown): string | undefined =>
        cause instanceof S3ServiceException ? cause.name : undefined
      const client = yield* Effect.acquireRelease(
        Effect.sync(() => clientOf(sdk, settings.connection)),
        (opened) => Effect.sync(() => opened.destroy())
      )
      const where = (ref: BucketRef, key: string) => `s3://${ref.bucket}/${key}`

      const remove = Effect.fn("ObjectStorage.delete")(
        function*(location: Location, path: string): Effect.fn.Return<DeleteOutcome, ObjectStorageError> {
          const ref = settings.buckets[location]
          if (ref === undefined) return "unconfigured"
          yield* refuseDotSegments(location, path)
          const key = objectKey(ref, path)
          return yield* Effect.tryPromise({
            try: (signal) =>
              client.send(new DeleteObjectCommand({ Bucket: ref.bucket, Key: key }), { abortSignal: signal }),
            catch: (cause) => ({ code: codeOf(cause), description: describeCause(cause) })
          }).pipe(
            Effect.as<DeleteOutcome>("deleted"),
            Effect.catch((failed) =>
              NOT_THERE.has(failed.code ?? "")
                ? Effect.succeed<DeleteOutcome>("missing")
                : Effect.fail(
                  new ObjectStorageError({
                    location,
                    path,
                    message: `DeleteObject ${where(ref, key)}: ${failed.description}`
                  })
                )
            )
          )
        }
      )

      /** One DeleteObjects request for at most 1,000 paths (already checked), outcomes in order. */
      const deleteChunk = (location: Location, ref: BucketRef, paths: ReadonlyArray<string>) =>
        Effect.tryPromise({
          try: (signal) =>
            client.send(
              new DeleteObjectsCommand({
                Bucket: ref.bucket,
                Delete: { Objects: paths.map((path) => ({ Key: objectKey(ref, path) })), Quiet: false }
              }),
              { abortSignal: signal }
            ),
          catch: (cause) => ({ description: describeCause(cause) })
        }).pipe(
          Effect.map((response) => {
            const errors = new Map((response.Errors ?? []).map((error) => [error.Key ?? "", error]))
            return paths.map((path): BulkDeleteOutcome => {
              const error = errors.get(objectKey(ref, path))
              if (error === undefined) return Result.succeed("deleted")
              if (NOT_THERE.has(error.Code ?? "")) return Result.succeed("missing")
              return Result.fail(
                new ObjectStorageError({
                  location,
                  path,
                  message: `DeleteObjects ${where(ref, objectKey(ref, path))}: ${error.Code ?? "error"}: ${
                    error.Message ?? ""
                  }`
                })
              )
            })
          }),
          // The whole request failed (auth, network, no such bucket): every path of it failed.
          Effect.catch((failed) =>
            Effect.succeed(paths.map((path): BulkDeleteOutcome =>
              Result.fail(
                new ObjectStorageError({
                  location,
                  path,
                  message: `DeleteObjects s3://${ref.bucket}: ${failed.description}`
                })
              )
            ))
          )
        )

      const deleteMany = Effect.fn("ObjectStorage.deleteMany")(
        function*(location: Location, paths: ReadonlyArray<string>) {
          const ref = settings.buckets[location]
          if (ref === undefined) return paths.map((): BulkDeleteOutcome => Result.succeed("unconfigured"))
          // Paths refused up front get their own outcome and are not sent.
          const checked = yield* Effect.forEach(paths, (path) => Effect.result(refuseDotSegments(location, path)))
          const sendable = paths.filter((_, i) => Result.isSuccess(checked[i]!))
          const sent = Arr.flatten(
            yield* Effect.forEach(
              Arr.chunksOf(sendable, DELETE_OBJECTS_MAX_KEYS),
              (chunk) => deleteChunk(location, ref, chunk)
            )
          )
          let next = 0
          return paths.map((_, i): BulkDeleteOutcome => {
            const check = checked[i]!
            return Result.isFailure(check) ? Result.fail(check.failure) : sent[next++]!
          })
        }
      )

      return ObjectStorage.of({
        hasStore: (location) => settings.buckets[location] !== undefined,
        delete: remove,
        deleteMany
      })
    })
  )
