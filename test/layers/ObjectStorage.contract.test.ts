/**
 * One contract for ObjectStorage, run against every real backend: local directories,
 * S3 (s3rver on loopback) and Azure Blob (azurite on loopback), each server started by this file.
 * A "bucket" is a directory under a temp dir for Local, a bucket for S3, a container for Azure; each
 * test gets fresh ones so the backends' state never leaks between tests.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Context, Effect, Layer, Option, Result } from "effect"
import { mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { dirname, join, relative } from "node:path"
import type { BucketRef } from "../../src/config/ObjectStorageConfig.ts"
import type { Location } from "../../src/domain/DirectUpload.ts"
import { ObjectStorageAzure } from "../../src/layers/objectStorage/ObjectStorageAzure.ts"
import { ObjectStorageLocal } from "../../src/layers/objectStorage/ObjectStorageLocal.ts"
import { DELETE_OBJECTS_MAX_KEYS, ObjectStorageS3 } from "../../src/layers/objectStorage/ObjectStorageS3.ts"
import { ObjectStorage } from "../../src/services/ObjectStorage.ts"
import { azureConnection, closedPort, s3Connection, startAzurite, startS3rver } from "../support/objectServers.ts"

type Mapping = Partial<Record<Location, BucketRef>>

/** What the contract needs from a backend besides the layer under test. */
class Harness extends Context.Service<Harness, {
  readonly name: string
  /** Paths in the bulk-delete test: past S3's 1,000-key request limit where that matters. */
  readonly bulkPaths: number
  /** A new, empty bucket. */
  readonly newBucket: Effect.Effect<string>
  readonly put: (bucket: string, key: string) => Effect.Effect<void>
  /** Every key in the bucket, sorted. */
  readonly list: (bucket: string) => Effect.Effect<ReadonlyArray<string>>
  /** The store under test, configured with `mapping`. */
  readonly store: (mapping: Mapping) => Layer.Layer<ObjectStorage>
  /** The same, but its server does not answer. */
  readonly down: (mapping: Mapping) => Effect.Effect<Layer.Layer<ObjectStorage>>
  /** The same, with wrong credentials (None where there are none: local directories). */
  readonly badCredentials: Option.Option<(mapping: Mapping) => Layer.Layer<ObjectStorage>>
}>()("test/Harness") {}

let counter = 0
const bucketName = () => `b-${process.pid}-${++counter}`

const LocalHarness = Layer.effect(
  Harness,
  Effect.gen(function*() {
    const base = yield* Effect.acquireRelease(
      Effect.promise(() => mkdtemp(join(tmpdir(), "sweeper-contract-"))),
      (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true }))
    )
    const rootsOf = (under: string, mapping: Mapping) =>
      Object.fromEntries(
        Object.entries(mapping).map(([location, ref]) => [location, join(under, ref.bucket, ref.prefix)])
      )
    const walk = async (dir: string): Promise<Array<string>> => {
      const entries = await readdir(dir, { withFileTypes: true })
      const nested = await Promise.all(
        entries.map((entry) =>
          entry.isDirectory() ? walk(join(dir, entry.name)) : Promise.resolve([join(dir, entry.name)])
        )
      )
      return nested.flat()
    }
    return Harness.of({
      name: "Local",
      bulkPaths: 300,
      newBucket: Effect.promise(async () => {
        const bucket = bucketName()
        await mkdir(join(base, bucket))
        return bucket
      }),
      put: (bucket, key) =>
        Effect.promise(async () => {
          await mkdir(dirname(join(base, bucket, key)), { recursive: true })
          await writeFile(join(base, bucket, key), "half an upload")
        }),
      list: (bucket) =>
        Effect.promise(async () =>
          (await walk(join(base, bucket))).map((path) => relative(join(base, bucket), path)).sort()
        ),
      store: (mapping) => ObjectStorageLocal(rootsOf(base, mapping)),
      // A local store that is "down" is an unmounted one: its roots are not there.
      down: (mapping) => Effect.succeed(ObjectStorageLocal(rootsOf(join(base, "not-mounted"), mapping))),
      badCredentials: Option.none()
    })
  })
)

const S3Harness = Layer.effect(
  Harness,
  Effect.gen(function*() {
    const s3 = yield* startS3rver
    return Harness.of({
      name: "S3",
      bulkPaths: DELETE_OBJECTS_MAX_KEYS + 5,
      newBucket: Effect.sync(bucketName).pipe(Effect.tap(s3.createBucket)),
      put: s3.put,
      list: s3.list,
      store: (buckets) => ObjectStorageS3({ connection: s3.connection, buckets }),
      down: (buckets) =>
        Effect.map(
          closedPort,
          (port) => ObjectStorageS3({ connection: s3Connection(`http://127.0.0.1:${port}`), buckets })
        ),
      // s3rver checks the access key id but not SigV4 signatures: a wrong key id is its "bad credentials".
      badCredentials: Option.some((buckets) =>
        ObjectStorageS3({
          connection: s3Connection(s3.endpoint, { accessKeyId: "NOT-A-KEY", secretAccessKey: "wrong" }),
          buckets
        })
      )
    })
  })
)

