/**
 * ObjectStorage on Azure Blob Storage through `@azure/storage-blob` (shared-key auth, as GitLab's
 * AzureRM provider). The object of `<location>:<path>` is the blob `<prefix>/<path>` in that
 * location's container.
 *
 * `deleteIfExists` answers "not there" only for BlobNotFound; a missing container, bad credentials,
 * network or 5xx are ObjectStorageErrors and the entry stays. Snapshots go with their blob (a blob
 * that has snapshots cannot be deleted alone).
 */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Redacted from "effect/Redacted"
import { type AzureConnection, type BucketRef, objectKey } from "../../config/ObjectStorageConfig.ts"
import type { Location } from "../../domain/DirectUpload.ts"
import { ObjectStorageError } from "../../domain/Errors.ts"
import { type BulkDeleteOutcome, type DeleteOutcome, ObjectStorage } from "../../services/ObjectStorage.ts"
import { describeCause, refuseDotSegments } from "./ObjectStorageShared.ts"

/** Deletes in flight at once in `deleteMany`: Azure has no multi-delete outside blob batches. */
export const AZURE_DELETE_CONCURRENCY = 16

export interface AzureSettings {
  readonly connection: AzureConnection
  readonly containers: Partial<Record<Location, BucketRef>>
}

export const ObjectStorageAzure = (settings: AzureSettings) =>
  Layer.effect(
    ObjectStorage,
    Effect.gen(function*() {
      // Loaded when the layer is built: the SDK costs seconds of start-up that only Azure users should pay.
      const { BlobServiceClient, StorageSharedKeyCredential } = yield* Effect.promise(() =>
        import("@azure/storage-blob")
      )
      const { accountName, accessKey, serviceUrl } = settings.connection
      const service = new BlobServiceClient(
        serviceUrl,
        new StorageSharedKeyCredential(accountName, Redacted.value(accessKey)),
        {
          // The SDK's default backs off for up to minutes; a failed delete is retried by the next run anyway.
          retryOptions: { maxTries: 3, retryDelayInMs: 200, maxRetryDelayInMs: 2_000, tryTimeoutInMs: 30_000 }
        }
      )

      const remove = Effect.fn("ObjectStorage.delete")(
        function*(location: Location, path: string): Effect.fn.Return<DeleteOutcome, ObjectStorageError> {
          const ref = settings.containers[location]
          if (ref === undefined) return "unconfigured"
          yield* refuseDotSegments(location, path)
          const name = objectKey(ref, path)
          const blob = service.getContainerClient(ref.bucket).getBlobClient(name)
          const response = yield* Effect.tryPromise({
            try: (abortSignal) => blob.deleteIfExists({ deleteSnapshots: "include", abortSignal }),
            catch: (cause) =>
              new ObjectStorageError({
                location,
                path,
                message: `delete ${serviceUrl}/${ref.bucket}/${name}: ${describeCause(cause)}`
              })
          })
          return response.succeeded ? "deleted" : "missing"
        }
      )

      return ObjectStorage.of({
        hasStore: (location) => settings.containers[location] !== undefined,
        delete: remove,
        deleteMany: (location, paths) =>
          Effect.forEach(paths, (path) => Effect.result(remove(location, path)) as Effect.Effect<BulkDeleteOutcome>, {
            concurrency: AZURE_DELETE_CONCURRENCY
          })
      })
    })
  )
