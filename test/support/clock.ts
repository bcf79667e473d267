/** Clocks for storage tests that need exact timestamps without a TestClock in the context. */
import { Clock, Effect } from "effect"

/** A clock frozen at `at` (wall time); sleeps and monotonic time still follow the real clock. */
export const frozenClock = (base: Clock.Clock, at: Date): Clock.Clock => {
  const millis = at.getTime()
  return {
    currentTimeMillisUnsafe: () => millis,
    currentTimeMillis: Effect.succeed(millis),
    currentTimeNanosUnsafe: () => BigInt(millis) * 1_000_000n,
    currentTimeNanos: Effect.succeed(BigInt(millis) * 1_000_000n),
    monotonicTimeNanosUnsafe: () => base.monotonicTimeNanosUnsafe(),
    monotonicTimeNanos: base.monotonicTimeNanos,
    sleep: (duration) => base.sleep(duration)
  }
}

/** Runs `effect` with DateTime.now / Clock reading exactly `at`. */
export const at = (instant: string | Date) => <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Clock.clockWith((base) => Effect.provideService(effect, Clock.Clock, frozenClock(base, new Date(instant))))
