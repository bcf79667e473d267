/**
 * ObjectStorage on local directories: `SWEEPER_OBJECT_STORAGE` maps a location to its root and the
 * object is `<root>/<path>`. Nothing outside a root is ever deleted: a path that leaves it (`..`, an
 * absolute path) or passes through a symlink is refused as an error, which keeps its Redis entry for
 * a human to look at.
 *
 * Why this cannot be raced. Whoever can write inside the root can swap a directory on the path for
 * a symlink to anywhere at any moment, so checking the path (realpath, lstat) and then unlinking by
 * that path always leaves a window in which the unlink follows the new link. Here no path is looked
 * up twice and no link is ever followed below the root:
 *
 *   root ──open(O_DIRECTORY)──▶ fd₀ ──open(fd₀/a, O_DIRECTORY|O_NOFOLLOW)──▶ fd₁ ── … ──▶ fdₙ
 *                                                              unlink(fdₙ/<last name>)
 *
 * Each directory is opened relative to the one before it, refusing a symlink (O_NOFOLLOW), and the
 * object is unlinked relative to the last one (unlink never follows its last component either). Node
 * has no openat/unlinkat, so "relative to fd" is `/proc/self/fd/<fd>/<name>`: the kernel resolves
 * that magic link to the very directory the descriptor holds, not to whatever now has its name. What
 * a descriptor holds cannot be swapped: a link put in a directory's place after it was opened is
 * never seen, and one put there before makes the open fail. (A directory of the root moved elsewhere
 * while we hold it is still the one deleted in; moving it out needs write access outside the root,
 * which docs/operations.md says no one but the operator may have.) Linux only: without /proc every
 * delete is refused.
 */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Predicate from "effect/Predicate"
import * as Result from "effect/Result"
import { constants } from "node:fs"
import { type FileHandle, lstat, open, unlink } from "node:fs/promises"
import { isAbsolute, relative, resolve, sep } from "node:path"
import type { Location } from "../../domain/DirectUpload.ts"
import { ObjectStorageError } from "../../domain/Errors.ts"
import { type DeleteOutcome, ObjectStorage } from "../../services/ObjectStorage.ts"

/** Errors that mean "the object is not there". */
const NOT_THERE = new Set(["ENOENT", "ENOTDIR"])

const DIRECTORY = constants.O_RDONLY | constants.O_DIRECTORY
/** A directory below the root: a symlink in its place fails the open (ENOTDIR) instead of being followed. */
const DIRECTORY_NO_LINK = DIRECTORY | constants.O_NOFOLLOW

/** `name` inside the directory `fd` holds, whatever path that directory has now. */
const inside = (fd: FileHandle, name: string) => `/proc/self/fd/${fd.fd}/${name}`

const errorCode = (cause: unknown): string | undefined =>
  Predicate.hasProperty(cause, "code") && typeof cause.code === "string" ? cause.code : undefined

const errorMessage = (cause: unknown): string => (cause instanceof Error ? cause.message : String(cause))

/** The path's names below `root`; None when it is not strictly below it (the root itself is not an object). */
const namesBelow = (root: string, path: string): Option.Option<ReadonlyArray<string>> => {
  const rel = relative(root, resolve(root, path))
  return rel === "" || rel.startsWith("..") || isAbsolute(rel) ? Option.none() : Option.some(rel.split(sep))
}

/** A filesystem call; None when what it names (or a directory on its way) is not there, else a message. */
const attempt = <A>(what: string, f: () => Promise<A>) =>
  Effect.tryPromise({
    try: f,
    catch: (cause) => ({ code: errorCode(cause), message: `${what}: ${errorMessage(cause)}` })
  }).pipe(
    Effect.map(Option.some),
    Effect.catch((failed) =>
      NOT_THERE.has(failed.code ?? "") ? Effect.succeed(Option.none<A>()) : Effect.fail(failed.message)
    )
  )

