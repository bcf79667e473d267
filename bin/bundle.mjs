// The bundled build `bin/sweeper.mjs` runs: src/ and the packages it imports as a few minified
// JavaScript files, built from the sources by rolldown (the bundler vitest's vite brings) the first
// time a process starts after they changed, and kept under a key of the sources' sizes and
// modification times.
//
// Why: V8 keeps the source text of every module a process loads, for lazy compilation. Run from
// src/, the idle supervisor held ≈ 600 files, 7.6 MB of JavaScript, most of it effect's comments and
// modules it never calls; bundled, the part it loads is under 2 MB. Code splitting keeps what only
// some commands use (the command line's parser and help, PGlite, the object storage SDKs, the HTTP
// client) out of `start`: each is a chunk loaded on the dynamic import() that needs it.
//
// Nothing else changes: the same modules run, in the same order. Without rolldown (an install
// without devDependencies), or with SWEEPER_FROM_SOURCE=1, bin/sweeper.mjs runs src/main.ts as
// before (`npm run build` before `npm prune --omit=dev` keeps the bundle in such an install).
// `node bin/bundle.mjs <dir>` builds into <dir> (what bundledEntry runs, in a child process,
// so the bundler never sits in the supervisor's memory).
import { spawnSync } from "node:child_process"
import { createHash } from "node:crypto"
import { copyFileSync, existsSync, mkdirSync, readdirSync, renameSync, rmSync, statSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"

const root = fileURLToPath(new URL("../", import.meta.url))

/**
 * Loaded where an import() asks for them, from node_modules, never copied into the bundle: large,
 * optional (PGlite only on the embedded database, the SDKs only for their object storage), and
 * PGlite finds its WebAssembly and data files beside its own module.
 */
const EXTERNAL = [/^@electric-sql\//, /^@aws-sdk\//, /^@azure\//]

/** Files read at run time next to the module that reads them (src/http/console/assets.ts). */
const ASSETS = ["src/http/console/dashboard.js", "src/http/console/dashboard.css"]

/** Every file the bundle is built from, with its size and modification time: the bundle's key. */
const sourceKey = () => {
  const hash = createHash("sha256")
  const walk = (dir) => {
    for (const entry of readdirSync(dir, { withFileTypes: true }).sort((a, b) => a.name < b.name ? -1 : 1)) {
      const path = join(dir, entry.name)
      if (entry.isDirectory()) walk(path)
      else {
        const { size, mtimeMs } = statSync(path)
        hash.update(`${path}\0${size}\0${mtimeMs}\n`)
      }
    }
  }
  walk(join(root, "src"))
  for (const file of ["package-lock.json", "bin/bundle.mjs"]) {
    const { size, mtimeMs } = statSync(join(root, file))
    hash.update(`${file}\0${size}\0${mtimeMs}\n`)
  }
  return hash.digest("hex").slice(0, 16)
}

/** node_modules/.cache in a checkout; the OS temp directory where the tree is read-only (systemd). */
const cacheDirectories = () => [join(root, "node_modules", ".cache", "sweeper"), join(tmpdir(), "sweeper-bundle")]

const writable = (dir) => {
  try {
    mkdirSync(dir, { recursive: true })
    return true
  } catch {
    return false
  }
}

/**
 * The bundle's entry for the sources as they are now, built first if need be; undefined when it
 * cannot be built (no rolldown, or SWEEPER_FROM_SOURCE=1): the caller then runs src/main.ts.
 */
export const bundledEntry = () => {
  if (process.env.SWEEPER_FROM_SOURCE === "1") return undefined
  let key
  try {
    key = sourceKey()
  } catch {
    return undefined // no src/ beside bin/ (an unusual install): run what there is
  }
  for (const dir of cacheDirectories()) {
    const entry = join(dir, key, "main.mjs")
    if (existsSync(entry)) return entry
  }
  const dir = cacheDirectories().find(writable)
  if (dir === undefined) return undefined
  const built = spawnSync(process.execPath, [fileURLToPath(import.meta.url), join(dir, key)], {
    stdio: ["ignore", "ignore", "pipe"],
    encoding: "utf8"
  })
  const entry = join(dir, key, "main.mjs")
  if (built.status === 0 && existsSync(entry)) return entry
  // A bundler that is missing is expected (an install without devDependencies); anything else is said.
  if (built.status !== 3) {
    process.stderr.write(`sweeper: running from source (bundling failed: ${built.stderr.trim()})\n`)
  }
  return undefined
}

/** Builds into `target` through a directory of its own, so a concurrent start sees all or nothing. */
export const build = async (target) => {
  let rolldown
  try {
    rolldown = await import("rolldown")
  } catch {
    process.exit(3)
  }
  const staging = `${target}.${process.pid}.tmp`
  rmSync(staging, { recursive: true, force: true })
  const bundle = await rolldown.rolldown({
    input: { main: join(root, "src/main.ts") },
    platform: "node",
    logLevel: "silent",
    external: (id) => id.startsWith("node:"),
    plugins: [{
      name: "sweeper-externals",
      resolveId(source) {
        if (!EXTERNAL.some((pattern) => pattern.test(source))) return null
        // By absolute path: the bundle may live outside the tree (the OS temp directory).
        return {
          id: fileURLToPath(import.meta.resolve(source, pathToFileURL(join(root, "src/main.ts")))),
          external: true
        }
      }
    }]
  })
  await bundle.write({
    dir: staging,
    format: "esm",
    entryFileNames: "[name].mjs",
    chunkFileNames: "[name]-[hash].mjs",
    minify: { compress: { keepNames: { function: true, class: true } }, mangle: { keepNames: true } }
  })
  await bundle.close()
  for (const asset of ASSETS) copyFileSync(join(root, asset), join(staging, asset.slice(asset.lastIndexOf("/") + 1)))
  mkdirSync(dirname(target), { recursive: true })
  try {
    renameSync(staging, target)
  } catch {
    rmSync(staging, { recursive: true, force: true }) // another start got there first: same sources
  }
  // Earlier builds, a day after they were made: a supervisor started from one may still import a chunk.
  for (const old of readdirSync(dirname(target))) {
    const path = join(dirname(target), old)
    if (path !== target && statSync(path).mtimeMs < Date.now() - 86_400_000) {
      rmSync(path, { recursive: true, force: true })
    }
  }
}

/** `npm run build` (no argument): the build a start would make, made ahead (a deploy without devDependencies). */
const buildForStart = async () => {
  const dir = cacheDirectories().find(writable)
  if (dir === undefined) throw new Error(`none of ${cacheDirectories().join(", ")} is writable`)
  await build(join(dir, sourceKey()))
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  await (process.argv[2] === undefined ? buildForStart() : build(process.argv[2]))
}
