/**
 * What a new user meets first, tried through the real CLI as they would try it: help texts that say
 * what is true, one-line errors that name the value given and what was expected, logs that do not
 * cry wolf.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { batches } from "../../src/programs/index.ts"
import { runCli } from "../support/cli.ts"

const cli = (args: ReadonlyArray<string>, env: Record<string, string> = {}) => Effect.promise(() => runCli(args, env))

describe("a new user's first commands", () => {
  it.live("`demo --help` counts the batches the registry has", () =>
    Effect.gen(function*() {
      const help = yield* cli(["demo", "--help"])
      assert.strictEqual(help.code, 0, help.stderr)
      assert.include(help.stdout, `watch its ${batches.length} batches repair`)
    }))

  it.live("prune-events describes itself in a sentence that parses", () =>
    Effect.gen(function*() {
      const help = yield* cli(["events", "prune", "--help"])
      assert.strictEqual(help.code, 0, help.stderr)
      assert.include(help.stdout, "keeping the events each batch's state is folded from")
    }))
})
