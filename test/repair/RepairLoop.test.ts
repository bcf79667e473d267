import { assert, describe, it } from "@effect/vitest"
import { Clock, Duration, Effect, Exit, Fiber, Logger, Option, References, Stream } from "effect"
import { TestClock } from "effect/testing"
import { CurrentRun, type RunInfo } from "../../src/domain/Batch.ts"
import { WrongTypeKey } from "../../src/domain/Errors.ts"
import {
  each,
  growingSteps,
  isolatedEach,
  isolatedEachWith,
  keysetPages,
  passes,
  repeatUntilDone
} from "../../src/repair/RepairLoop.ts"
import { type GateVerdict, HealthGate, openGate } from "../../src/services/HealthGate.ts"

const bare: RunInfo = { runId: null, batch: null, dryRun: false, budget: Option.none(), fence: Option.none() }
const withRun = (info: Partial<RunInfo>) => Effect.provideService(CurrentRun, { ...bare, ...info })

/** A gate that answers from a list (then proceeds), recording each call in `log`. */
const scriptedGate = (log: Array<string>, verdicts: ReadonlyArray<GateVerdict>) => {
  let calls = 0
  return Effect.provideService(HealthGate, {
    ...openGate,
    beforeUnit: ({ batch, deadlineMillis }) =>
      Effect.sync(() => {
        log.push(`gate ${batch} ${deadlineMillis}`)
        return verdicts[calls++] ?? { proceed: true, heldMs: 0, heldBy: [] }
      })
  })
}

/** Three pages of 5000 (page 0 then 1, 2): each read logged, as a scan's round trip would be. */
const threePagesLogged = (log: Array<string>) =>
  Stream.paginate(0, (n: number) =>
    Effect.sync(() => {
      log.push(`read ${n}`)
      return [Array.from({ length: 5000 }, (_, i) => n * 5000 + i), n < 2 ? Option.some(n + 1) : Option.none()]
    }))

