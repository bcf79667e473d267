/**
 * What a round of the health sampler reads, and nothing it writes: every slot's signal, replication lag
 * and vacuums read once per database and shared by the slots that need them, and the WAL position read in
 * one step with Sweeper's own writing spans (domain/WalBaseline.ts). The sampler's fiber applies the
 * result (SamplerSlots.ts).
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as SynchronizedRef from "effect/SynchronizedRef"
import type { DatabaseName } from "../../domain/Databases.ts"
import { isRedisStoreName, type Reading, unknown, value } from "../../domain/Health.ts"
import * as OwnWal from "../../domain/WalBaseline.ts"
import { SignalUnreadable } from "../../services/HealthSignals.ts"
import {
  isRelative,
  type LagValue,
  type RoundRead,
  type SamplerState,
  type SignalReaders,
  type Slot,
  type SlotRead
} from "./SamplerSlots.ts"

type Lag = Effect.Effect<LagValue, SignalUnreadable>

export const asReading = (effect: Effect.Effect<number, SignalUnreadable>) =>
  Effect.match(effect, {
    onFailure: (error) => unknown(error.reason === "" ? error.message : `${error.source}: ${error.reason}`),
    onSuccess: value
  })

export const replicationReading = (result: Lag, measure: "bytes" | "seconds") =>
  asReading(Effect.map(result, (lag) => lag[measure]))

/** The tables whose vacuums some slot watches on the database. */
export const vacuumTables = (slots: ReadonlyMap<string, Slot>, database: DatabaseName) => [
  ...new Set(
    [...slots.values()].filter((slot) => slot.rule.source._tag === "Autovacuum" && slot.database === database)
      .map((slot) => slot.subject)
  )
]

/** What one round reads once per database and shares between the slots that need it. */
export interface SharedReads {
  readonly replication: ReadonlyMap<DatabaseName, Lag>
  readonly vacuumed: ReadonlyMap<DatabaseName, Effect.Effect<ReadonlyArray<string>, SignalUnreadable>>
}

export const sharedReads = (state: SamplerState, readers: SignalReaders) =>
  Effect.gen(function*() {
    const replication = new Map<DatabaseName, Lag>()
    const vacuumed = new Map<DatabaseName, Effect.Effect<ReadonlyArray<string>, SignalUnreadable>>()
    for (const database of state.databases) {
      replication.set(database, yield* Effect.cached(readers.signalsOf(database).replicationLag))
      const tables = vacuumTables(state.slots, database)
      vacuumed.set(
        database,
        yield* Effect.cached(
          tables.length === 0
            ? Effect.succeed<ReadonlyArray<string>>([])
            : readers.signalsOf(database).vacuuming(tables)
        )
      )
    }
    return { replication, vacuumed } satisfies SharedReads
  })

/** A read the round shares, by database: every database a slot reads has one (sharedReads). */
export const sharedRead = <A>(
  reads: ReadonlyMap<DatabaseName, Effect.Effect<A, SignalUnreadable>>,
  database: DatabaseName
): Effect.Effect<A, SignalUnreadable> =>
  reads.get(database) ??
    Effect.fail(new SignalUnreadable({ source: database, reason: "not read this round" }))

export const NOTHING_OWN: OwnWal.OwnShare = { bytes: 0, millis: 0, unmeasured: false }

/**
 * The database's WAL position, read in one step with the spans the units' writes open and close
 * (a relative rule's own share; domain/WalBaseline.ts), so no span edge falls between the two.
 */
export const readWalPosition = (
  state: SamplerState,
  readers: SignalReaders,
  slot: Slot,
  database: DatabaseName,
  at: number
): Effect.Effect<SlotRead> => {
  const own = isRelative(slot.rule) ? state.ownWal.get(database) : undefined
  const read = Effect.result(readers.signalsOf(database).walPosition)
  if (own === undefined) return Effect.map(read, (result) => ({ _tag: "WalPosition", result, own: NOTHING_OWN }))
  return SynchronizedRef.modifyEffect(
    own,
    (ownState) =>
      Effect.map(read, (result): readonly [SlotRead, OwnWal.OwnWal] => {
        if (result._tag === "Failure") return [{ _tag: "WalPosition", result, own: NOTHING_OWN }, ownState]
        const [share, next] = OwnWal.takeOwn(ownState, { at, position: result.success })
        return [{ _tag: "WalPosition", result, own: share }, next]
      })
  )
}

/** What the round that began at `at` reads of a slot: it reads, and writes nothing to the slot. */
export const readSlot = (
  state: SamplerState,
  readers: SignalReaders,
  shared: SharedReads,
  slot: Slot,
  at: number
): Effect.Effect<SlotRead> => {
  const source = slot.rule.source
  const database = slot.database ?? "main"
  const reading = (effect: Effect.Effect<Reading>): Effect.Effect<SlotRead> =>
    Effect.map(effect, (r) => ({ _tag: "Reading", reading: r }))
  switch (source._tag) {
    case "ReplicationLag":
      return reading(replicationReading(sharedRead(shared.replication, database), source.measure))
    case "WalRate":
      return readWalPosition(state, readers, slot, database, at)
    case "Autovacuum":
      return reading(asReading(
        Effect.map(sharedRead(shared.vacuumed, database), (tables) => tables.includes(slot.subject) ? 1 : 0)
      ))
    case "LongTransactions":
      return reading(asReading(readers.signalsOf(database).oldestTransaction))
    case "RedisMemory":
      return isRedisStoreName(slot.subject)
        ? reading(asReading(readers.signals.redisMemory(slot.subject)))
        : Effect.succeed({ _tag: "Reading", reading: unknown(`${slot.subject} is not a Redis store`) })
    case "QueueLatency":
      return reading(asReading(readers.signals.queueLatency(slot.subject)))
    case "Prometheus":
      return reading(asReading(readers.signals.prometheus(source.url, source.query)))
  }
}

/** One round's reads, every slot concurrently; nothing is written until the sampler applies them. */
export const readRound = (state: SamplerState, readers: SignalReaders): Effect.Effect<RoundRead> =>
  Effect.gen(function*() {
    const at = yield* Clock.currentTimeMillis
    const shared = yield* sharedReads(state, readers)
    const reads = yield* Effect.forEach(
      [...state.slots.values()],
      (slot) => Effect.map(readSlot(state, readers, shared, slot, at), (read) => [slot, read] as const),
      { concurrency: "unbounded" }
    )
    return { at, reads }
  })
