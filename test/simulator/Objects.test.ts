/**
 * The simulator's abandoned uploads land exactly where Sweeper looks: for each provider (a local
 * directory, S3 via s3rver, Azure via Azurite, each with a bucket prefix where the provider has
 * one), the object the simulator writes for `<location>:<path>` is the one Sweeper's own
 * ObjectStorage layer then deletes (`deleted`, and `missing` the second time).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { existsSync, mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import type { ObjectStorageSettings } from "../../src/config/ObjectStorageConfig.ts"
import { ObjectStorage } from "../../src/services/ObjectStorage.ts"
import { SimulatorObjects, simulatorObjectsLayer } from "../../src/simulator/Objects.ts"
import { objectStorageLayer } from "../../src/supervisor/App.ts"
import { startAzurite, startS3rver } from "../support/objectServers.ts"

const PATH = "tmp/uploads/5f2b0d7e-1c1e-4c3a-9a55-0f8c1f6d2a11"

/** The simulator writes, Sweeper deletes: returns where the object was and both delete outcomes. */
const roundTrip = (settings: ObjectStorageSettings) =>
  Effect.gen(function*() {
    const objects = yield* SimulatorObjects
    const storage = yield* ObjectStorage
    assert.isTrue(objects.hasStore("uploads"))
    assert.isFalse(objects.hasStore("lfs"))
    assert.isUndefined(yield* objects.put("lfs", PATH), "no store, no object")
    const where = yield* objects.put("uploads", PATH)
    const first = yield* storage.delete("uploads", PATH)
    const second = yield* storage.delete("uploads", PATH)
    return { where, first, second }
  }).pipe(Effect.provide(Layer.mergeAll(simulatorObjectsLayer(settings), objectStorageLayer(settings))))

describe("simulator objects are the ones Sweeper deletes", () => {
  it.effect("local directory", () =>
    Effect.gen(function*() {
      const root = mkdtempSync(join(tmpdir(), "sweeper-sim-objects-"))
      yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(root, { recursive: true, force: true })))
      const { where, first, second } = yield* roundTrip({ _tag: "Local", roots: { uploads: root } })
      assert.strictEqual(where, join(root, PATH))
      assert.strictEqual(first, "deleted")
      assert.strictEqual(second, "missing")
      assert.isFalse(existsSync(join(root, PATH)))
    }).pipe(Effect.scoped))

  it.live("S3 bucket with a prefix", () =>
    Effect.gen(function*() {
      const s3 = yield* startS3rver
      yield* s3.createBucket("uploads")
      const { where, first } = yield* roundTrip({
        _tag: "S3",
        connection: s3.connection,
        buckets: { uploads: { bucket: "uploads", prefix: "gitlab" } }
      })
      assert.strictEqual(where, `s3://uploads/gitlab/${PATH}`)
      assert.strictEqual(first, "deleted")
      assert.deepStrictEqual(yield* s3.list("uploads"), [])
    }).pipe(Effect.scoped), 60_000)

  it.live("Azure container with a prefix", () =>
    Effect.gen(function*() {
      const azure = yield* startAzurite
      yield* azure.createContainer("uploads")
      const { where, first, second } = yield* roundTrip({
        _tag: "Azure",
        connection: azure.connection,
        containers: { uploads: { bucket: "uploads", prefix: "gitlab" } }
      })
      assert.strictEqual(where, `${azure.serviceUrl}/uploads/gitlab/${PATH}`)
      assert.strictEqual(first, "deleted")
      assert.strictEqual(second, "missing")
      assert.deepStrictEqual(yield* azure.list("uploads"), [])
    }).pipe(Effect.scoped), 60_000)
})