describe("repair loop", () => {
  it.effect("isolatedEach: a failure the caller isolates is reported with its key, the others' results kept", () =>
    Effect.gen(function*() {
      const logged: Array<string> = []
      const result = yield* isolatedEachWith(
        ["a", "bad", "c"],
        (key) => key === "bad" ? Effect.fail({ _tag: "Permanent" as const, key }) : Effect.succeed(key.toUpperCase()),
        {
          concurrency: 2,
          isolate: (key, error) => error._tag === "Permanent" ? Option.some({ key }) : Option.none(),
          logIsolated: ({ key }) => Effect.sync(() => void logged.push(`isolated ${key}`)),
          logFailure: (key) => Effect.sync(() => void logged.push(`failed ${key}`))
        }
      )
      assert.deepStrictEqual(result, { results: ["A", "C"], isolated: [{ key: "bad" }] })
      assert.deepStrictEqual(logged, ["isolated bad"])
    }))

  it.effect("isolatedEach by default isolates a WrongTypeKey (permanent, one key's) and logs it once with its key; any other failure fails the whole", () =>
    Effect.gen(function*() {
      const logs: Array<{ level: string; message: string; annotations: unknown }> = []
      const collector = Logger.make((options) => {
        logs.push({
          level: options.logLevel,
          message: String(options.message),
          annotations: options.fiber.getRef(References.CurrentLogAnnotations)
        })
      })
      const wrong = new WrongTypeKey({ key: "k:bad", operation: "LLEN", message: "WRONGTYPE" })
      const result = yield* isolatedEach(
        ["a", "bad"],
        (key) => key === "bad" ? Effect.fail(wrong) : Effect.succeed(key),
        { concurrency: 2, label: "Spec", noun: "worker" }
      )
        .pipe(Effect.provide(Logger.layer([collector])))
      assert.deepStrictEqual(result, { results: ["a"], isolated: [{ of: "bad", key: "k:bad", error: "WRONGTYPE" }] })
      assert.deepStrictEqual(logs.map((log) => [log.level, log.message]), [[
        "Error",
        "Spec skipped worker bad: key k:bad holds the wrong type (WRONGTYPE)"
      ]])
      assert.deepStrictEqual(logs[0]!.annotations, { worker: "bad", key: "k:bad" })
      const exit = yield* Effect.exit(
        isolatedEach(["boom"], () => Effect.fail("transient"), { concurrency: 1, label: "Spec", noun: "worker" }).pipe(
          Effect.provide(Logger.layer([collector]))
        )
      )
      assert.isTrue(Exit.isFailure(exit))
      assert.deepStrictEqual(logs.slice(1).map((log) => [log.message, log.annotations]), [["Spec failed for a worker", {
        worker: "boom"
      }]])
    }))

  it.effect("isolatedEach: any other failure neither stops nor hides the other keys, and fails the whole once all finished", () =>
    Effect.gen(function*() {
      const ran: Array<string> = []
      const logged: Array<string> = []
      const exit = yield* Effect.exit(
        isolatedEachWith(
          ["boom", "b", "c"],
          (key) => key === "boom" ? Effect.fail("transient") : Effect.sync(() => void ran.push(key)),
          {
            concurrency: 1,
            isolate: () => Option.none(),
            logIsolated: () => Effect.void,
            logFailure: (key) => Effect.sync(() => void logged.push(`failed ${key}`))
          }
        )
      )
      assert.isTrue(Exit.isFailure(exit))
      assert.deepStrictEqual(ran, ["b", "c"])
      assert.deepStrictEqual(logged, ["failed boom"])
    }))

  it.effect("budget: stops after the unit that spends it (overshoot at most one unit)", () =>
    Effect.gen(function*() {
      const result = yield* repeatUntilDone({
        batch: "b",
        budget: Duration.seconds(25),
        initial: { done: 0 },
        dry: Effect.succeed({ done: 0 }),
        // Each unit takes 10 s: after the third (30 s ≥ 25 s) the budget is spent.
        write: (commit) => Effect.andThen(TestClock.adjust("10 seconds"), Effect.as(commit({ done: 1 }), true))
      })
      assert.strictEqual(result.units, 3)
      assert.deepStrictEqual(result.totals, { done: 3 })
      assert.strictEqual(result.stop, "budget")
    }))

  it.effect("budget: the run's budget (CurrentRun) wins over the batch's default", () =>
    Effect.gen(function*() {
      const result = yield* repeatUntilDone({
        batch: "b",
        budget: Duration.minutes(10),
        initial: { done: 0 },
        dry: Effect.succeed({ done: 0 }),
        write: (commit) => Effect.andThen(TestClock.adjust("10 seconds"), Effect.as(commit({ done: 1 }), true))
      }).pipe(withRun({ budget: Option.some(Duration.zero) }))
      assert.strictEqual(result.units, 1)
      assert.strictEqual(result.stop, "budget")
    }))

  it.effect("growing steps: 1, 8, 64, 512, 4096, then whole pages (5000)", () =>
    Effect.gen(function*() {
      const sizes: Array<number> = []
      const result = yield* growingSteps({
        batch: "b",
        budget: Duration.minutes(4),
        initial: { seen: 0 },
        source: Stream.fromIterable(Array.from({ length: 10_000 }, (_, i) => i)).pipe(Stream.rechunk(5000)),
        growth: { first: 1, factor: 8, max: 5000 },
        unit: {
          plan: Effect.succeed,
          target: String,
          dry: () => ({ seen: 0 }),
          fence: false,
          write: (slice, commit) =>
            Effect.andThen(Effect.sync(() => sizes.push(slice.length)), commit({ seen: slice.length }))
        }
      })
      // The first page of 5000: 1 + 8 + 64 + 512 + 4096 = 4681, then its last 319; then a whole page.
      assert.deepStrictEqual(sizes, [1, 8, 64, 512, 4096, 319, 5000])
      assert.deepStrictEqual(result.totals, { seen: 10_000 })
      assert.strictEqual(result.stop, "done")
    }))

  it.effect("growing steps: capped by what the time per item so far says still fits the budget", () =>
    Effect.gen(function*() {
      const sizes: Array<number> = []
      const result = yield* growingSteps({
        batch: "b",
        budget: Duration.millis(100),
        initial: { seen: 0 },
        source: Stream.fromIterable(Array.from({ length: 5000 }, (_, i) => i)).pipe(Stream.rechunk(5000)),
        growth: { first: 1, factor: 8, max: 5000 },
        unit: {
          plan: Effect.succeed,
          target: String,
          dry: () => ({ seen: 0 }),
          fence: false,
          // 1 ms per item.
          write: (slice, commit) =>
            Effect.andThen(
              TestClock.adjust(Duration.millis(slice.length)),
              Effect.andThen(Effect.sync(() => sizes.push(slice.length)), commit({ seen: slice.length }))
            )
        }
      })
      // After 1 + 8 + 64 = 73 ms, 27 items fit the 100 ms budget: the step is 27, not 512.
      assert.deepStrictEqual(sizes, [1, 8, 64, 27])
      assert.strictEqual(result.stop, "budget")
    }))

  it.effect("growing steps: time held by the gate is not work time, so a hold does not shrink the steps", () =>
    Effect.gen(function*() {
      const sizes: Array<number> = []
      let asked = 0
      // The third unit waits 60 s on the gate (the hold), then proceeds.
      const gate = Effect.provideService(HealthGate, {
        ...openGate,
        beforeUnit: () =>
          ++asked === 3
            ? Effect.as(TestClock.adjust("60 seconds"), { proceed: true, heldMs: 60_000, heldBy: ["replicationLag"] })
            : Effect.succeed({ proceed: true, heldMs: 0, heldBy: [] })
      })
      const result = yield* growingSteps({
        batch: "b",
        budget: Duration.seconds(250),
        initial: { seen: 0 },
        source: Stream.fromIterable(Array.from({ length: 10_000 }, (_, i) => i)).pipe(Stream.rechunk(5000)),
        growth: { first: 1, factor: 8, max: 5000 },
        unit: {
          plan: Effect.succeed,
          target: String,
          dry: () => ({ seen: 0 }),
          fence: false,
          // 2 ms per item: 9 items take 18 ms of work.
          write: (slice, commit) =>
            Effect.andThen(
              TestClock.adjust(Duration.millis(2 * slice.length)),
              Effect.andThen(Effect.sync(() => sizes.push(slice.length)), commit({ seen: slice.length }))
            )
        }
      }).pipe(gate)
      // Counted as work, the 60 s hold would say 9 items took 60 s: the next step ≈ 28 items.
      assert.deepStrictEqual(sizes.slice(0, 5), [1, 8, 64, 512, 4096])
      assert.strictEqual(result.heldMs, 60_000)
    }))

  it.effect("growing steps: the next page is read while a page's last step writes, after its reads", () =>
    Effect.gen(function*() {
      const log: Array<string> = []
      const source = threePagesLogged(log)
      const result = yield* growingSteps({
        batch: "b",
        budget: Duration.minutes(4),
        initial: { seen: 0 },
        source,
        growth: { first: 5000, factor: 8, max: 5000 },
        unit: {
          plan: Effect.succeed,
          target: String,
          dry: () => ({ seen: 0 }),
          fence: false,
          write: (slice, commit, readsDone) =>
            Effect.gen(function*() {
              const page = Math.floor(slice[0]! / 5000)
              log.push(`reread ${page}`)
              yield* readsDone
              yield* Effect.yieldNow
              yield* Effect.yieldNow
              log.push(`wrote ${page}`)
              yield* commit({ seen: slice.length })
            })
        }
      })
      assert.deepStrictEqual(log, [
        "read 0",
        "reread 0",
        "read 1",
        "wrote 0",
        "reread 1",
        "read 2",
        "wrote 1",
        "reread 2",
        "wrote 2"
      ])
      assert.deepStrictEqual(result.totals, { seen: 15_000 })
      assert.strictEqual(result.stop, "done")
    }))

  it.effect("growing steps: a page read ahead past the budget is never written", () =>
    Effect.gen(function*() {
      const log: Array<string> = []
      const source = threePagesLogged(log)
      const result = yield* growingSteps({
        batch: "b",
        budget: Duration.seconds(1),
        initial: { seen: 0 },
        source,
        growth: { first: 5000, factor: 8, max: 5000 },
        unit: {
          plan: Effect.succeed,
          target: String,
          dry: () => ({ seen: 0 }),
          fence: false,
          // Each step takes the whole budget.
          write: (slice, commit, readsDone) =>
            Effect.gen(function*() {
              yield* readsDone
              yield* TestClock.adjust("1 second")
              log.push(`wrote ${Math.floor(slice[0]! / 5000)}`)
              yield* commit({ seen: slice.length })
            })
        }
      })
      assert.deepStrictEqual(log, ["read 0", "read 1", "wrote 0"])
      assert.deepStrictEqual(result.totals, { seen: 5000 })
      assert.strictEqual(result.stop, "budget")
    }))

  it.effect("growing steps: at full size, a page a few entries longer than a step is one step", () =>
    Effect.gen(function*() {
      const sizes: Array<number> = []
      yield* growingSteps({
        batch: "b",
        budget: Duration.minutes(4),
        initial: { seen: 0 },
        // Pages as HSCAN's COUNT 5000 returns them: a few entries more, now and then.
        source: Stream.fromIterable(Array.from({ length: 15_009 }, (_, i) => i)).pipe(Stream.rechunk(5003)),
        growth: { first: 1, factor: 8, max: 5000 },
        unit: {
          plan: Effect.succeed,
          target: String,
          dry: () => ({ seen: 0 }),
          fence: false,
          write: (slice, commit) =>
            Effect.andThen(Effect.sync(() => sizes.push(slice.length)), commit({ seen: slice.length }))
        }
      })
      // The first page grows (its 322 left over are a step of their own: the step is not yet at
      // full size); the next two are one step each, not 5000 and then 3.
      assert.deepStrictEqual(sizes, [1, 8, 64, 512, 4096, 322, 5003, 5003])
    }))

  it.effect("cadence: one delay between passes that wait, none between passes that go on at once", () =>
    Effect.gen(function*() {
      const at: Array<number> = []
      const script = ["now", "now", "wait", "wait", "stop"] as const
      const fiber = yield* passes({
        batch: "b",
        budget: Duration.seconds(55),
        delay: Duration.seconds(1),
        pass: () => Effect.map(Clock.currentTimeMillis, (now) => Option.some(at.push(now) - 1)),
        next: (i) => script[i]!
      }).pipe(Effect.forkChild)
      yield* TestClock.adjust("10 seconds")
      const result = yield* Fiber.join(fiber)
      assert.deepStrictEqual(at, [0, 0, 0, 1000, 2000])
      assert.strictEqual(result.results.length, 5)
      assert.strictEqual(result.stop, "done")
    }))

  it.effect("cadence: a dry run makes one pass, whatever `next` says", () =>
    Effect.gen(function*() {
      const result = yield* passes({
        batch: "b",
        budget: Duration.seconds(55),
        delay: Duration.seconds(1),
        pass: () => Effect.succeed(Option.some(1)),
        next: () => "now"
      }).pipe(withRun({ dryRun: true }))
      assert.deepStrictEqual(result.results, [1])
      assert.strictEqual(result.stop, "done")
    }))

  it.effect("cadence: a pass starts only if it can start before the deadline", () =>
    Effect.gen(function*() {
      const at: Array<number> = []
      const fiber = yield* passes({
        batch: "b",
        budget: Duration.millis(3500),
        delay: Duration.seconds(1),
        pass: () => Effect.map(Clock.currentTimeMillis, (now) => Option.some(at.push(now))),
        next: () => "wait"
      }).pipe(Effect.forkChild)
      yield* TestClock.adjust("10 seconds")
      const result = yield* Fiber.join(fiber)
      assert.deepStrictEqual(at, [0, 1000, 2000, 3000])
      assert.strictEqual(result.stop, "budget")
    }))

  it.effect("dry run: every target noted with wouldChange, the dry counts returned, the write never called", () =>
    Effect.gen(function*() {
      const noted: Array<string> = []
      const result = yield* keysetPages({
        batch: "b",
        budget: Duration.minutes(1),
        initial: { dropped: 0 },
        size: 2,
        read: (after: Option.Option<number>) =>
          Effect.succeed(
            [1, 2, 3].filter((id) => Option.match(after, { onNone: () => true, onSome: (a) => id > a })).slice(0, 2)
          ),
        cursor: (id) => id,
        revisit: () => Effect.die("a dry run revisits nothing"),
        unit: {
          plan: Effect.succeed,
          target: (id) => `build:${id}`,
          dry: (page) => ({ dropped: page.length }),
          write: () => Effect.die("a dry run writes nothing")
        }
      }).pipe(withRun({ dryRun: true, wouldChange: (stream) => Effect.sync(() => noted.push(stream)) }))
      assert.deepStrictEqual(noted, ["build:1", "build:2", "build:3"])
      assert.deepStrictEqual(result.totals, { dropped: 3 })
      assert.strictEqual(result.units, 2)
    }))

  it.effect("the gate is asked before every unit; proceed:false stops, writing nothing more; held time and signals summed", () =>
    Effect.gen(function*() {
      const log: Array<string> = []
      const result = yield* each({
        batch: "b",
        budget: Duration.seconds(10),
        initial: { written: 0 },
        inputs: [[1], [2], [3], [4]],
        unit: {
          plan: Effect.succeed,
          target: String,
          dry: () => ({ written: 0 }),
          fence: false,
          write: (ids, commit) => Effect.andThen(Effect.sync(() => log.push(`write ${ids}`)), commit({ written: 1 }))
        }
      }).pipe(scriptedGate(log, [
        { proceed: true, heldMs: 0, heldBy: [] },
        { proceed: true, heldMs: 1500, heldBy: ["replicationLag"] },
        { proceed: false, heldMs: 8500, heldBy: ["walRate", "replicationLag"] }
      ]))
      assert.deepStrictEqual(log, ["gate b 10000", "write 1", "gate b 10000", "write 2", "gate b 10000"])
      assert.deepStrictEqual(result.totals, { written: 2 })
      assert.strictEqual(result.stop, "held")
      assert.strictEqual(result.heldMs, 10_000)
      assert.deepStrictEqual(result.heldBy, ["replicationLag", "walRate"])
    }))

  it.effect("an open gate: heldMs 0 and heldBy [] in every result", () =>
    Effect.gen(function*() {
      const result = yield* each({
        batch: "b",
        budget: Duration.seconds(10),
        initial: {},
        inputs: [],
        unit: { plan: Effect.succeed, target: String, dry: () => ({}), write: () => Effect.void }
      })
      assert.strictEqual(result.heldMs, 0)
      assert.deepStrictEqual(result.heldBy, [])
    }))

  it.effect("progress: a repeated write that changes nothing twice in a row ends the loop instead of spinning", () =>
    Effect.gen(function*() {
      let calls = 0
      const result = yield* repeatUntilDone({
        batch: "b",
        budget: Duration.minutes(10),
        initial: { pruned: 0 },
        dry: Effect.succeed({ pruned: 0 }),
        // Says more is left but never changes anything (e.g. every row locked elsewhere).
        write: (commit) => Effect.as(Effect.andThen(Effect.sync(() => calls++), commit({ pruned: 0 })), true)
      })
      assert.strictEqual(calls, 2)
      assert.strictEqual(result.stop, "done")
    }))

  it.effect("progress: a unit that changed something is not a stall", () =>
    Effect.gen(function*() {
      let calls = 0
      const result = yield* repeatUntilDone({
        batch: "b",
        budget: Duration.minutes(10),
        initial: { pruned: 0 },
        dry: Effect.succeed({ pruned: 0 }),
        write: (commit) =>
          Effect.andThen(Effect.sync(() => ++calls), (n) => Effect.as(commit({ pruned: n <= 3 ? 1 : 0 }), n < 5))
      })
      assert.strictEqual(calls, 5)
      assert.deepStrictEqual(result.totals, { pruned: 3 })
    }))
})