const AzureHarness = Layer.effect(
  Harness,
  Effect.gen(function*() {
    const azure = yield* startAzurite
    return Harness.of({
      name: "Azure",
      // One request per blob (16 in flight): 300 shows the same as 1,005, in a fifth of the time.
      bulkPaths: 300,
      newBucket: Effect.sync(bucketName).pipe(Effect.tap(azure.createContainer)),
      put: azure.put,
      list: azure.list,
      store: (containers) => ObjectStorageAzure({ connection: azure.connection, containers }),
      down: (containers) =>
        Effect.map(
          closedPort,
          (port) =>
            ObjectStorageAzure({ connection: azureConnection(`http://127.0.0.1:${port}/devstoreaccount1`), containers })
        ),
      badCredentials: Option.some((containers) =>
        ObjectStorageAzure({
          connection: azureConnection(azure.serviceUrl, Buffer.from("not the key").toString("base64")),
          containers
        })
      )
    })
  })
)

const withStore = <A, E>(
  storage: Layer.Layer<ObjectStorage>,
  f: (storage: ObjectStorage["Service"]) => Effect.Effect<A, E>
) => Effect.flatMap(ObjectStorage, f).pipe(Effect.provide(storage))

const contract = (backend: Layer.Layer<Harness>) =>
  layer(backend, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("deletes an existing object: `deleted`, and nothing else in the bucket is touched", () =>
      Effect.gen(function*() {
        const h = yield* Harness
        const bucket = yield* h.newBucket
        for (const key of ["tmp/uploads/a", "tmp/uploads/ab", "tmp/uploads/abc/d", "tmp/other"]) {
          yield* h.put(bucket, key)
        }
        const outcome = yield* withStore(
          h.store({ uploads: { bucket, prefix: "" } }),
          (s) => s.delete("uploads", "tmp/uploads/ab")
        )
        assert.strictEqual(outcome, "deleted")
        assert.deepStrictEqual(yield* h.list(bucket), ["tmp/other", "tmp/uploads/a", "tmp/uploads/abc/d"])
      }))

    it.effect("a missing object counts as deleted (`deleted` or `missing`), and nothing is touched", () =>
      Effect.gen(function*() {
        const h = yield* Harness
        const bucket = yield* h.newBucket
        yield* h.put(bucket, "tmp/keep")
        const outcome = yield* withStore(
          h.store({ uploads: { bucket, prefix: "" } }),
          (s) => s.delete("uploads", "tmp/never-written")
        )
        assert.include(["deleted", "missing"], outcome)
        assert.deepStrictEqual(yield* h.list(bucket), ["tmp/keep"])
      }))

    it.effect("the object is <path> after the bucket's prefix: the same path outside the prefix stays", () =>
      Effect.gen(function*() {
        const h = yield* Harness
        const bucket = yield* h.newBucket
        for (const key of ["pre/fix/tmp/x", "tmp/x", "pre/tmp/x", "pre/fix/tmp/y"]) yield* h.put(bucket, key)
        const storage = h.store({ uploads: { bucket, prefix: "pre/fix" }, artifacts: { bucket, prefix: "" } })
        assert.strictEqual(yield* withStore(storage, (s) => s.delete("uploads", "tmp/x")), "deleted")
        assert.deepStrictEqual(yield* h.list(bucket), ["pre/fix/tmp/y", "pre/tmp/x", "tmp/x"])
        // Another location on the same bucket without a prefix reaches the root-level key.
        assert.strictEqual(yield* withStore(storage, (s) => s.delete("artifacts", "tmp/x")), "deleted")
        assert.deepStrictEqual(yield* h.list(bucket), ["pre/fix/tmp/y", "pre/tmp/x"])
      }))

    it.effect("a location without a store is `unconfigured` and touches nothing", () =>
      Effect.gen(function*() {
        const h = yield* Harness
        const bucket = yield* h.newBucket
        yield* h.put(bucket, "lfs-object")
        const storage = h.store({ uploads: { bucket, prefix: "" } })
        assert.isFalse(yield* withStore(storage, (s) => Effect.succeed(s.hasStore("lfs"))))
        assert.isTrue(yield* withStore(storage, (s) => Effect.succeed(s.hasStore("uploads"))))
        assert.strictEqual(yield* withStore(storage, (s) => s.delete("lfs", "lfs-object")), "unconfigured")
        assert.deepStrictEqual(yield* h.list(bucket), ["lfs-object"])
      }))

    it.effect("a path that climbs out (`..`) is refused as an ObjectStorageError and nothing is touched", () =>
      Effect.gen(function*() {
        const h = yield* Harness
        const bucket = yield* h.newBucket
        for (const key of ["victim", "pre/victim"]) yield* h.put(bucket, key)
        const storage = h.store({ uploads: { bucket, prefix: "pre/fix" } })
        for (const path of ["../victim", "a/../../../victim"]) {
          const error = yield* Effect.flip(withStore(storage, (s) => s.delete("uploads", path)))
          assert.strictEqual(error._tag, "ObjectStorageError")
          assert.deepStrictEqual([error.location, error.path], ["uploads", path])
        }
        assert.deepStrictEqual(yield* h.list(bucket), ["pre/victim", "victim"])
      }))

    it.effect("a bucket that does not exist is an ObjectStorageError, never `every object already gone`", () =>
      Effect.gen(function*() {
        const h = yield* Harness
        const error = yield* Effect.flip(
          withStore(h.store({ uploads: { bucket: "never-created", prefix: "" } }), (s) => s.delete("uploads", "tmp/x"))
        )
        assert.strictEqual(error._tag, "ObjectStorageError")
        assert.deepStrictEqual([error.location, error.path], ["uploads", "tmp/x"])
      }))

    it.effect("the server down: an ObjectStorageError naming the object, for one delete and for every path of a bulk delete", () =>
      Effect.gen(function*() {
        const h = yield* Harness
        const bucket = yield* h.newBucket
        const storage = yield* h.down({ uploads: { bucket, prefix: "" } })
        const error = yield* Effect.flip(withStore(storage, (s) => s.delete("uploads", "tmp/x")))
        assert.strictEqual(error._tag, "ObjectStorageError")
        assert.deepStrictEqual([error.location, error.path], ["uploads", "tmp/x"])
        assert.isAbove(error.message.length, 0)
        const outcomes = yield* withStore(storage, (s) => s.deleteMany("uploads", ["tmp/a", "tmp/b"]))
        assert.deepStrictEqual(
          outcomes.map((outcome) => Result.isFailure(outcome) ? outcome.failure.path : "succeeded"),
          ["tmp/a", "tmp/b"]
        )
      }))

    it.effect("bad credentials: an ObjectStorageError and the object stays", () =>
      Effect.gen(function*() {
        const h = yield* Harness
        if (Option.isNone(h.badCredentials)) {
          // Local directories have no credentials; their permission errors are in ObjectStorageLocal.test.ts.
          assert.strictEqual(h.name, "Local")
          return
        }
        const bucket = yield* h.newBucket
        yield* h.put(bucket, "tmp/x")
        const error = yield* Effect.flip(
          withStore(h.badCredentials.value({ uploads: { bucket, prefix: "" } }), (s) => s.delete("uploads", "tmp/x"))
        )
        assert.strictEqual(error._tag, "ObjectStorageError")
        assert.match(error.message, /403|SignatureDoesNotMatch|AuthorizationFailure|InvalidAccessKeyId|Forbidden/)
        assert.deepStrictEqual(yield* h.list(bucket), ["tmp/x"])
      }))

    it.effect("deleteMany: one outcome per path in order (S3: more keys than one request takes), prefix respected", () =>
      Effect.gen(function*() {
        const h = yield* Harness
        const bucket = yield* h.newBucket
        // Every 100th exists (seeding all would be slow).
        const paths = Array.from({ length: h.bulkPaths }, (_, i) => `tmp/u${String(i).padStart(4, "0")}`)
        const present = paths.filter((_, i) => i % 100 === 0 || i === paths.length - 1)
        yield* Effect.forEach(present, (key) => h.put(bucket, `pre/${key}`), { concurrency: 4, discard: true })
        yield* h.put(bucket, "tmp/u0000")
        yield* h.put(bucket, "pre/keep")
        const asked = [...paths.slice(0, 150), "../keep", ...paths.slice(150)]
        const outcomes = yield* withStore(
          h.store({ uploads: { bucket, prefix: "pre" } }),
          (s) => s.deleteMany("uploads", asked)
        )
        assert.lengthOf(outcomes, asked.length)
        asked.forEach((path, i) => {
          const outcome = outcomes[i]!
          if (path === "../keep") {
            assert.isTrue(
              Result.isFailure(outcome) && outcome.failure.path === "../keep" && outcome.failure.location === "uploads"
            )
          } else if (present.includes(path)) {
            assert.deepStrictEqual(outcome, Result.succeed("deleted"), path)
          } else {
            assert.include(["deleted", "missing"], Result.getOrThrow(outcome), path)
          }
        })
        assert.deepStrictEqual(yield* h.list(bucket), ["pre/keep", "tmp/u0000"])
        // Unconfigured: every path says so.
        const none = yield* withStore(h.store({}), (s) => s.deleteMany("lfs", ["a", "b"]))
        assert.deepStrictEqual(none.map((outcome) => Result.getOrThrow(outcome)), ["unconfigured", "unconfigured"])
      }))
  })

describe("ObjectStorage contract: Local", () => contract(LocalHarness))
describe("ObjectStorage contract: S3 (s3rver)", () => contract(S3Harness))
describe("ObjectStorage contract: Azure Blob (azurite)", () => contract(AzureHarness))
