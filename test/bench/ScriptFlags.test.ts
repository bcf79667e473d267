import { assert, describe, it } from "@effect/vitest"
import { readFileSync } from "node:fs"

const scripts = (JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")) as {
  readonly scripts: Readonly<Record<string, string>>
}).scripts

/** A script's environment and node flags: everything before the entry point. */
const prefix = (script: string) => script.slice(0, script.search(/bin\/sweeper\.mjs|src\/main\.ts/))

describe("npm scripts that run a supervisor", () => {
  // Without them the demo's V8 heap kept about 200 MB committed for 80 MB used (474–477 MB RSS in
  // its first minutes, 350 MB with them). The demo skips bin/sweeper.mjs's compile cache: the
  // cached code of everything the simulator runs held more than the TypeScript stripper (390 MB).
  it("the demo runs with the start script's memory settings", () => {
    assert.include(scripts.start!, "bin/sweeper.mjs start")
    assert.include(scripts.demo!, "src/main.ts demo")
    assert.strictEqual(prefix(scripts.demo!), prefix(scripts.start!))
  })
})
