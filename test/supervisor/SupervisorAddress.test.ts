/** supervisor.json holds the local token: only its owner may read it, and no link may redirect it. */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { lstatSync, readdirSync, readFileSync, statSync, symlinkSync, writeFileSync } from "node:fs"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { addressFile, localToken, publishAddress } from "../../src/supervisor/SupervisorAddress.ts"

const tempDir = Effect.acquireRelease(
  Effect.promise(() => mkdtemp(join(tmpdir(), "sweeper-address-"))),
  (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true }))
)

const modeOf = (path: string) => statSync(path).mode & 0o777

describe("publishAddress", () => {
  it.effect("a new file is 0600 and carries the token", () =>
    Effect.gen(function*() {
      const dir = yield* tempDir
      yield* Effect.scoped(Effect.gen(function*() {
        yield* publishAddress(dir, "http://127.0.0.1:1")
        assert.strictEqual(modeOf(addressFile(dir)), 0o600)
        assert.include(readFileSync(addressFile(dir), "utf8"), localToken)
      }))
    }))

  it.effect("a file that already exists with 0644 ends 0600", () =>
    Effect.gen(function*() {
      const dir = yield* tempDir
      writeFileSync(addressFile(dir), "{}", { mode: 0o644 })
      yield* Effect.scoped(Effect.gen(function*() {
        yield* publishAddress(dir, "http://127.0.0.1:1")
        assert.strictEqual(modeOf(addressFile(dir)), 0o600)
        assert.include(readFileSync(addressFile(dir), "utf8"), localToken)
      }))
    }))

  it.effect("a symlink in its place is replaced, never written through; nothing is left behind", () =>
    Effect.gen(function*() {
      const dir = yield* tempDir
      const elsewhere = yield* tempDir
      const target = join(elsewhere, "victim")
      writeFileSync(target, "untouched", { mode: 0o644 })
      symlinkSync(target, addressFile(dir))
      yield* Effect.scoped(Effect.gen(function*() {
        yield* publishAddress(dir, "http://127.0.0.1:1")
        assert.strictEqual(readFileSync(target, "utf8"), "untouched")
        assert.isTrue(lstatSync(addressFile(dir)).isFile())
        assert.strictEqual(modeOf(addressFile(dir)), 0o600)
        assert.deepStrictEqual(readdirSync(dir), ["supervisor.json"])
      }))
      assert.deepStrictEqual(readdirSync(dir), [])
      assert.strictEqual(readFileSync(target, "utf8"), "untouched")
    }))
})
