/**
 * README stays a few screens long and hands over to docs/; every relative link in README and in the
 * docs/ pages reaches a file that exists and, when it names a section, a heading of that file.
 */
import { assert, describe, it } from "@effect/vitest"
import { existsSync, readdirSync, readFileSync } from "node:fs"
import { dirname, join, normalize } from "node:path"

const root = join(import.meta.dirname, "..", "..")

/** GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens. */
export const anchorOf = (heading: string) =>
  heading.replace(/^#+ /, "").trim().toLowerCase().replace(/[^\p{L}\p{N}\s_-]/gu, "").replace(/\s/g, "-")

const headingsOf = (text: string) =>
  text.replace(/^```[\s\S]*?^```/gm, "").split("\n").filter((line) => /^#{1,6} /.test(line)).map(anchorOf)

/** Links that lead nowhere: `page: target` for a missing file or a missing section. */
export const brokenLinks = (pages: ReadonlyMap<string, string>, exists: (path: string) => boolean) => {
  const broken: Array<string> = []
  for (const [page, text] of pages) {
    const prose = text.replace(/^```[\s\S]*?^```/gm, "")
    for (const [, target] of prose.matchAll(/\]\(([^)\s]+)\)/g)) {
      if (/^[a-z]+:/.test(target!)) continue
      const [path, anchor] = target!.split("#") as [string, string | undefined]
      const file = path === "" ? page : normalize(join(dirname(page), path))
      if (!exists(file)) {
        broken.push(`${page}: ${target}`)
        continue
      }
      if (anchor === undefined) continue
      const linked = pages.get(file) ?? (file.endsWith(".md") ? readFileSync(join(root, file), "utf8") : undefined)
      if (linked === undefined || !headingsOf(linked).includes(anchor)) broken.push(`${page}: ${target}`)
    }
  }
  return broken
}

const pages = new Map(
  ["README.md", ...readdirSync(join(root, "docs")).filter((name) => name.endsWith(".md")).map((name) => `docs/${name}`)]
    .map((page) => [page, readFileSync(join(root, page), "utf8")])
)

describe("README and docs/", () => {
  it("README is at most 250 lines and links every docs/ page", () => {
    const readme = pages.get("README.md")!
    assert.isAtMost(readme.trimEnd().split("\n").length, 250)
    for (const page of pages.keys()) if (page !== "README.md") assert.include(readme, `(${page}`, page)
  })

  it("README's first screen says what Sweeper is and the three commands a newcomer needs", () => {
    const firstScreen = pages.get("README.md")!.split("\n").slice(0, 30).join("\n")
    assert.include(firstScreen, "Sweeper keeps a GitLab-style platform healthy")
    for (const command of ["npm ci && npm run demo", "npm test", "npm start"]) assert.include(firstScreen, command)
  })

  it("every relative link in README and docs/ reaches a file and, when it names one, a section", () => {
    assert.isAbove(pages.size, 5)
    assert.deepStrictEqual(brokenLinks(pages, (path) => existsSync(join(root, path))), [])
  })

  it("a link to a missing page or a missing section is found", () => {
    const fake = new Map([
      [
        "README.md",
        "[a](docs/a.md#there) [b](docs/a.md#gone) [c](docs/missing.md) [d](#top) [e](https://x.test/y)\n# Top"
      ],
      ["docs/a.md", "# A\n## There\n[back](../README.md#nowhere)"]
    ])
    assert.deepStrictEqual(brokenLinks(fake, (path) => fake.has(path)), [
      "README.md: docs/a.md#gone",
      "README.md: docs/missing.md",
      "docs/a.md: ../README.md#nowhere"
    ])
  })
})
