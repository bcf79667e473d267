/** ObjectStorageLocal on real temporary directories. */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { execFileSync, spawn } from "node:child_process"
import { existsSync, readdirSync } from "node:fs"
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

/**
 * A process swapping `<root>/race` (a directory) and `<root>/swap` (a symlink to `outside`) as fast
 * as it can, with renameat2(RENAME_EXCHANGE): each name is always one or the other, never absent.
 * Resolves once the first swap is done; stopped with the scope.
 */
const swapping = (root: string) =>
  Effect.acquireRelease(
    Effect.callback<ReturnType<typeof spawn>>((resume) => {
      const script = [
        "import ctypes, sys",
        "libc = ctypes.CDLL(None, use_errno=True)",
        "a, b = sys.argv[1].encode(), sys.argv[2].encode()",
        "if libc.renameat2(-100, a, -100, b, 2) != 0: sys.exit('renameat2: errno %d' % ctypes.get_errno())",
        "print('ready', flush=True)",
        "while True: libc.renameat2(-100, a, -100, b, 2)"
      ].join("\n")
      const child = spawn("python3", ["-c", script, join(root, "race"), join(root, "swap")], {
        stdio: ["ignore", "pipe", "inherit"]
      })
      child.stdout.once("data", () => resume(Effect.succeed(child)))
      child.once("exit", (code) => resume(Effect.die(new Error(`swapper exited ${code}`))))
    }),
    (child) =>
      Effect.callback<void>((resume) => {
        child.once("exit", () => resume(Effect.void))
        child.kill("SIGKILL")
      })
  )

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

  it.live(
    "a directory swapped for a symlink to outside the root during a run deletes nothing outside",
    () =>
      Effect.gen(function*() {
        const { root, outside } = yield* tempTree
        const names = Array.from({ length: 1000 }, (_, i) => `f${String(i).padStart(4, "0")}`)
        yield* Effect.promise(async () => {
          await mkdir(join(root, "race"))
          await symlink(outside, join(root, "swap"))
          for (const name of names) {
            await writeFile(join(root, "race", name), "partial upload")
            await writeFile(join(outside, name), "not Sweeper's")
          }
        })
        const outcomes = yield* Effect.scoped(Effect.gen(function*() {
          yield* swapping(root)
          const storage = yield* Effect.provide(ObjectStorage, ObjectStorageLocal({ artifacts: root }))
          return yield* storage.deleteMany("artifacts", names.map((name) => `race/${name}`))
        }))
        const survivors = new Set(readdirSync(outside))
        const lost = names.filter((name) => !survivors.has(name))
        const deleted = outcomes.filter((outcome) => outcome._tag === "Success" && outcome.success === "deleted")
        console.log(`race: ${deleted.length} of ${names.length} deleted inside the root, ${lost.length} outside`)
        assert.deepStrictEqual(lost, [], "files outside the root were deleted")
        assert.isAbove(deleted.length, 0, "the run deleted nothing: the race was not exercised")
      }),
    60_000
  )
})
