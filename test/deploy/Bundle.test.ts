/**
 * What the idle supervisor loads. V8 keeps the source text of every module a process loads, so the
 * idle figure follows what `sweeper start` imports: `start` is routed before the command line's
 * modules (effect/cli's parser, help renderer — whose Intl.Segmenter pages in ICU data — and
 * prompts), node:http is never imported as an ES module (its namespace loads undici), and
 * bin/sweeper.mjs runs the bundled build of src/ (bin/bundle.mjs), in which those stay in chunks of
 * their own. test/supervisor/Start.integration.test.ts runs `npm start` itself, through the bundle.
 */
import { assert, describe, it } from "@effect/vitest"
import { execFileSync, spawnSync } from "node:child_process"
import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join, normalize } from "node:path"
import { fileURLToPath } from "node:url"
import ts from "typescript"

const root = fileURLToPath(new URL("../..", import.meta.url))

/** What a module imports at load: static imports and re-exports that carry values, not `import type`. */
const staticImports = (file: string, text: string): Array<string> => {
  const source = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true)
  const found: Array<string> = []
  for (const statement of source.statements) {
    if (ts.isImportDeclaration(statement) && !statement.importClause?.isTypeOnly) {
      found.push((statement.moduleSpecifier as ts.StringLiteral).text)
    } else if (
      ts.isExportDeclaration(statement) && statement.moduleSpecifier !== undefined && !statement.isTypeOnly
    ) {
      found.push((statement.moduleSpecifier as ts.StringLiteral).text)
    }
  }
  return found
}

/** Every file of src/ the entry loads before it runs, with the packages each of them imports. */
const loadedFrom = (entry: string) => {
  const files = new Map<string, Array<string>>()
  const visit = (file: string) => {
    if (files.has(file)) return
    const imports = staticImports(file, readFileSync(join(root, file), "utf8"))
    files.set(file, imports)
    for (const name of imports) if (name.startsWith(".")) visit(normalize(join(dirname(file), name)))
  }
  visit(entry)
  return files
}

describe("what `sweeper start` loads", () => {
  it("from source: none of effect/cli, and node:http only through require", () => {
    const loaded = loadedFrom("src/main.ts")
    const offending = [...loaded].flatMap(([file, imports]) =>
      imports.filter((name) => name.startsWith("effect/cli") || name === "node:http").map((name) => `${file}: ${name}`)
    )
    assert.deepStrictEqual(offending, [])
    assert.isTrue(loaded.has("src/cli/Start.ts"), "start is routed by main.ts itself")
    assert.isFalse(loaded.has("src/cli/Cli.ts"), "the command line is imported on demand")
    assert.deepStrictEqual([...loaded.keys()].filter((file) => file.startsWith("src/simulator/")), [])
  })

  it("bundled: the entry chunk and what it imports hold no command-line code; the build runs", () => {
    const dir = join(mkdtempSync(join(tmpdir(), "sweeper-bundle-test-")), "build")
    try {
      execFileSync(process.execPath, ["bin/bundle.mjs", dir], { cwd: root, stdio: "pipe" })
      const chunks = new Map<string, string>()
      const visit = (name: string) => {
        if (chunks.has(name)) return
        const text = readFileSync(join(dir, name), "utf8")
        chunks.set(name, text)
        // Minified static imports: `import{a as b}from"./chunk-hash.mjs"` or `import"./chunk-hash.mjs"`.
        for (const [, chunk] of text.matchAll(/import(?:[^"'`();]*?from)?\s*["'`]\.\/([^"'`]+\.mjs)["'`]/g)) {
          visit(chunk!)
        }
      }
      visit("main.mjs")
      const dynamic = [...readFileSync(join(dir, "main.mjs"), "utf8").matchAll(/import\(\s*["'`]\.\/([^"'`]+)["'`]\)/g)]
        .map(([, chunk]) => chunk!)
      assert.isTrue(
        dynamic.some((chunk) => chunk.startsWith("Cli-")),
        `the command line is a chunk of its own: ${dynamic}`
      )
      for (const [name, text] of chunks) {
        assert.notInclude(text, "Intl.Segmenter", `${name} is loaded by start`)
        assert.notMatch(text, /from\s*["']node:http["']/, `${name} imports node:http as an ES module`)
      }
      const version = spawnSync(process.execPath, [join(dir, "main.mjs"), "--version"], { encoding: "utf8" })
      assert.strictEqual(version.stdout.trim(), "sweeper v0.1.0", version.stderr)
      const unknown = spawnSync(process.execPath, [join(dir, "main.mjs"), "no-such-command"], { encoding: "utf8" })
      assert.strictEqual(unknown.status, 2)
      assert.include(unknown.stderr, "Unknown subcommand")
    } finally {
      rmSync(dirname(dir), { recursive: true, force: true })
    }
  }, 120_000)

  it("bin/sweeper.mjs runs the bundle, or src/main.ts when told to run from source", () => {
    const entry = (env: Record<string, string>) =>
      execFileSync(
        process.execPath,
        ["--input-type=module", "-e", "console.log(String((await import('./bin/bundle.mjs')).bundledEntry()))"],
        { cwd: root, env: { ...process.env, ...env }, encoding: "utf8" }
      ).trim()
    assert.match(entry({ SWEEPER_FROM_SOURCE: "" }), /sweeper\/[0-9a-f]{16}\/main\.mjs$/)
    assert.strictEqual(entry({ SWEEPER_FROM_SOURCE: "1" }), "undefined")
  }, 120_000)
})
