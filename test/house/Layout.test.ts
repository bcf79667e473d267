/**
 * The house's rules, checked on the tree itself: lines a reader can see whole, no import cycle, no
 * import pointing from a room to a higher one (domain ← services ← repair/config ← layers ← programs ←
 * supervisor/simulator ← views ← http/doctor ← cli), programs short enough to read as their batch's
 * flowchart, and comments that say the reason themselves. Each rule is also run on a small made-up tree to show it can fail.
 */
import { assert, describe, it } from "@effect/vitest"
import { readdirSync } from "node:fs"
import { join } from "node:path"
import {
  citingComments,
  codeLines,
  cycles,
  importGraph,
  longLines,
  readAll,
  roomOf,
  tsFiles,
  upwardImports
} from "./layout.ts"

const root = join(import.meta.dirname, "..", "..")
const src = readAll(root, tsFiles(root, "src"))
const tests = readAll(root, tsFiles(root, "test"))

/** The most formatted code lines a program may have. */
const PROGRAM_LIMIT = 90

/** Every batch program: the files of src/programs/ but the registry. */
const programs = readdirSync(join(root, "src", "programs"))
  .filter((name) => name.endsWith(".ts") && name !== "index.ts")
  .map((name) => join("src", "programs", name))

describe("the house's layout", () => {
  it("no line in src/ is over 120 characters outside string literals and URLs", () => {
    assert.deepStrictEqual(longLines(src), [])
  })

  it("no import cycle in src/", () => {
    assert.deepStrictEqual(cycles(importGraph(src)), [])
  })

  it("no import points up: domain ← services ← repair/config ← layers ← programs ← supervisor/simulator ← views ← http/doctor ← cli", () => {
    const graph = importGraph(src)
    assert.isAbove(graph.size, 100)
    assert.deepStrictEqual(upwardImports(graph), [])
  })

  it(`every program is at most ${PROGRAM_LIMIT} code lines`, () => {
    assert.isAbove(programs.length, 5)
    const over = programs
      .map((file) => ({ file, lines: codeLines(src.get(file)!) }))
      .filter(({ lines }) => lines > PROGRAM_LIMIT)
      .map(({ file, lines }) => `${file}: ${lines}`)
    assert.deepStrictEqual(over, [])
  })

  it("no comment in src/ or test/ cites an issue number, a SPEC section or a seed file", () => {
    assert.deepStrictEqual(citingComments(new Map([...src, ...tests])), [])
  })
})

describe("the checks fail on a tree that breaks them", () => {
  it("a long line of code is found; a long string or URL is not", () => {
    const code = `const x = ${"a + ".repeat(40)}1\n`
    const string = `const y = "${"s".repeat(200)}"\n`
    const url = `// see https://example.test/${"p".repeat(200)}\n`
    const found = longLines(new Map([["src/a.ts", code + string + url]]))
    assert.deepStrictEqual(found, ["src/a.ts:1 (171)"])
  })

  it("a cycle through three files is found, with a self-import", () => {
    const files = new Map([
      ["src/domain/a.ts", `import { b } from "./b.ts"`],
      ["src/domain/b.ts", `import type { c } from "./c.ts"`],
      ["src/domain/c.ts", `export * from "./a.ts"`],
      ["src/domain/d.ts", `const m = import("./d.ts")`],
      ["src/domain/e.ts", `import { a } from "./a.ts"`]
    ])
    assert.deepStrictEqual(cycles(importGraph(files)), [
      ["src/domain/a.ts", "src/domain/b.ts", "src/domain/c.ts"],
      ["src/domain/d.ts"]
    ])
  })

  it("an adapter importing a program, the domain importing a service or a read model the console, points up", () => {
    const files = new Map([
      ["src/layers/redis/R.ts", `import { P } from "../../programs/P.ts"`],
      ["src/domain/D.ts", `import { S } from "../services/S.ts"`],
      ["src/services/S.ts", `import { D } from "../domain/D.ts"`],
      ["src/programs/P.ts", `import { S } from "../services/S.ts"`],
      ["src/supervisor/App.ts", `import { P } from "../programs/P.ts"`],
      ["src/views/V.ts", `import { H } from "../http/H.ts"`],
      ["src/http/H.ts", `import { V } from "../views/V.ts"`]
    ])
    assert.deepStrictEqual(upwardImports(importGraph(files)), [
      "src/layers/redis/R.ts -> src/programs/P.ts",
      "src/domain/D.ts -> src/services/S.ts",
      "src/views/V.ts -> src/http/H.ts"
    ])
    assert.strictEqual(roomOf("src/main.ts"), "(entry)")
  })

  it("code lines count neither blank lines nor comments, as scripts/code-lines.py counts them", () => {
    const text = ["/**", " * doc", " */", "const a = 1", "", "// note", "/* one */ const b = 2", "/* x */"].join("\n")
    assert.strictEqual(codeLines(text), 2)
  })

  it("a comment citing an issue, a SPEC section or a seed file is found; the same words in code are not", () => {
    const text = [
      "/** The lease (SPEC §0.2). */",
      "export const a = 1 // issue 18",
      "const b = \"issue 7\"",
      "/*",
      " * seed: stuck-export-jobs.ja.md",
      " */",
      "export const c = 2",
      "const d = () => {",
      "  run()",
      "  // before a closing brace (SPEC §8.1)",
      "}"
    ].join("\n")
    assert.deepStrictEqual(citingComments(new Map([["src/x.ts", text]])), [
      "src/x.ts:1: /** The lease (SPEC §0.2). */",
      "src/x.ts:2: // issue 18",
      "src/x.ts:5: * seed: stuck-export-jobs.ja.md",
      "src/x.ts:10: // before a closing brace (SPEC §8.1)"
    ])
  })
})