describe("keyset pages with writes in flight", () => {
  /** Pages of one id each from 1 to `last`; every write takes 10 s and logs its start and end. */
  const pagesOf = (
    last: number,
    log: Array<string>,
    options: { writesInFlight: number; budget?: Duration.Duration; fails?: number }
  ) =>
    keysetPages({
      batch: "b",
      budget: options.budget ?? Duration.minutes(10),
      initial: { written: 0, pages: [] as ReadonlyArray<number> },
      size: 1,
      read: (after: Option.Option<number>) =>
        Effect.succeed(
          Option.match(after, { onNone: () => 1, onSome: (a) => a + 1 }) <= last
            ? [Option.match(after, { onNone: () => 1, onSome: (a) => a + 1 })]
            : []
        ),
      cursor: (id) => id,
      revisit: (after) => Effect.sync(() => log.push(`revisit after ${Option.getOrElse(after, () => 0)}`)),
      writesInFlight: options.writesInFlight,
      unit: {
        plan: Effect.succeed,
        target: String,
        dry: () => ({ written: 0, pages: [] }),
        fence: false,
        write: ([id], commit) =>
          Effect.gen(function*() {
            log.push(`start ${id}`)
            yield* Effect.sleep(id === options.fails ? "5 seconds" : "10 seconds")
            if (id === options.fails) return yield* Effect.fail(`page ${id} refused`)
            yield* commit({ written: 1, pages: [id!] })
            log.push(`end ${id}`)
          })
      }
    })

  const runFor = <A, E>(loop: Effect.Effect<A, E>, seconds: number) =>
    Effect.gen(function*() {
      const fiber = yield* Effect.forkChild(loop)
      yield* TestClock.adjust(Duration.seconds(seconds))
      return yield* Fiber.await(fiber)
    })

  it.effect("two in flight: a page's write starts while the one before it commits; counts fold in page order", () =>
    Effect.gen(function*() {
      const log: Array<string> = []
      const exit = yield* runFor(pagesOf(4, log, { writesInFlight: 2 }), 60)
      assert.isTrue(Exit.isSuccess(exit))
      const writes = log.filter((line) => !line.startsWith("revisit"))
      assert.deepStrictEqual(writes, ["start 1", "start 2", "end 1", "start 3", "end 2", "start 4", "end 3", "end 4"])
      if (Exit.isSuccess(exit)) assert.deepStrictEqual(exit.value.totals, { written: 4, pages: [1, 2, 3, 4] })
      // Housekeeping walks only from starts of committed pages: the page starting after n ends first.
      for (const [index, line] of log.entries()) {
        const walked = /^revisit after (\d+)$/.exec(line)
        if (walked !== null) assert.include(log.slice(0, index), `end ${Number(walked[1]) + 1}`, line)
      }
    }).pipe(withRun({})))

  it.effect("one in flight (the default): each write ends before the next starts", () =>
    Effect.gen(function*() {
      const log: Array<string> = []
      yield* runFor(pagesOf(3, log, { writesInFlight: 1 }), 60)
      const writes = log.filter((line) => !line.startsWith("revisit"))
      assert.deepStrictEqual(writes, ["start 1", "end 1", "start 2", "end 2", "start 3", "end 3"])
    }).pipe(withRun({})))

  it.effect("budget: once spent no page starts; the pages in flight finish and are counted", () =>
    Effect.gen(function*() {
      const log: Array<string> = []
      const exit = yield* runFor(pagesOf(6, log, { writesInFlight: 2, budget: Duration.seconds(15) }), 60)
      assert.isTrue(Exit.isSuccess(exit))
      assert.notInclude(log, "start 5")
      assert.include(log, "end 4")
      if (Exit.isSuccess(exit)) {
        assert.deepStrictEqual(exit.value.totals, { written: 4, pages: [1, 2, 3, 4] })
        assert.strictEqual(exit.value.stop, "budget")
      }
    }).pipe(withRun({})))

  it.effect("a write that fails fails the loop; the write in flight beside it is interrupted", () =>
    Effect.gen(function*() {
      const log: Array<string> = []
      const exit = yield* runFor(pagesOf(4, log, { writesInFlight: 2, fails: 1 }), 60)
      assert.isTrue(Exit.isFailure(exit))
      assert.deepStrictEqual(log.filter((line) => !line.startsWith("revisit")), ["start 1", "start 2"])
    }).pipe(withRun({})))
})
