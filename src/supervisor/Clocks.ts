import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"

/** A clock that reads `base` shifted by `offsetMs` and still advances (for `sweeper run --now`). */
export const offsetClock = (base: Clock.Clock, offsetMs: number): Clock.Clock => {
  const millis = () => base.currentTimeMillisUnsafe() + offsetMs
  const nanos = () => base.currentTimeNanosUnsafe() + BigInt(offsetMs) * 1_000_000n
  return {
    currentTimeMillisUnsafe: millis,
    currentTimeMillis: Effect.sync(millis),
    currentTimeNanosUnsafe: nanos,
    currentTimeNanos: Effect.sync(nanos),
    monotonicTimeNanosUnsafe: () => base.monotonicTimeNanosUnsafe(),
    monotonicTimeNanos: base.monotonicTimeNanos,
    sleep: (duration) => base.sleep(duration)
  }
}

/** Runs `effect` (and every layer it builds) with its clock starting at `startAt`. */
export const startingAt = (startAt: Date) => <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.gen(function*() {
    const base = yield* Clock.Clock
    return yield* Effect.provideService(
      effect,
      Clock.Clock,
      offsetClock(base, startAt.getTime() - base.currentTimeMillisUnsafe())
    )
  })
