/**
 * HealthSignals in memory, for specs of the gate under TestClock: each reading is whatever the spec
 * last set in `MemorySignalValues` (a number, a string = unreadable with that reason, or a Fault). Nothing
 * set reads as healthy (0, no vacuum, no standby). DatabaseSignalsMemory adds a ci database whose
 * readings are MemoryCiSignalValues' (main's stay MemorySignalValues'), for a decomposed gate.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type { RedisStoreName } from "../../domain/Health.ts"
import { DatabaseSignals, HealthSignals, SignalUnreadable } from "../../services/HealthSignals.ts"

/**
 * A reader that never answers (a hung server with no timeout), dies (a defect in the reader), or
 * answers `value` only after `millis` (a slow server; under TestClock, once the clock passes it).
 */
export type Fault =
  | { readonly _tag: "Hang" }
  | { readonly _tag: "Die"; readonly message: string }
  | { readonly _tag: "Slow"; readonly millis: number; readonly value: number }
type Value = number | string | Fault

export interface SignalValues {
  replicationLagBytes?: Value
  replicationLagSeconds?: Value
  walPosition?: Value
  /** Tables under vacuum (a string: unreadable). */
  vacuuming?: ReadonlyArray<string> | string
  oldestTransaction?: Value
  redisMemory?: Partial<Record<RedisStoreName, Value>>
  queueLatency?: Record<string, Value>
  /** By PromQL query. */
  prometheus?: Record<string, Value>
  /** How many times each reader was called (the sampler's rate). */
  readonly reads: Record<string, number>
}

export class MemorySignalValues
  extends Context.Service<MemorySignalValues, SignalValues>()("sweeper/layers/memory/MemorySignalValues")
{
  static readonly layer = Layer.sync(MemorySignalValues, (): SignalValues => ({ reads: {} }))
}

/** The ci database's readings, for a decomposed gate (DatabaseSignalsMemory). */
export class MemoryCiSignalValues
  extends Context.Service<MemoryCiSignalValues, SignalValues>()("sweeper/layers/memory/MemoryCiSignalValues")
{
  static readonly layer = Layer.sync(MemoryCiSignalValues, (): SignalValues => ({ reads: {} }))
}

/** Signals that read `values` (and count their reads there). */
export const memorySignals = (values: SignalValues): HealthSignals["Service"] => {
  const read = (source: string, get: () => Value | undefined, fallback = 0) =>
    Effect.suspend(() => {
      values.reads[source] = (values.reads[source] ?? 0) + 1
      const v = get() ?? fallback
      if (typeof v === "object") {
        switch (v._tag) {
          case "Hang":
            return Effect.never
          case "Die":
            return Effect.die(new Error(v.message))
          case "Slow":
            return Effect.as(Effect.sleep(v.millis), v.value)
        }
      }
      return typeof v === "string" ? Effect.fail(new SignalUnreadable({ source, reason: v })) : Effect.succeed(v)
    })
  return HealthSignals.of({
    replicationLag: Effect.all({
      bytes: read("pg_stat_replication", () => values.replicationLagBytes),
      seconds: read("pg_stat_replication.seconds", () => values.replicationLagSeconds)
    }).pipe(Effect.map((lag) => ({ standbys: 1, ...lag }))),
    standbys: read("pg_stat_replication", () => values.replicationLagBytes).pipe(
      Effect.map((bytes) => [
        { name: "memory", bytes, flushLagS: null, replayLagS: null, watched: true, reason: "streaming standby" }
      ])
    ),
    walPosition: read("pg_current_wal_lsn()", () => values.walPosition),
    vacuuming: (tables) =>
      Effect.suspend(() => {
        values.reads["pg_stat_progress_vacuum"] = (values.reads["pg_stat_progress_vacuum"] ?? 0) + 1
        const v = values.vacuuming ?? []
        return typeof v === "string"
          ? Effect.fail(new SignalUnreadable({ source: "pg_stat_progress_vacuum", reason: v }))
          : Effect.succeed(v.filter((table) => tables.includes(table)))
      }),
    oldestTransaction: read("pg_stat_activity", () => values.oldestTransaction),
    redisMemory: (store) => read(`INFO memory on ${store}`, () => values.redisMemory?.[store]),
    queueLatency: (queue) => read(`queue:${queue}`, () => values.queueLatency?.[queue]),
    prometheus: (_url, query) => read(`prometheus ${query}`, () => values.prometheus?.[query]),
    privileges: Effect.succeed({ role: "memory", superuser: true, readAllStats: true, inRecovery: false })
  })
}

export const HealthSignalsMemory = Layer.effect(HealthSignals, Effect.map(MemorySignalValues, memorySignals))

/** A decomposed GitLab's signals: main on MemorySignalValues (HealthSignals), ci on MemoryCiSignalValues. */
export const DatabaseSignalsMemory = Layer.effect(
  DatabaseSignals,
  Effect.gen(function*() {
    return DatabaseSignals.of({ main: yield* HealthSignals, ci: memorySignals(yield* MemoryCiSignalValues) })
  })
)
