/**
 * HealthSignals read from the real servers:
 *
 * - PostgreSQL, on the database of the PgClient it is given (main's; a second instance on ci's, see
 *   DatabaseSignalsLive): `pg_stat_replication` over physical standbys
 *   (largest replay lag in bytes behind `pg_current_wal_lsn()`, and `replay_lag`),
 *   `pg_current_wal_lsn()` for the WAL rate, `pg_stat_progress_vacuum` joined to the batch's
 *   tables and their partitions, and the oldest `xact_start` in `pg_stat_activity` of any other
 *   backend. Without pg_read_all_stats (or pg_monitor, which includes it) PostgreSQL hides other
 *   roles' rows' columns, which would read as "healthy": such a reading is refused as unreadable,
 *   naming the role to grant.
 * - Redis: `INFO memory` per store (every master of a cluster, the worst one counts).
 * - Sidekiq: the oldest job of `queue:<name>` is at its tail (LPUSH at the head, BRPOP from the
 *   tail); its `enqueued_at` is epoch seconds (Sidekiq ≤ 7) or milliseconds (Sidekiq 8).
 * - Prometheus: `GET /api/v1/query` through effect's HttpClient, its answer decoded by a Schema;
 *   it must be one number (one series or a scalar).
 *
 * Each reading has a deadline (READ_TIMEOUT): a server that hangs is an unknown reading, never a
 * stuck sampler.
 */
import { PgClient } from "@effect/sql-pg"
import * as Arr from "effect/Array"
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as FetchHttpClient from "effect/http/FetchHttpClient"
import * as HttpClient from "effect/http/HttpClient"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import { Cluster } from "ioredis"
import { describeError } from "../../domain/Errors.ts"
import type { RedisStoreName } from "../../domain/Health.ts"
import { standbyVerdict } from "../../domain/Standbys.ts"
import {
  DatabaseSignals,
  HealthSignals,
  HealthStandbys,
  SignalUnreadable,
  type StandbyStatus
} from "../../services/HealthSignals.ts"
import { CiDatabase } from "../postgres/Databases.ts"
import { type RedisClient, RedisStores } from "../redis/Redis.ts"

/** Longer than this and the reading is unknown: the sampler reads once a second. */
export const READ_TIMEOUT = Duration.seconds(2)

const MISSING_PRIVILEGE =
  "needs pg_read_all_stats (GRANT pg_monitor TO <role>): without it other backends' rows are hidden"

const unreadable = (source: string) => (cause: unknown) =>
  cause instanceof SignalUnreadable ? cause : new SignalUnreadable({ source, reason: describeError(cause) })

const bounded = <A, E>(source: string, effect: Effect.Effect<A, E>): Effect.Effect<A, SignalUnreadable> =>
  effect.pipe(
    Effect.timeoutOrElse({
      duration: READ_TIMEOUT,
      orElse: () =>
        Effect.fail(new SignalUnreadable({ source, reason: `no answer within ${Duration.format(READ_TIMEOUT)}` }))
    }),
    Effect.mapError(unreadable(source))
  )

/** `used_memory:123` and `maxmemory:456` from an INFO memory reply. */
export const memoryRatio = (info: string): Option.Option<number> | "no-limit" => {
  const field = (name: string) => {
    const match = new RegExp(`^${name}:(\\d+)\\s*$`, "m").exec(info)
    return match === null ? undefined : Number(match[1])
  }
  const used = field("used_memory")
  const max = field("maxmemory")
  if (used === undefined || max === undefined) return Option.none()
  if (max === 0) return "no-limit"
  return Option.some(used / max)
}

const SidekiqJobTime = Schema.fromJsonString(Schema.Struct({ enqueued_at: Schema.Number }))

/** Sidekiq 8 writes enqueued_at in milliseconds, earlier versions in (fractional) seconds. */
export const enqueuedAtMillis = (enqueuedAt: number): number => enqueuedAt > 1e11 ? enqueuedAt : enqueuedAt * 1000

