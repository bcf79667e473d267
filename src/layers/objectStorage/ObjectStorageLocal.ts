/**
 * ObjectStorage on local directories: `SWEEPER_OBJECT_STORAGE` maps a location to its root and the
 * object is `<root>/<path>`. Nothing outside a root is ever deleted: a path that resolves outside it
 * (`..`, an absolute path, a symlinked directory pointing elsewhere) is refused as an error, which
 * keeps its Redis entry for a human to look at.
 */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Predicate from "effect/Predicate"
import * as Result from "effect/Result"
import { realpath, stat, unlink } from "node:fs/promises"
import { basename, dirname, isAbsolute, join, relative, resolve } from "node:path"
import type { Location } from "../../domain/DirectUpload.ts"
import { ObjectStorageError } from "../../domain/Errors.ts"
import { type DeleteOutcome, ObjectStorage } from "../../services/ObjectStorage.ts"

/** Errors that mean "the object is not there". */
const NOT_THERE = new Set(["ENOENT", "ENOTDIR"])

const errorCode = (cause: unknown): string | undefined =>
  Predicate.hasProperty(cause, "code") && typeof cause.code === "string" ? cause.code : undefined

const errorMessage = (cause: unknown): string => (cause instanceof Error ? cause.message : String(cause))

/** Strictly below `root` (the root itself is not an object). */
const isBelow = (root: string, target: string) => {
  const rel = relative(root, target)
  return rel !== "" && !rel.startsWith("..") && !isAbsolute(rel)
}

/** `roots`: location → absolute root directory, already validated (ObjectStorageConfig). */
export const ObjectStorageLocal = (roots: Partial<Record<Location, string>>) =>
  Layer.sync(ObjectStorage, () => {
    const remove = Effect.fn("ObjectStorage.delete")(
      function*(location: Location, path: string): Effect.fn.Return<DeleteOutcome, ObjectStorageError> {
        const configured = roots[location]
        if (configured === undefined) return "unconfigured"
        const fail = (message: string) => new ObjectStorageError({ location, path, message })
        /** A filesystem call; None when the object (or a directory on its way) is not there. */
        const fs = <A>(what: string, f: () => Promise<A>) =>
          Effect.tryPromise({
            try: f,
            catch: (cause) => ({ code: errorCode(cause), message: errorMessage(cause) })
          }).pipe(
            Effect.map(Option.some),
            Effect.catch((failed) =>
              NOT_THERE.has(failed.code ?? "")
                ? Effect.succeed(Option.none<A>())
                : Effect.fail(fail(`${what}: ${failed.message}`))
            )
          )

        // Validated at start-up already; checked again because an empty root resolves to the working directory.
        if (!isAbsolute(configured) || resolve(configured) === "/") {
          return yield* fail(`root ${JSON.stringify(configured)} is not an absolute directory`)
        }
        const root = resolve(configured)
        const target = resolve(root, path)
        if (!isBelow(root, target)) return yield* fail(`path escapes the root of ${location}`)

        // The root must exist: a missing mount must not look like "every object already deleted".
        const realRoot = yield* fs("root", () => realpath(root))
        if (Option.isNone(realRoot)) return yield* fail(`root ${root} does not exist`)
        const rootStat = yield* fs("root", () => stat(realRoot.value))
        if (Option.isNone(rootStat) || !rootStat.value.isDirectory()) {
          return yield* fail(`root ${root} is not a directory`)
        }

        // Resolve symlinked directories before deleting, so a link cannot lead outside the root.
        const realParent = yield* fs("parent directory", () => realpath(dirname(target)))
        if (Option.isNone(realParent)) return "missing"
        const object = join(realParent.value, basename(target))
        if (!isBelow(realRoot.value, object)) {
          return yield* fail(`path escapes the root of ${location} through a symlink`)
        }

        const removed = yield* fs("unlink", () => unlink(object))
        return Option.isSome(removed) ? "deleted" : "missing"
      }
    )

    return ObjectStorage.of({
      hasStore: (location) => roots[location] !== undefined,
      delete: remove,
      // A local unlink is one syscall: nothing to batch. A location without a root answers for the
      // whole page at once (a page of 1000 stale entries is 1000 effects otherwise).
      deleteMany: (location, paths) =>
        roots[location] === undefined
          ? Effect.succeed(paths.map(() => Result.succeed<DeleteOutcome>("unconfigured")))
          : Effect.forEach(paths, (path) => Effect.result(remove(location, path)))
    })
  })
