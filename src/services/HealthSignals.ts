/**
 * The health gate's readings, each from the real thing: PostgreSQL's statistics views on
 * the repaired database, Redis' `INFO memory` per store, the oldest job of a Sidekiq queue,
 * Prometheus' instant-query API. The gate's sampler (src/layers/health/HealthSampler.ts) reads these off
 * the repair path, at most once a second; `sweeper doctor` calls them once to say what each reads now.
 *
 * Every reader fails with `SignalUnreadable` naming why (no privilege, server down, no maxmemory,
 * an answer that is not a number): the gate turns that into an `unknown` reading, logged and counted.
 */
import * as Context from "effect/Context"
import type * as Effect from "effect/Effect"
import * as Schema from "effect/Schema"
import type { DatabaseName } from "../domain/Databases.ts"
import type { RedisStoreName } from "../domain/Health.ts"
import { NO_SELECTION, type StandbyRow, type StandbySelection, type StandbyVerdict } from "../domain/Standbys.ts"

/** Which standbys the operator named to watch or ignore (`SWEEPER_HEALTH_STANDBYS`); none by default. */
export const HealthStandbys = Context.Reference<StandbySelection>("sweeper/services/HealthStandbys", {
  defaultValue: () => NO_SELECTION
})

/** A physical standby and whether replicationLag counts it, with why. */
export interface StandbyStatus extends StandbyRow, StandbyVerdict {}

export class SignalUnreadable extends Schema.TaggedError<SignalUnreadable>()("SignalUnreadable", {
  /** What was being read: `pg_stat_replication`, `INFO memory on queues`, `queue:default`, a PromQL query. */
  source: Schema.String,
  reason: Schema.String
}) {
  override get message() {
    return `${this.source}: ${this.reason}`
  }
}

export interface ReplicationLag {
  /** Standbys streaming from this database and watched (physical, not delayed unless named). */
  readonly standbys: number
  /** The largest replay lag: bytes behind pg_current_wal_lsn(); 0 with no standby. */
  readonly bytes: number
  /** The largest `replay_lag`, seconds (0 with no standby, or a standby fully caught up). */
  readonly seconds: number
}

/** What the connected role may read (`sweeper doctor`). */
export interface SignalPrivileges {
  readonly role: string
  readonly superuser: boolean
  /** pg_monitor or pg_read_all_stats (pg_monitor includes it): other backends' rows in the statistics views. */
  readonly readAllStats: boolean
  /** Whether this database is a standby (no pg_current_wal_lsn(): no replication or WAL signal). */
  readonly inRecovery: boolean
}

export class HealthSignals extends Context.Service<HealthSignals, {
  /** pg_stat_replication on the repaired database. */
  readonly replicationLag: Effect.Effect<ReplicationLag, SignalUnreadable>
  /** Every physical standby of this database, watched or not and why (`sweeper doctor`). */
  readonly standbys: Effect.Effect<ReadonlyArray<StandbyStatus>, SignalUnreadable>
  /** pg_current_wal_lsn() as bytes since 0/0: two samples make the WAL rate. */
  readonly walPosition: Effect.Effect<number, SignalUnreadable>
  /** Which of `tables` (or their partitions) a VACUUM — autovacuum or manual — is working on now. */
  readonly vacuuming: (tables: ReadonlyArray<string>) => Effect.Effect<ReadonlyArray<string>, SignalUnreadable>
  /** Age in seconds of the oldest open transaction of any other backend (0: none open). */
  readonly oldestTransaction: Effect.Effect<number, SignalUnreadable>
  /** used_memory / maxmemory of a store (every node's worst, on a cluster). */
  readonly redisMemory: (store: RedisStoreName) => Effect.Effect<number, SignalUnreadable>
  /** Sidekiq's latency of a queue: now − enqueued_at of its oldest job, seconds (0: empty). */
  readonly queueLatency: (queue: string) => Effect.Effect<number, SignalUnreadable>
  /** An instant PromQL query that must return one number. */
  readonly prometheus: (url: string, query: string) => Effect.Effect<number, SignalUnreadable>
  readonly privileges: Effect.Effect<SignalPrivileges, SignalUnreadable>
}>()("sweeper/services/HealthSignals") {}

/**
 * HealthSignals per GitLab database, for the PostgreSQL signals of a decomposed GitLab: the gate reads
 * replication lag, WAL, vacuums and transactions on the database a batch writes. Absent (ci is not a
 * database of its own), HealthSignals reads them all, on the one database, named main.
 */
export class DatabaseSignals extends Context.Service<
  DatabaseSignals,
  Readonly<Record<DatabaseName, HealthSignals["Service"]>>
>()("sweeper/services/DatabaseSignals") {}