const PromAnswer = Schema.Struct({
  status: Schema.String,
  error: Schema.optionalKey(Schema.String),
  data: Schema.optionalKey(Schema.Struct({
    resultType: Schema.String,
    result: Schema.Unknown
  }))
})
const Sample = Schema.Tuple([Schema.Number, Schema.String])
const VectorResult = Schema.Array(Schema.Struct({ value: Sample }))

/** One number out of an instant query's answer, or why not. */
export const promNumber = (body: unknown): { ok: number } | { error: string } => {
  const answer = Schema.decodeUnknownOption(PromAnswer)(body)
  if (Option.isNone(answer)) return { error: "not a Prometheus API answer" }
  if (answer.value.status !== "success" || answer.value.data === undefined) {
    return { error: answer.value.error ?? answer.value.status }
  }
  const { resultType, result } = answer.value.data
  let text: string | undefined
  if (resultType === "scalar") {
    text = Option.getOrUndefined(Schema.decodeUnknownOption(Sample)(result))?.[1]
  } else if (resultType === "vector") {
    const series = Option.getOrUndefined(Schema.decodeUnknownOption(VectorResult)(result))
    if (series === undefined) return { error: "unexpected vector shape" }
    const only = series.length === 1 ? series[0] : undefined
    if (only === undefined) {
      return { error: `returned ${series.length} series, expected one (aggregate it, e.g. min(...))` }
    }
    text = only.value[1]
  } else {
    return { error: `returned a ${resultType}, expected one number` }
  }
  const n = text === undefined ? Number.NaN : Number(text)
  return Number.isFinite(n) ? { ok: n } : { error: `returned ${JSON.stringify(text)}, not a number` }
}

const infoMemory = (client: RedisClient): Promise<Array<string>> =>
  client instanceof Cluster
    ? Promise.all(client.nodes("master").map((node) => node.info("memory")))
    : client.info("memory").then((info) => [info])

const JsonText = Schema.fromJsonString(Schema.Unknown)

