/**
 * The console's shared feed (ConsoleFeed): however many tabs are open, the views are read once a
 * period and each change is rendered once; every client gets the current frames on connecting and
 * each change after; idle streams carry a heartbeat; one client beyond the cap is refused. Before
 * the feed, each open `/api/stream` ran its own once-a-second read, so reads grew with the clients;
 * with no client connected the feed reads nothing (an idle supervisor's allocation, and so its RSS).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber, Latch, Stream } from "effect"
import { TestClock } from "effect/testing"
import { makeConsoleFeed, makeHistoryFragments, TooManyStreams } from "../../src/http/Console.ts"

const decoder = new TextDecoder()

/** A reading that counts how often it is taken; the holds can be changed from the test. */
const countingReading = () => {
  const state = { reads: 0, holds: [] as Array<string> }
  const read = Effect.sync(() => {
    state.reads++
    return { views: [], holds: [...state.holds] }
  })
  return { state, read }
}

/** Opens `clients` streams, runs the clock `seconds` seconds with one change halfway; what each got. */
const session = (clients: number, seconds: number) =>
  Effect.gen(function*() {
    const { read, state } = countingReading()
    const feed = yield* makeConsoleFeed(read)
    const received = Array.from({ length: clients }, () => [] as Array<string>)
    const fibers = yield* Effect.forEach(received, (frames) =>
      Effect.flatMap(feed.open, (stream) =>
        Stream.runForEach(stream, (bytes) =>
          Effect.sync(() => frames.push(decoder.decode(bytes))))).pipe(
          Effect.forkChild
        ))
    yield* TestClock.adjust("1 millis")
    const before = state.reads
    yield* TestClock.adjust(`${seconds / 2} seconds`)
    state.holds = ["drop-canceling-builds held: replica lag 12 s over 10 s"]
    yield* TestClock.adjust(`${seconds / 2} seconds`)
    const reads = state.reads - before
    assert.strictEqual(yield* feed.clients, clients)
    yield* Effect.forEach(fibers, Fiber.interrupt)
    return { reads, received, open: yield* feed.clients }
  }).pipe(Effect.scoped)

