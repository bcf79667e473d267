/**
 * A relative walRate's samples (domain/WalBaseline.ts): Sweeper's own writing spans taken out of a
 * round's WAL, concurrent units sharing one span, and the window forgetting old samples on every
 * round whether or not a new one is added.
 */
import { assert, describe, it } from "@effect/vitest"
import { Duration, Option } from "effect"
import * as Wal from "../../src/domain/WalBaseline.ts"

const mark = (at: number, position: number) => Option.some({ at, position })
const MB = 1_000_000

describe("walRate's baseline samples", () => {
  it("a round takes out the WAL and the time of Sweeper's span: the sample is the platform's rate in the gaps", () => {
    // 0–1000 ms: 10 MB/s of platform WAL; Sweeper writes 20 MB between 200 and 400 ms.
    let own = Wal.writeStarted(Wal.NO_OWN_WAL, mark(200, 2 * MB))
    own = Wal.writeEnded(own, mark(400, 24 * MB))
    const [share, next] = Wal.takeOwn(own, { at: 1000, position: 30 * MB })
    assert.deepStrictEqual(share, { bytes: 22 * MB, millis: 200, unmeasured: false })
    assert.deepStrictEqual(next, Wal.NO_OWN_WAL)
    const rate = Wal.platformRate({ at: 0, position: 0 }, { at: 1000, position: 30 * MB }, share)
    assert.deepStrictEqual(rate, Option.some(10 * MB))
  })

  it("concurrent units share one span; only the first start and the last end read the position", () => {
    let own = Wal.writeStarted(Wal.NO_OWN_WAL, mark(100, 0))
    assert.isFalse(Wal.startsSpan(own))
    own = Wal.writeStarted(own, Option.none())
    assert.isFalse(Wal.endsSpan(own))
    own = Wal.writeEnded(own, Option.none())
    assert.isTrue(Wal.endsSpan(own))
    own = Wal.writeEnded(own, mark(300, 5 * MB))
    assert.deepStrictEqual(Wal.takeOwn(own, { at: 1000, position: 9 * MB })[0], {
      bytes: 5 * MB,
      millis: 200,
      unmeasured: false
    })
  })

  it("a span still open is split at the round: its part so far now, the rest the next round's", () => {
    const own = Wal.writeStarted(Wal.NO_OWN_WAL, mark(500, 10 * MB))
    const [first, after] = Wal.takeOwn(own, { at: 1000, position: 14 * MB })
    assert.deepStrictEqual(first, { bytes: 4 * MB, millis: 500, unmeasured: false })
    const [second] = Wal.takeOwn(Wal.writeEnded(after, mark(1500, 20 * MB)), { at: 2000, position: 21 * MB })
    assert.deepStrictEqual(second, { bytes: 6 * MB, millis: 500, unmeasured: false })
  })

  it("a round Sweeper wrote through, or whose span edge was not read, adds no sample", () => {
    const from = { at: 0, position: 0 }
    const to = { at: 1000, position: 10 * MB }
    assert.isTrue(Option.isNone(Wal.platformRate(from, to, { bytes: 9 * MB, millis: 950, unmeasured: false })))
    assert.isTrue(Option.isNone(Wal.platformRate(from, to, { bytes: 0, millis: 0, unmeasured: true })))
    const unread = Wal.writeStarted(Wal.NO_OWN_WAL, Option.none())
    assert.isTrue(Wal.takeOwn(unread, to)[0].unmeasured)
    // Still unmeasured while that span lasts; measured again once it ended.
    const [, still] = Wal.takeOwn(unread, to)
    assert.isTrue(Wal.takeOwn(still, { at: 2000, position: 11 * MB })[0].unmeasured)
    const [, ended] = Wal.takeOwn(Wal.writeEnded(still, mark(2500, 12 * MB)), { at: 3000, position: 13 * MB })
    assert.isFalse(Wal.takeOwn(ended, { at: 4000, position: 14 * MB })[0].unmeasured)
  })

  it("the platform's rate is never negative, whatever Sweeper's share", () => {
    const rate = Wal.platformRate({ at: 0, position: 0 }, { at: 1000, position: MB }, {
      bytes: 2 * MB,
      millis: 0,
      unmeasured: false
    })
    assert.deepStrictEqual(rate, Option.some(0))
  })

  it("the window forgets samples older than it at every round, with or without a new sample", () => {
    const hour = Duration.toMillis(Duration.hours(1))
    const samples = [{ at: 0, value: 3 }, { at: 1000, value: 3 }, { at: hour, value: 10 }]
    assert.deepStrictEqual(Wal.windowed(samples, hour), [{ at: 1000, value: 3 }, { at: hour, value: 10 }])
    assert.deepStrictEqual(Wal.windowed(samples, hour + 1000), [{ at: hour, value: 10 }])
    assert.deepStrictEqual(Wal.windowed(samples, 2 * hour), [])
  })
})
