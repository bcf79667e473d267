/**
 * The house rules the layout test enforces, as plain functions over file texts, so that each rule can
 * also be shown to fail on a small made-up tree (a checker that never fails proves nothing).
 */
import { readdirSync, readFileSync } from "node:fs"
import { dirname, join, normalize, relative } from "node:path"
import ts from "typescript"

/** Every `.ts` file under `dir`, relative to `root`, sorted. */
export const tsFiles = (root: string, dir: string): Array<string> => {
  const found: Array<string> = []
  const walk = (at: string) => {
    for (const entry of readdirSync(join(root, at), { withFileTypes: true })) {
      const path = join(at, entry.name)
      if (entry.isDirectory()) walk(path)
      else if (entry.name.endsWith(".ts")) found.push(path)
    }
  }
  walk(dir)
  return found.sort()
}

export const readAll = (root: string, files: ReadonlyArray<string>): Map<string, string> =>
  new Map(files.map((file) => [file, readFileSync(join(root, file), "utf8")]))

const sourceOf = (file: string, text: string) => ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true)

// ---------------------------------------------------------------------------------------------------
// Line width: what a reader has to scroll for is code and comments; a long string or URL is data.

const URL = /\bhttps?:\/\/\S+/g

/** Character ranges of string, template and regular-expression literals. */
const literalRanges = (source: ts.SourceFile): Array<readonly [number, number]> => {
  const ranges: Array<readonly [number, number]> = []
  const visit = (node: ts.Node) => {
    if (
      ts.isStringLiteral(node) || ts.isNoSubstitutionTemplateLiteral(node) || ts.isTemplateHead(node)
      || ts.isTemplateMiddle(node) || ts.isTemplateTail(node) || ts.isRegularExpressionLiteral(node)
    ) {
      ranges.push([node.getStart(source), node.getEnd()])
    }
    ts.forEachChild(node, visit)
  }
  visit(source)
  return ranges
}

/** Lines longer than `width` once string literals and URLs are taken out: `file:line (length)`. */
export const longLines = (files: ReadonlyMap<string, string>, width = 120): Array<string> => {
  const found: Array<string> = []
  for (const [file, text] of files) {
    const source = sourceOf(file, text)
    const ranges = literalRanges(source)
    const inLiteral = new Uint8Array(text.length)
    for (const [start, end] of ranges) inLiteral.fill(1, start, end)
    let offset = 0
    text.split("\n").forEach((line, index) => {
      if (line.length > width) {
        let outside = ""
        for (let i = 0; i < line.length; i++) if (inLiteral[offset + i] === 0) outside += line[i]
        const measured = outside.replace(URL, "").length
        if (measured > width) found.push(`${file}:${index + 1} (${line.length})`)
      }
      offset += line.length + 1
    })
  }
  return found
}

// ---------------------------------------------------------------------------------------------------
// Imports: the graph of relative imports between files of src/.

/** Every relative module a file names: imports, re-exports and dynamic imports, type-only included. */
export const importsOf = (file: string, text: string): Array<string> => {
  const source = sourceOf(file, text)
  const named: Array<string> = []
  const visit = (node: ts.Node) => {
    if (
      (ts.isImportDeclaration(node) || ts.isExportDeclaration(node)) && node.moduleSpecifier !== undefined
      && ts.isStringLiteral(node.moduleSpecifier)
    ) {
      named.push(node.moduleSpecifier.text)
    } else if (
      ts.isCallExpression(node) && node.expression.kind === ts.SyntaxKind.ImportKeyword
      && node.arguments[0] !== undefined && ts.isStringLiteral(node.arguments[0])
    ) {
      named.push(node.arguments[0].text)
    }
    ts.forEachChild(node, visit)
  }
  visit(source)
  return named.filter((name) => name.startsWith(".")).map((name) => normalize(join(dirname(file), name)))
}

export const importGraph = (files: ReadonlyMap<string, string>): Map<string, Array<string>> =>
  new Map([...files].map(([file, text]) => [file, importsOf(file, text).filter((to) => files.has(to))]))

/** The import cycles (strongly connected components of more than one file, or a file importing itself). */
export const cycles = (graph: ReadonlyMap<string, ReadonlyArray<string>>): Array<Array<string>> => {
  // Tarjan's algorithm, iterative so that a deep chain cannot overflow the stack.
  let counter = 0
  const index = new Map<string, number>()
  const low = new Map<string, number>()
  const onStack = new Set<string>()
  const stack: Array<string> = []
  const found: Array<Array<string>> = []
  for (const start of graph.keys()) {
    if (index.has(start)) continue
    const work: Array<[string, number]> = [[start, 0]]
    index.set(start, counter)
    low.set(start, counter++)
    stack.push(start)
    onStack.add(start)
    while (work.length > 0) {
      const frame = work[work.length - 1]!
      const [node, next] = frame
      const edges = graph.get(node) ?? []
      if (next < edges.length) {
        frame[1] = next + 1
        const to = edges[next]!
        if (!index.has(to)) {
          index.set(to, counter)
          low.set(to, counter++)
          stack.push(to)
          onStack.add(to)
          work.push([to, 0])
        } else if (onStack.has(to)) {
          low.set(node, Math.min(low.get(node)!, index.get(to)!))
        }
        continue
      }
      work.pop()
      if (work.length > 0) {
        const parent = work[work.length - 1]![0]
        low.set(parent, Math.min(low.get(parent)!, low.get(node)!))
      }
      if (low.get(node) === index.get(node)) {
        const component: Array<string> = []
        let member: string
        do {
          member = stack.pop()!
          onStack.delete(member)
          component.push(member)
        } while (member !== node)
        if (component.length > 1 || edges.includes(node)) found.push(component.sort())
      }
    }
  }
  return found
}