/** Over any HttpClient (Prometheus' API); HealthSignalsLive brings the fetch-based one. */
export const HealthSignalsWith = Layer.effect(
  HealthSignals,
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const http = yield* HttpClient.HttpClient
    const stores = yield* Effect.serviceOption(RedisStores)

    /** The role may see other backends' statistics (superuser, pg_read_all_stats, pg_monitor). */
    const canReadAll = sql`
      (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
        OR pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')`

    const requireStats = <A extends { can_read: boolean }>(source: string, rows: ReadonlyArray<A>) =>
      rows[0] === undefined || !rows[0].can_read
        ? Effect.fail(new SignalUnreadable({ source, reason: MISSING_PRIVILEGE }))
        : Effect.succeed(rows[0])

    const selection = yield* HealthStandbys

    const standbys = bounded(
      "pg_stat_replication",
      Effect.gen(function*() {
        const rows = yield* sql<{
          can_read: boolean
          present: boolean
          hidden: boolean
          name: string | null
          bytes: number | null
          flush_s: number | null
          replay_s: number | null
        }>`
        SELECT ${canReadAll} AS can_read, r.pid IS NOT NULL AS present, r.state IS NULL AS hidden, r.application_name AS name,
               pg_wal_lsn_diff(pg_current_wal_lsn(), r.replay_lsn)::float8 AS bytes,
               extract(epoch FROM r.flush_lag)::float8 AS flush_s,
               extract(epoch FROM r.replay_lag)::float8 AS replay_s
        FROM (SELECT 1) one
        LEFT JOIN pg_stat_replication r ON NOT EXISTS (
          -- Physical standbys only: a logical walsender (a CDC consumer) always streams from a logical
          -- slot, and how slowly it consumes harms no replica Sweeper's writes would.
          SELECT 1 FROM pg_replication_slots s WHERE s.active_pid = r.pid AND s.slot_type = 'logical'
        )`
        yield* requireStats("pg_stat_replication", rows)
        // Without pg_read_all_stats a standby's row shows its pid only: unreadable, never "no standby".
        if (rows.some((row) => row.present && row.hidden)) {
          return yield* new SignalUnreadable({ source: "pg_stat_replication", reason: MISSING_PRIVILEGE })
        }
        return rows.flatMap((row): Array<StandbyStatus> => {
          if (!row.present) return []
          const standby = {
            name: row.name ?? "",
            bytes: Math.max(0, row.bytes ?? 0),
            flushLagS: row.flush_s,
            replayLagS: row.replay_s
          }
          return [{ ...standby, ...standbyVerdict(standby, selection) }]
        })
      })
    )

    // The watched standbys' worst: a delayed one (or one the operator ignores) is not lag the gate holds on.
    const replicationLag = Effect.map(standbys, (all) => {
      const watched = all.filter((standby) => standby.watched)
      return {
        standbys: watched.length,
        bytes: Math.max(0, ...watched.map((standby) => standby.bytes)),
        seconds: Math.max(0, ...watched.map((standby) => standby.replayLagS ?? 0))
      }
    })

    const walPosition = bounded(
      "pg_current_wal_lsn()",
      Effect.gen(function*() {
        const rows = yield* sql<
          { position: number }
        >`SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8 AS position`
        // One row always; none would be an unreadable position, never a crash of the round.
        return (yield* Effect.fromOption(Arr.head(rows))).position
      })
    )

    const vacuuming = (tables: ReadonlyArray<string>) =>
      bounded(
        "pg_stat_progress_vacuum",
        Effect.gen(function*() {
          if (tables.length === 0) return []
          // A partition's vacuum counts for its partitioned parent (GitLab's p_ci_builds).
          const rows = yield* sql<{ can_read: boolean; tables: ReadonlyArray<string> | null }>`
          SELECT ${canReadAll} AS can_read,
                 array_agg(DISTINCT COALESCE(CASE WHEN p.relname IN ${
            sql.in(tables)
          } THEN p.relname END, c.relname)) AS tables
          FROM pg_stat_progress_vacuum v
          JOIN pg_class c ON c.oid = v.relid
          LEFT JOIN pg_inherits i ON i.inhrelid = c.oid
          LEFT JOIN pg_class p ON p.oid = i.inhparent
          WHERE v.datname = current_database() AND (c.relname IN ${sql.in(tables)} OR p.relname IN ${sql.in(tables)})`
          const row = yield* requireStats("pg_stat_progress_vacuum", rows)
          return row.tables ?? []
        })
      )

    const oldestTransaction = bounded(
      "pg_stat_activity",
      Effect.gen(function*() {
        // clock_timestamp(), not now(): now() is this statement's own transaction start.
        const rows = yield* sql<{ can_read: boolean; seconds: number | null }>`
        SELECT ${canReadAll} AS can_read,
               max(extract(epoch FROM clock_timestamp() - xact_start))::float8 AS seconds
        FROM pg_stat_activity
        WHERE pid <> pg_backend_pid() AND xact_start IS NOT NULL AND backend_type = 'client backend'`
        const row = yield* requireStats("pg_stat_activity", rows)
        return Math.max(0, row.seconds ?? 0)
      })
    )

    const storeOf = (store: RedisStoreName) =>
      Option.flatMap(stores, (all) => Option.fromUndefinedOr(all.find((s) => s.store === store)?.redis))

    const redisMemory = (store: RedisStoreName) => {
      const source = `INFO memory on ${store}`
      return bounded(
        source,
        Effect.gen(function*() {
          const redis = storeOf(store)
          if (Option.isNone(redis)) {
            return yield* new SignalUnreadable({
              source,
              reason: "in-memory Redis (embedded): no memory limit to read"
            })
          }
          const infos = yield* redis.value.use("INFO memory", infoMemory)
          let worst = 0
          for (const info of infos) {
            const ratio = memoryRatio(info)
            if (ratio === "no-limit") {
              return yield* new SignalUnreadable({
                source,
                reason: "maxmemory is 0 (no limit): used/max has no meaning"
              })
            }
            if (Option.isNone(ratio)) {
              return yield* new SignalUnreadable({ source, reason: "no used_memory/maxmemory in the reply" })
            }
            worst = Math.max(worst, ratio.value)
          }
          return worst
        })
      )
    }

    const queueLatency = (queue: string) => {
      const source = `queue:${queue}`
      return bounded(
        source,
        Effect.gen(function*() {
          const redis = storeOf("queues")
          if (Option.isNone(redis)) {
            return yield* new SignalUnreadable({
              source,
              reason: "in-memory Redis (embedded): no Sidekiq queue to read"
            })
          }
          const oldest = yield* redis.value.use(
            `LINDEX queue:${queue}`,
            (client) => client.lindex(`queue:${queue}`, -1)
          )
          if (oldest === null) return 0
          const job = Schema.decodeUnknownOption(SidekiqJobTime)(oldest)
          if (Option.isNone(job)) {
            return yield* new SignalUnreadable({ source, reason: "oldest job has no numeric enqueued_at" })
          }
          const now = yield* Clock.currentTimeMillis
          return Math.max(0, (now - enqueuedAtMillis(job.value.enqueued_at)) / 1000)
        })
      )
    }

    const prometheus = (url: string, query: string) => {
      const source = `Prometheus query ${JSON.stringify(query)}`
      return bounded(
        source,
        Effect.gen(function*() {
          const endpoint = `${url.replace(/\/+$/, "")}/api/v1/query`
          const response = yield* http.get(endpoint, { urlParams: { query } })
          // Prometheus answers a bad query with 400 and a JSON error: the body says why, not the status.
          const text = yield* response.text
          const body = Schema.decodeUnknownOption(JsonText)(text)
          if (Option.isNone(body)) {
            return yield* new SignalUnreadable({ source, reason: `HTTP ${response.status}: ${text.slice(0, 200)}` })
          }
          const parsed = promNumber(body.value)
          return "ok" in parsed ? parsed.ok : yield* new SignalUnreadable({ source, reason: parsed.error })
        })
      )
    }

    const privileges = bounded(
      "pg_roles",
      Effect.gen(function*() {
        const rows = yield* sql<{ role: string; superuser: boolean; read_all: boolean; in_recovery: boolean }>`
        SELECT current_user AS role,
               (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) AS superuser,
               pg_has_role(current_user, 'pg_read_all_stats', 'USAGE') AS read_all,
               pg_is_in_recovery() AS in_recovery`
        const row = yield* Effect.fromOption(Arr.head(rows))
        return {
          role: row.role,
          superuser: row.superuser,
          readAllStats: row.superuser || row.read_all,
          inRecovery: row.in_recovery
        }
      })
    )

    return HealthSignals.of({
      replicationLag,
      standbys,
      walPosition,
      vacuuming,
      oldestTransaction,
      redisMemory,
      queueLatency,
      prometheus,
      privileges
    })
  })
)

export const HealthSignalsLive = HealthSignalsWith.pipe(Layer.provide(FetchHttpClient.layer))

/**
 * With a decomposed GitLab, PostgreSQL's signals on each database: HealthSignals (main's client)
 * for main, a second instance over CiDatabase's client for ci. Not decomposed: nothing, so the gate
 * reads the one database once, as main.
 */
export const DatabaseSignalsLive = Layer.unwrap(Effect.gen(function*() {
  const ci = yield* CiDatabase
  if (!ci.decomposed) return Layer.empty
  return Layer.effect(
    DatabaseSignals,
    Effect.gen(function*() {
      const main = yield* HealthSignals
      // Fresh: the layer is memoized, and its instance in this build is main's.
      const onCi = Layer.fresh(HealthSignalsLive).pipe(Layer.provide(Layer.succeed(PgClient.PgClient, ci.sql)))
      return DatabaseSignals.of({ main, ci: Context.get(yield* Layer.build(onCi), HealthSignals) })
    })
  )
}))