describe("ConsoleFeed", () => {
  it.effect("reads once a period whatever the number of clients, and each client gets each change", () =>
    Effect.gen(function*() {
      const one = yield* session(1, 20)
      const fifty = yield* session(50, 20)
      assert.isAtLeast(one.reads, 19)
      assert.isAtMost(one.reads, 21)
      assert.strictEqual(fifty.reads, one.reads, "the read rate does not grow with the clients")
      assert.strictEqual(fifty.open, 0, "closed streams are counted out")
      for (const frames of fifty.received) {
        const pages = frames.filter((f) => f.includes("event: page"))
        // The current frames on connecting, then the one change (the hold), nothing for idle seconds.
        assert.lengthOf(pages, 2, frames.join("|"))
        assert.include(pages[1], "replica lag 12 s")
        assert.include(frames[0], "retry:")
        // 20 s of idle clock: one heartbeat comment after 15 s.
        assert.lengthOf(frames.filter((f) => f.startsWith(": heartbeat")), 1)
      }
    }))

  it.effect("reads nothing while no client is connected, and a client connecting later gets the views as they are", () =>
    Effect.gen(function*() {
      const { read, state } = countingReading()
      const feed = yield* makeConsoleFeed(read)
      yield* TestClock.adjust("60 seconds")
      assert.strictEqual(state.reads, 0, "an idle supervisor with no console open reads nothing")
      const frames = (stream: Stream.Stream<Uint8Array>) =>
        Effect.gen(function*() {
          const received: Array<string> = []
          const fiber = yield* Effect.forkChild(
            Stream.runForEach(stream, (bytes) => Effect.sync(() => received.push(decoder.decode(bytes))))
          )
          return { received, fiber }
        })
      const first = yield* frames(yield* feed.open)
      yield* TestClock.adjust("10 seconds")
      const whileOpen = state.reads
      assert.isAtLeast(whileOpen, 10, "one read on connecting, then one a period")
      yield* Fiber.interrupt(first.fiber)
      yield* TestClock.adjust("1 millis")
      // What changed while nobody watched is what the next client sees first.
      state.holds = ["stuck-export-jobs held: queue latency 90 s over 60 s"]
      yield* TestClock.adjust("60 seconds")
      assert.isAtMost(state.reads - whileOpen, 1, "reading stops when the last client leaves")
      const second = yield* frames(yield* feed.open)
      yield* TestClock.adjust("1 millis")
      const pages = second.received.filter((f) => f.includes("event: page"))
      assert.lengthOf(pages, 1, second.received.join("|"))
      assert.include(pages[0], "queue latency 90 s")
      yield* TestClock.adjust("5 seconds")
      assert.isAtLeast(state.reads - whileOpen, 5, "and starts again with the next client")
      yield* Fiber.interrupt(second.fiber)
    }).pipe(Effect.scoped))

  it.effect("a client that stops reading holds only the newest frames, not every change it missed", () =>
    Effect.gen(function*() {
      const { read, state } = countingReading()
      const feed = yield* makeConsoleFeed(read)
      const reading = yield* Latch.make(false)
      const received: Array<string> = []
      // Takes the first frame, then waits (a socket that no longer drains) until the latch opens.
      yield* Effect.forkChild(
        Stream.runForEach(yield* feed.open, (bytes) =>
          Effect.andThen(
            Effect.sync(() => received.push(decoder.decode(bytes))),
            received.length === 0 ? Effect.void : Latch.await(reading)
          ))
      )
      yield* TestClock.adjust("1 millis")
      for (let change = 1; change <= 50; change++) {
        state.holds = [`hold number ${change}`]
        yield* TestClock.adjust("1 second")
      }
      yield* Latch.open(reading)
      yield* TestClock.adjust("1 millis")
      const pages = received.filter((f) => f.includes("event: page"))
      assert.isAtMost(pages.length, 3, `${pages.length} page frames kept for one stalled client`)
      assert.include(pages.at(-1), "hold number 50")
    }).pipe(Effect.scoped))

  it.effect("refuses a client beyond the cap and takes one again once a stream closes", () =>
    Effect.gen(function*() {
      const { read } = countingReading()
      const feed = yield* makeConsoleFeed(read, { maxStreams: 2 })
      const a = yield* Effect.forkChild(Stream.runDrain(yield* feed.open))
      yield* Effect.forkChild(Stream.runDrain(yield* feed.open))
      yield* TestClock.adjust("1 millis")
      const refused = yield* Effect.flip(feed.open)
      assert.instanceOf(refused, TooManyStreams)
      assert.strictEqual(refused.max, 2)
      yield* Fiber.interrupt(a)
      assert.strictEqual(yield* feed.clients, 1)
      yield* Effect.forkChild(Stream.runDrain(yield* feed.open))
      yield* TestClock.adjust("1 millis")
      assert.strictEqual(yield* feed.clients, 2)
    }).pipe(Effect.scoped))

  it.effect("a batch page's history is rendered once per run for all its open tabs", () =>
    Effect.gen(function*() {
      let renders = 0
      const fragments = yield* makeHistoryFragments((key) =>
        Effect.sync(() => {
          renders++
          return `<section id="history">${key.batch} after ${key.lastRun}</section>`
        })
      )
      const tabs = (lastRun: string) =>
        Effect.forEach(
          Array.from({ length: 50 }),
          () => fragments({ batch: "drop-canceling-builds", window: "", lastRun }),
          { concurrency: "unbounded" }
        )
      const first = yield* tabs("run-1")
      assert.strictEqual(renders, 1)
      assert.include(first[49], "after run-1")
      const second = yield* tabs("run-2")
      assert.strictEqual(renders, 2, "a new run is a new fragment")
      assert.include(second[0], "after run-2")
    }).pipe(Effect.scoped))
})