/**
 * The rooms of src/ by rank: a file may import its own room and rooms of a lower rank, never a higher
 * one. Rooms of one rank (repair and config; supervisor and simulator; http and doctor) may use each
 * other; the cycle check keeps that one-way.
 */
export const ROOM_RANK: Readonly<Record<string, number>> = {
  domain: 0,
  services: 1,
  repair: 2,
  config: 2,
  layers: 3,
  programs: 4,
  supervisor: 5,
  simulator: 5,
  views: 6,
  http: 7,
  doctor: 7,
  cli: 8,
  "(entry)": 9
}

/** The room of a file under src/: its first folder, or "(entry)" for a file at the top. */
export const roomOf = (file: string, srcDir = "src"): string => {
  const parts = relative(srcDir, file).split("/")
  return parts.length === 1 ? "(entry)" : parts[0]!
}

/** Imports that point from a room to one of a higher rank (or to a room that has no rank). */
export const upwardImports = (graph: ReadonlyMap<string, ReadonlyArray<string>>, srcDir = "src"): Array<string> => {
  const found: Array<string> = []
  for (const [from, edges] of graph) {
    const fromRoom = roomOf(from, srcDir)
    for (const to of edges) {
      const toRoom = roomOf(to, srcDir)
      const fromRank = ROOM_RANK[fromRoom]
      const toRank = ROOM_RANK[toRoom]
      if (fromRoom === toRoom) continue
      if (fromRank === undefined || toRank === undefined || toRank > fromRank) found.push(`${from} -> ${to}`)
    }
  }
  return found
}

// ---------------------------------------------------------------------------------------------------
// Programs stay short enough to read as the batch's flowchart.

/**
 * Code lines: lines that are neither blank nor comments, the rule of scripts/code-lines.py (a line
 * that ends a block comment counts if code follows it on the same line).
 */
export const codeLines = (text: string): number => {
  let count = 0
  let inBlock = false
  for (const line of text.split(/\r?\n/)) {
    let s = line.trim()
    if (inBlock) {
      if (!s.includes("*/")) continue
      inBlock = false
      s = s.split("*/").slice(1).join("*/").trim()
    }
    if (s.startsWith("/*")) {
      if (!s.includes("*/")) {
        inBlock = true
        continue
      }
      s = s.split("*/").slice(1).join("*/").trim()
    }
    if (s === "" || s.startsWith("//")) continue
    count++
  }
  return count
}

// ---------------------------------------------------------------------------------------------------
// Comments say the reason themselves: the documents they used to cite do not ship with the code.

const CITATION = /\b[Ii]ssues? #?\d+|\bSPEC\b|\bseeds?: |\.ja\.md\b/

/** Comments that cite an issue number, a section of the spec or a seed file: `file:line: text`. */
export const citingComments = (files: ReadonlyMap<string, string>): Array<string> => {
  const found: Array<string> = []
  for (const [file, text] of files) {
    const source = sourceOf(file, text)
    // Comments are trivia: read them around every token of the file.
    const seen = new Set<number>()
    const visit = (node: ts.Node) => {
      for (const ranges of [ts.getLeadingCommentRanges(text, node.pos), ts.getTrailingCommentRanges(text, node.end)]) {
        for (const range of ranges ?? []) {
          if (seen.has(range.pos)) continue
          seen.add(range.pos)
          const comment = text.slice(range.pos, range.end)
          const lines = comment.split("\n")
          lines.forEach((line, i) => {
            if (CITATION.test(line)) {
              const lineNo = source.getLineAndCharacterOfPosition(range.pos).line + 1 + i
              found.push(`${file}:${lineNo}: ${line.trim()}`)
            }
          })
        }
      }
      // Tokens too (getChildren, not forEachChild): a comment just before a closing brace leads no node.
      for (const child of node.getChildren(source)) visit(child)
    }
    visit(source)
    // The end-of-file token carries the comments after the last statement.
    for (const range of ts.getLeadingCommentRanges(text, source.endOfFileToken.pos) ?? []) {
      if (seen.has(range.pos)) continue
      const comment = text.slice(range.pos, range.end)
      if (CITATION.test(comment)) found.push(`${file}: ${comment.trim().split("\n")[0]}`)
    }
  }
  return found
}
