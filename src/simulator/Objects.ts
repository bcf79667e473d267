/**
 * The objects an abandoned direct upload leaves in object storage, written where Sweeper's
 * ObjectStorage layers look for them: `<root>/<path>` for a local store, `<path>` after
 * the bucket's prefix for S3 and Azure. Sweeper's ObjectStorage only deletes; the simulator plays
 * the Workhorse upload that wrote the object, so it needs the other half. One implementation per
 * provider, picked from the same `SWEEPER_OBJECT_STORAGE` settings as Sweeper's.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Redacted from "effect/Redacted"
import { mkdir, writeFile } from "node:fs/promises"
import { dirname, join } from "node:path"
import { SweeperConfig } from "../config/Config.ts"
import { objectKey, type ObjectStorageSettings } from "../config/ObjectStorageConfig.ts"
import type { Location } from "../domain/DirectUpload.ts"
import { clientOf, loadSdk } from "../layers/objectStorage/ObjectStorageS3.ts"

export class SimulatorObjects extends Context.Service<SimulatorObjects, {
  /** Whether `location` has a store (else an upload there leaves only its Redis field). */
  hasStore(location: Location): boolean
  /** Writes the half-finished upload's object; returns where it went (a path or URL). */
  put(location: Location, path: string): Effect.Effect<string | undefined>
}>()("sweeper/simulator/Objects") {}

const BODY = "half an upload, abandoned by the simulator\n"

// The simulator is a fixture: a store it cannot write to is a defect, not a typed error.
const local = (roots: Partial<Record<Location, string>>) =>
  SimulatorObjects.of({
    hasStore: (location) => roots[location] !== undefined,
    put: (location, path) => {
      const root = roots[location]
      if (root === undefined) return Effect.succeed(undefined)
      const file = join(root, path)
      return Effect.promise(async () => {
        await mkdir(dirname(file), { recursive: true })
        await writeFile(file, BODY)
        return file
      })
    }
  })

export const simulatorObjectsLayer = (settings: ObjectStorageSettings): Layer.Layer<SimulatorObjects> => {
  switch (settings._tag) {
    case "Local":
      return Layer.succeed(SimulatorObjects, local(settings.roots))
    case "S3":
      return Layer.effect(
        SimulatorObjects,
        Effect.gen(function*() {
          const sdk = yield* loadSdk
          const client = yield* Effect.acquireRelease(
            Effect.sync(() => clientOf(sdk, settings.connection)),
            (c) => Effect.sync(() => c.destroy())
          )
          return SimulatorObjects.of({
            hasStore: (location) => settings.buckets[location] !== undefined,
            put: (location, path) => {
              const ref = settings.buckets[location]
              if (ref === undefined) return Effect.succeed(undefined)
              const key = objectKey(ref, path)
              return Effect.promise(() =>
                client.send(new sdk.PutObjectCommand({ Bucket: ref.bucket, Key: key, Body: BODY }))
              ).pipe(
                Effect.as(`s3://${ref.bucket}/${key}`)
              )
            }
          })
        })
      )
    case "Azure":
      return Layer.effect(
        SimulatorObjects,
        Effect.gen(function*() {
          const { BlobServiceClient, StorageSharedKeyCredential } = yield* Effect.promise(() =>
            import("@azure/storage-blob")
          )
          const { accountName, accessKey, serviceUrl } = settings.connection
          const service = new BlobServiceClient(
            serviceUrl,
            new StorageSharedKeyCredential(accountName, Redacted.value(accessKey))
          )
          return SimulatorObjects.of({
            hasStore: (location) => settings.containers[location] !== undefined,
            put: (location, path) => {
              const ref = settings.containers[location]
              if (ref === undefined) return Effect.succeed(undefined)
              const name = objectKey(ref, path)
              return Effect.promise(() =>
                service.getContainerClient(ref.bucket).getBlockBlobClient(name).upload(BODY, Buffer.byteLength(BODY))
              ).pipe(
                Effect.as(`${serviceUrl}/${ref.bucket}/${name}`)
              )
            }
          })
        })
      )
  }
}

/** The object writer for the configured `SWEEPER_OBJECT_STORAGE`. */
export const SimulatorObjectsFromConfig = Layer.unwrap(
  Effect.map(SweeperConfig, (settings) => simulatorObjectsLayer(settings.objectStorage))
)
