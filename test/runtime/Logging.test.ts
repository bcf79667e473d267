/** One log schema: message always a string, service and node, annotations flat, no empty objects; a warning once per run. */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Logger } from "effect"
import { jsonLogger } from "../../src/runtime/Logging.ts"

const capture = <A, E>(effect: Effect.Effect<A, E>) =>
  Effect.gen(function*() {
    const lines: Array<Record<string, unknown>> = []
    yield* effect.pipe(Effect.provide(Logger.layer([jsonLogger("node-a", (line) => lines.push(JSON.parse(line)))])))
    return lines
  })

describe("JSON logs", () => {
  it.effect("flat fields, string message, service and node, nothing empty", () =>
    Effect.gen(function*() {
      const lines = yield* capture(Effect.gen(function*() {
        yield* Effect.logInfo("Backends", { postgres: "db:5432", redis: "in-memory" })
        yield* Effect.logInfo("Applied migrations", ["1_a", "2_b"])
        yield* Effect.logWarning("Run failed").pipe(Effect.annotateLogs({ batch: "drop-canceling-builds", run_id: "r1", outcome: "failed" }))
      }))
      assert.deepInclude(lines[0], { level: "INFO", message: "Backends", service: "sweeper", node: "node-a", postgres: "db:5432", redis: "in-memory" })
      assert.deepInclude(lines[1], { message: "Applied migrations", details: ["1_a", "2_b"] })
      assert.deepInclude(lines[2], { level: "WARN", message: "Run failed", batch: "drop-canceling-builds", run_id: "r1", outcome: "failed" })
      for (const line of lines) {
        assert.isString(line.message)
        assert.notProperty(line, "annotations")
        assert.notProperty(line, "spans")
        assert.notProperty(line, "fiberId")
      }
    }))

  it.effect("the same warning at most once per run; other runs and other warnings still log", () =>
    Effect.gen(function*() {
      const warn = (runId: string, message: string) => Effect.logWarning(message).pipe(Effect.annotateLogs({ run_id: runId }))
      const lines = yield* capture(Effect.gen(function*() {
        for (let i = 0; i < 5; i++) yield* warn("r1", "Exclusive lease lost")
        yield* warn("r1", "Tick lease unavailable")
        yield* warn("r2", "Exclusive lease lost")
        yield* Effect.logWarning("no run")
        yield* Effect.logWarning("no run")
      }))
      assert.deepStrictEqual(lines.map((l) => [l.run_id ?? null, l.message]), [
        ["r1", "Exclusive lease lost"],
        ["r1", "Tick lease unavailable"],
        ["r2", "Exclusive lease lost"],
        [null, "no run"],
        [null, "no run"]
      ])
    }))
})
