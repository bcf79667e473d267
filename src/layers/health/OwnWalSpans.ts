/**
 * Sweeper's own writing, measured for a relative walRate's baseline: a unit's write is wrapped so that
 * the first unit to start writing a database and the last to stop each read its WAL position, and the
 * span between is folded (domain/WalBaseline.ts) into what the next round takes out of its sample.
 */
import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as SynchronizedRef from "effect/SynchronizedRef"
import type { DatabaseName } from "../../domain/Databases.ts"
import * as OwnWal from "../../domain/WalBaseline.ts"
import type { SamplerState, SignalReaders } from "./SamplerSlots.ts"

/**
 * The longest a write waits for the WAL position at its span's edge: past it the span is unmeasured
 * (that round adds no baseline sample) and the write goes on.
 */
export const OWN_WAL_MARK_WAIT = Duration.seconds(1)

/**
 * `write`, with the span it writes the databases recorded as Sweeper's own: the position read when the
 * first unit starts writing and when the last one stops (concurrent units share one span).
 */
export const ownWrite =
  (state: SamplerState, readers: SignalReaders, databases: ReadonlyArray<DatabaseName>) =>
  <A, E, R>(write: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> => {
    const refs = databases.flatMap((database) => {
      const ref = state.ownWal.get(database)
      return ref === undefined ? [] : [[database, ref] as const]
    })
    if (refs.length === 0) return write
    const mark = (database: DatabaseName) =>
      Effect.gen(function*() {
        const position = yield* Effect.option(
          Effect.timeoutOption(readers.signalsOf(database).walPosition, OWN_WAL_MARK_WAIT)
        )
        const at = yield* Clock.currentTimeMillis
        return Option.map(Option.flatten(position), (p): OwnWal.WalMark => ({ at, position: p }))
      })
    const edge = (
      needsMark: (s: OwnWal.OwnWal) => boolean,
      step: (s: OwnWal.OwnWal, m: Option.Option<OwnWal.WalMark>) => OwnWal.OwnWal
    ) =>
      Effect.forEach(
        refs,
        ([database, ref]) =>
          SynchronizedRef.updateEffect(ref, (s) =>
            needsMark(s) ? Effect.map(mark(database), (m) => step(s, m)) : Effect.succeed(step(s, Option.none()))),
        {
          discard: true
        }
      )
    return Effect.acquireUseRelease(
      edge(OwnWal.startsSpan, OwnWal.writeStarted),
      () => write,
      () => edge(OwnWal.endsSpan, OwnWal.writeEnded)
    )
  }
