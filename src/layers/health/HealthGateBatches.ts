/**
 * What the health gate knows of its batches before it reads anything: what each one writes, which
 * rules can hold it, and on which database a PostgreSQL signal is read for it. Fixed when the gate
 * is built; the sampler, the holds and the throttle all look batches up here.
 */
import type { BatchWrites } from "../../domain/Batch.ts"
import type { DatabaseName } from "../../domain/Databases.ts"
import {
  databaseOfSubject,
  databasesOf,
  type HealthConfig,
  NO_WRITES,
  type SignalRule,
  subjectsFor,
  throttlesInsteadOfHolding,
  type WriteSet
} from "../../domain/Health.ts"

/** A batch as the gate needs it: its name and what it writes. */
export interface GatedBatch {
  readonly name: string
  readonly writes?: BatchWrites | undefined
}

export const writeSetOf = (batch: GatedBatch, limitQueues: ReadonlyArray<string>, decomposed = false): WriteSet => ({
  tables: batch.writes?.tables ?? [],
  databases: databasesOf(batch.writes, decomposed),
  redisStores: batch.writes?.redisStores ?? [],
  queues: [
    ...new Set([
      ...(batch.writes?.queues ?? []),
      // Workers discovered at run time (not in SWEEPER_CONCURRENCY_LIMITS) are resumed into `default`.
      ...(batch.writes?.concurrencyLimitQueues === true ? [...limitQueues, "default"] : [])
    ])
  ]
})

/** A signal's metric labels: PostgreSQL ones name their database. */
export const signalLabels = (signal: string, database: DatabaseName | undefined) =>
  database === undefined ? { signal } : { signal, database }

export interface GateBatches {
  /** What each batch writes, by batch name. */
  readonly writeSets: ReadonlyMap<string, WriteSet>
  /** The batches whose concurrency limits the gate may throttle (they resume concurrency-limited queues). */
  readonly throttling: ReadonlySet<string>
  /** The rules that can hold a batch: those with a subject it writes, less those that throttle it instead. */
  readonly holdingRules: (batch: string) => ReadonlyArray<SignalRule>
  /** The database a PostgreSQL rule reads for a batch (undefined for the others). */
  readonly databaseFor: (signal: string, batch: string) => DatabaseName | undefined
}

export const gateBatches = (
  config: HealthConfig,
  batches: ReadonlyArray<GatedBatch>,
  limitQueues: ReadonlyArray<string>,
  decomposed: boolean
): GateBatches => {
  const writeSets = new Map(batches.map((batch) => [batch.name, writeSetOf(batch, limitQueues, decomposed)]))
  const throttling = new Set(
    batches.filter((batch) => batch.writes?.concurrencyLimitQueues === true).map((batch) => batch.name)
  )
  const holdingRules = (batch: string): ReadonlyArray<SignalRule> => {
    const writes = writeSets.get(batch)
    if (writes === undefined) return []
    return config.rules.filter((rule) =>
      subjectsFor(rule, writes).length > 0 &&
      !(config.throttleLimits && throttling.has(batch) && throttlesInsteadOfHolding(rule))
    )
  }
  const databaseFor = (signal: string, batch: string): DatabaseName | undefined => {
    const rule = config.rules.find((r) => r.signal === signal)
    const subject = rule === undefined ? undefined : subjectsFor(rule, writeSets.get(batch) ?? NO_WRITES)[0]
    return rule === undefined || subject === undefined ? undefined : databaseOfSubject(rule, subject, decomposed)
  }
  return { writeSets, throttling, holdingRules, databaseFor }
}