/** A directory descriptor held for the enclosing scope (None: not there, or not a directory). */
const openDirectory = (what: string, path: string, flags: number) =>
  Effect.acquireRelease(
    attempt(what, () => open(path, flags)),
    Option.match({ onNone: () => Effect.void, onSome: (handle) => Effect.promise(() => handle.close()) })
  )

/**
 * The root's descriptor, or why there is none. The root must exist: a missing mount must not look
 * like "every object already deleted". Its own path is the operator's, so links in it are followed.
 */
const openRoot = (configured: string) =>
  Effect.gen(function*() {
    // Validated at start-up already; checked again because an empty root resolves to the working directory.
    if (!isAbsolute(configured) || resolve(configured) === "/") {
      return yield* Effect.fail(`root ${JSON.stringify(configured)} is not an absolute directory`)
    }
    const root = resolve(configured)
    const handle = yield* openDirectory("root", root, DIRECTORY)
    if (Option.isNone(handle)) {
      const found = yield* attempt("root", () => lstat(root))
      return yield* Effect.fail(
        Option.isNone(found) ? `root ${root} does not exist` : `root ${root} is not a directory`
      )
    }
    // Without /proc every name below would look absent, and every entry would be dropped as "missing".
    const proc = yield* attempt("/proc/self/fd", () => lstat(`/proc/self/fd/${handle.value.fd}`))
    if (Option.isNone(proc)) return yield* Effect.fail("no /proc/self/fd: cannot delete without following links")
    return { root, handle: handle.value }
  })

/** `roots`: location → absolute root directory, already validated (ObjectStorageConfig). */
export const ObjectStorageLocal = (roots: Partial<Record<Location, string>>) =>
  Layer.sync(ObjectStorage, () => {
    /** One object below the root `directory` holds. */
    const removeBelow = (location: Location, root: string, directory: FileHandle, path: string) =>
      Effect.scoped(Effect.gen(function*() {
        const names = namesBelow(root, path)
        if (Option.isNone(names)) return yield* Effect.fail(`path escapes the root of ${location}`)
        let parent = directory
        for (const name of names.value.slice(0, -1)) {
          const next = yield* openDirectory("directory", inside(parent, name), DIRECTORY_NO_LINK)
          if (Option.isNone(next)) {
            // Absent, a file (so the object is not there) or a link (refused). Asked only to choose
            // the answer: what is deleted never depends on it.
            const found = yield* attempt("directory", () => lstat(inside(parent, name)))
            return Option.isSome(found) && found.value.isSymbolicLink()
              ? yield* Effect.fail(`path escapes the root of ${location} through a symlink`)
              : "missing" as const
          }
          parent = next.value
        }
        const removed = yield* attempt("unlink", () => unlink(inside(parent, names.value.at(-1)!)))
        return Option.isSome(removed) ? "deleted" as const : "missing" as const
      }))

    /** The location's paths, under one descriptor of its root opened for them all. */
    const removeAll = (location: Location, paths: ReadonlyArray<string>) =>
      Effect.scoped(Effect.gen(function*() {
        const configured = roots[location]
        if (configured === undefined) return paths.map(() => Result.succeed<DeleteOutcome>("unconfigured"))
        const opened = yield* Effect.result(openRoot(configured))
        return yield* Effect.forEach(paths, (path) =>
          (Result.isFailure(opened)
            ? Effect.fail(opened.failure)
            : removeBelow(location, opened.success.root, opened.success.handle, path)).pipe(
              Effect.mapError((message) => new ObjectStorageError({ location, path, message })),
              Effect.result
            ))
      }))

    return ObjectStorage.of({
      hasStore: (location) => roots[location] !== undefined,
      delete: Effect.fn("ObjectStorage.delete")(function*(location: Location, path: string) {
        const [outcome] = yield* removeAll(location, [path])
        return yield* Result.match(outcome!, { onSuccess: Effect.succeed, onFailure: Effect.fail })
      }),
      // A local unlink is a few syscalls: nothing to batch, but the root is opened once per page.
      deleteMany: (location, paths) => removeAll(location, paths).pipe(Effect.withSpan("ObjectStorage.deleteMany"))
    })
  })
