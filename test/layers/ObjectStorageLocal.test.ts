/** ObjectStorageLocal on real temporary directories. */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { execFileSync } from "node:child_process"
import { existsSync } from "node:fs"
import { chmod, mkdir, mkdtemp, rm, symlink, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import type { Location } from "../../src/domain/DirectUpload.ts"
import { ObjectStorageLocal } from "../../src/layers/objectStorage/ObjectStorageLocal.ts"
import { ObjectStorage } from "../../src/services/ObjectStorage.ts"

/** A temp dir with `artifacts/` (the configured root) and `outside/` next to it; removed afterwards. */
const tempTree = Effect.acquireRelease(
  Effect.promise(async () => {
    const base = await mkdtemp(join(tmpdir(), "sweeper-objects-"))
    await mkdir(join(base, "artifacts"))
    await mkdir(join(base, "outside"))
    return { base, root: join(base, "artifacts"), outside: join(base, "outside") }
  }),
  ({ base }) => Effect.promise(() => rm(base, { recursive: true, force: true }))
)

const touch = (path: string) =>
  Effect.promise(async () => {
    await mkdir(dirname(path), { recursive: true })
    await writeFile(path, "partial upload")
  })

/** Runs `delete` against a store configured with `objectStorage`. */
const deleteWith = (roots: Partial<Record<Location, string>>, location: Location, path: string) =>
  Effect.flatMap(ObjectStorage, (storage) => storage.delete(location, path)).pipe(
    Effect.provide(ObjectStorageLocal(roots))
  )

describe("ObjectStorageLocal", () => {
  it.effect("deletes <root>/<path> and nothing else", () =>
    Effect.gen(function*() {
      const { root } = yield* tempTree
      yield* touch(join(root, "tmp/uploads/abc"))
      yield* touch(join(root, "tmp/uploads/def"))
      assert.strictEqual(yield* deleteWith({ artifacts: root }, "artifacts", "tmp/uploads/abc"), "deleted")
      assert.isFalse(existsSync(join(root, "tmp/uploads/abc")))
      assert.isTrue(existsSync(join(root, "tmp/uploads/def")))
    }))

  it.effect("a path with colons and a harmless `..` that stays inside the root is deleted", () =>
    Effect.gen(function*() {
      const { root } = yield* tempTree
      yield* touch(join(root, "a/b:c:d"))
      assert.strictEqual(yield* deleteWith({ artifacts: root }, "artifacts", "a/x/../b:c:d"), "deleted")
      assert.isFalse(existsSync(join(root, "a/b:c:d")))
    }))

  it.effect("an object that is not there (or whose directory is not) is missing, not an error", () =>
    Effect.gen(function*() {
      const { root } = yield* tempTree
      assert.strictEqual(yield* deleteWith({ artifacts: root }, "artifacts", "never/written"), "missing")
      yield* touch(join(root, "file"))
      assert.strictEqual(yield* deleteWith({ artifacts: root }, "artifacts", "file/below/a/file"), "missing")
      assert.isTrue(existsSync(join(root, "file")))
    }))

  it.effect("a known location without a configured root is unconfigured and touches nothing", () =>
    Effect.gen(function*() {
      const { root } = yield* tempTree
      yield* touch(join(root, "lfs-object"))
      assert.strictEqual(yield* deleteWith({ artifacts: root }, "lfs", "lfs-object"), "unconfigured")
      assert.isTrue(existsSync(join(root, "lfs-object")))
    }))

  it.effect("paths escaping the root are refused: `..`, absolute, the root itself", () =>
    Effect.gen(function*() {
      const { root, outside } = yield* tempTree
      const victim = join(outside, "victim")
      yield* touch(victim)
      for (const path of ["../outside/victim", "a/../../outside/victim", victim, ".", "a/.."]) {
        const error = yield* Effect.flip(deleteWith({ artifacts: root }, "artifacts", path))
        assert.strictEqual(error._tag, "ObjectStorageError")
        assert.deepStrictEqual({ location: error.location, path: error.path }, { location: "artifacts", path })
        assert.match(error.message, /escapes the root/)
      }
      assert.isTrue(existsSync(victim))
      assert.isTrue(existsSync(root))
    }))

  it.effect("a root that is empty, relative or / is refused even when the layer is built directly", () =>
    Effect.gen(function*() {
      for (const root of ["", ".", "relative/dir", "/", "/tmp/.."]) {
        const error = yield* Effect.flip(deleteWith({ uploads: root }, "uploads", "zz-victim-file"))
        assert.match(error.message, /not an absolute directory/, root)
      }
    }))

  it.effect("a symlinked directory leading outside the root is refused", () =>
    Effect.gen(function*() {
      const { root, outside } = yield* tempTree
      const victim = join(outside, "victim")
      yield* touch(victim)
      yield* Effect.promise(() => symlink(outside, join(root, "link")))
      const error = yield* Effect.flip(deleteWith({ artifacts: root }, "artifacts", "link/victim"))
      assert.match(error.message, /symlink/)
      assert.isTrue(existsSync(victim))
    }))

  it.effect("permission denied is an ObjectStorageError and the object stays", () =>
    Effect.gen(function*() {
      const { root } = yield* tempTree
      const locked = join(root, "locked")
      yield* touch(join(locked, "obj"))
      // A read-only directory stops a normal user; root ignores modes, so it also gets the immutable flag.
      yield* Effect.acquireRelease(
        Effect.promise(async () => {
          await chmod(locked, 0o555)
          if (process.getuid?.() === 0) execFileSync("chattr", ["+i", locked])
        }),
        () =>
          Effect.promise(async () => {
            if (process.getuid?.() === 0) execFileSync("chattr", ["-i", locked])
            await chmod(locked, 0o755)
          })
      )
      const error = yield* Effect.flip(deleteWith({ artifacts: root }, "artifacts", "locked/obj"))
      assert.strictEqual(error._tag, "ObjectStorageError")
      assert.match(error.message, /unlink: .*(EACCES|EPERM)/)
      assert.isTrue(existsSync(join(locked, "obj")))
    }))

  it.effect("other filesystem errors are ObjectStorageError: the object is a directory", () =>
    Effect.gen(function*() {
      const { root } = yield* tempTree
      yield* touch(join(root, "dir/inner"))
      const error = yield* Effect.flip(deleteWith({ artifacts: root }, "artifacts", "dir"))
      assert.strictEqual(error._tag, "ObjectStorageError")
      assert.match(error.message, /unlink: .*(EISDIR|EPERM)/)
      assert.isTrue(existsSync(join(root, "dir/inner")))
    }))

  it.effect("a configured root that does not exist (an unmounted store) is an error, not 'missing'", () =>
    Effect.gen(function*() {
      const { base } = yield* tempTree
      const error = yield* Effect.flip(deleteWith({ artifacts: join(base, "not-mounted") }, "artifacts", "obj"))
      assert.match(error.message, /does not exist/)
      yield* touch(join(base, "a-file"))
      const notDir = yield* Effect.flip(deleteWith({ artifacts: join(base, "a-file") }, "artifacts", "obj"))
      assert.match(notDir.message, /not a directory/)
    }))
})
