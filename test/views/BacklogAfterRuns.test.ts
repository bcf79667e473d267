/**
 * A finished run re-samples its own batch's backlog only: concurrency-limit-resume ends a run every
 * minute, and each used to re-read every batch's stores (a whole-keyspace SCAN among them).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Ref } from "effect"
import { TestClock } from "effect/testing"
import { BacklogAfterRuns } from "../../src/http/Console.ts"
import { Backlog, type BacklogSnapshot } from "../../src/services/Backlog.ts"
import { type BatchSnapshot, Scheduler } from "../../src/supervisor/Scheduler.ts"

const snapshot = (name: string, runId: string | null) =>
  ({ name, history: { lastRun: runId === null ? undefined : { runId } } }) as unknown as BatchSnapshot

describe("backlog after runs", () => {
  it.effect("a run of one batch refreshes that batch's backlog, not every batch's", () =>
    Effect.gen(function*() {
      const runs = yield* Ref.make<Record<string, string | null>>({ a: null, b: "b-1", c: null })
      const asked: Array<ReadonlyArray<string> | "all"> = []
      const empty: BacklogSnapshot = { sampledAt: null, batches: [] }
      const scheduler = Layer.succeed(
        Scheduler,
        {
          snapshots: Effect.map(Ref.get(runs), (r) => Object.entries(r).map(([name, id]) => snapshot(name, id)))
        } as unknown as Scheduler["Service"]
      )
      const backlog = Layer.succeed(
        Backlog,
        Backlog.of({
          current: Effect.succeed(empty),
          refresh: Effect.sync(() => (asked.push("all"), empty)),
          refreshOnly: (batches) => Effect.sync(() => (asked.push(batches), empty))
        })
      )
      yield* Effect.gen(function*() {
        yield* TestClock.adjust("1 second")
        assert.deepStrictEqual(asked, [], "nothing changed yet")
        yield* Ref.update(runs, (r) => ({ ...r, a: "a-1" }))
        yield* TestClock.adjust("1 second")
        yield* Ref.update(runs, (r) => ({ ...r, b: "b-2", c: "c-1" }))
        yield* TestClock.adjust("1 second")
        yield* TestClock.adjust("1 second")
        assert.deepStrictEqual(asked, [["a"], ["b", "c"]])
      }).pipe(Effect.provide(BacklogAfterRuns.pipe(Layer.provide(Layer.merge(scheduler, backlog)))))
    }))
})
