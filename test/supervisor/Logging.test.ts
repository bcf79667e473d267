/** One log schema: message always a string, service and node, annotations flat, no empty objects; every warning logged. */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Logger } from "effect"
import { chooseLogFormat, jsonLogger, textLine, textLogger } from "../../src/supervisor/Logging.ts"

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
        yield* Effect.logWarning("Run failed").pipe(
          Effect.annotateLogs({ batch: "drop-canceling-builds", run_id: "r1", outcome: "failed" })
        )
      }))
      assert.deepInclude(lines[0], {
        level: "INFO",
        message: "Backends",
        service: "sweeper",
        node: "node-a",
        postgres: "db:5432",
        redis: "in-memory"
      })
      assert.deepInclude(lines[1], { message: "Applied migrations", details: ["1_a", "2_b"] })
      assert.deepInclude(lines[2], {
        level: "WARN",
        message: "Run failed",
        batch: "drop-canceling-builds",
        run_id: "r1",
        outcome: "failed"
      })
      for (const line of lines) {
        assert.isString(line.message)
        assert.notProperty(line, "annotations")
        assert.notProperty(line, "spans")
        assert.notProperty(line, "fiberId")
      }
    }))

  it.effect("every warning of a run is logged: each hold, each dead-list move, each doomed build", () =>
    Effect.gen(function*() {
      const warn = (runId: string, message: string, fields: Record<string, unknown> = {}) =>
        Effect.logWarning(message, fields).pipe(Effect.annotateLogs({ run_id: runId }))
      const lines = yield* capture(Effect.gen(function*() {
        // Two holds of one run on the same signal at the same reading are two incidents.
        yield* warn("r1", "Repair held", { signal: "replicationLag", value: "9 MB" })
        yield* warn("r1", "Repair held", { signal: "replicationLag", value: "9 MB" })
        yield* warn("r1", "Moved unparsable deferred jobs to the dead list", { worker: "A" })
        yield* warn("r1", "Moved unparsable deferred jobs to the dead list", { worker: "B" })
        yield* warn("r1", "Dooming build that could not be dropped", { build_id: 1 })
        yield* warn("r1", "Dooming build that could not be dropped", { build_id: 2 })
        yield* warn("r2", "Repair held", { signal: "replicationLag", value: "9 MB" })
      }))
      assert.deepStrictEqual(lines.map((l) => [l.run_id, l.message]), [
        ["r1", "Repair held"],
        ["r1", "Repair held"],
        ["r1", "Moved unparsable deferred jobs to the dead list"],
        ["r1", "Moved unparsable deferred jobs to the dead list"],
        ["r1", "Dooming build that could not be dropped"],
        ["r1", "Dooming build that could not be dropped"],
        ["r2", "Repair held"]
      ])
    }))
})

describe("text logs (a terminal)", () => {
  const lines = (effect: Effect.Effect<void>) =>
    Effect.gen(function*() {
      const out: Array<string> = []
      yield* effect.pipe(Effect.provide(Logger.layer([textLogger("node-a", (line) => out.push(line))])))
      return out
    })

  it.effect("one line each: time, level, batch, message, key fields; no JSON wall", () =>
    Effect.gen(function*() {
      const out = yield* lines(Effect.gen(function*() {
        yield* Effect.logInfo("Run succeeded").pipe(Effect.annotateLogs({
          batch: "drop-canceling-builds",
          run_id: "4b36a462-c4ad-4639-832a-3fe3a22ed107",
          outcome: "succeeded",
          summary: { dropped: 3 }
        }))
        yield* Effect.logWarning("Backends", { postgres: "embedded (PGlite)" })
      }))
      assert.lengthOf(out, 2)
      assert.match(
        out[0]!,
        /^\d\d:\d\d:\d\d\.\d{3}  INFO   drop-canceling-builds  Run succeeded  run=4b36a462 outcome=succeeded summary=\{"dropped":3\}$/
      )
      assert.match(out[1]!, /^\d\d:\d\d:\d\d\.\d{3}  WARN   -  Backends  postgres="embedded \(PGlite\)"$/)
      for (const line of out) assert.notInclude(line, "\n")
    }))

  it("JSON when piped or asked for, text on a terminal unless told otherwise", () => {
    assert.strictEqual(chooseLogFormat(undefined, true), "text")
    assert.strictEqual(chooseLogFormat(undefined, false), "json")
    assert.strictEqual(chooseLogFormat("json", true), "json")
    assert.strictEqual(chooseLogFormat("text", false), "text")
  })

  it("a cause goes on the lines after, indented", () => {
    const text = textLine({
      timestamp: "2026-11-24T14:50:00.026Z",
      level: "ERROR",
      message: "Run failed",
      cause: "SqlError: down\n  at x"
    })
    assert.strictEqual(text, "14:50:00.026  ERROR  -  Run failed\n  SqlError: down\n    at x")
  })
})
