/**
 * Sweeper's schema. Two sets of migrations, chosen by the schema mode:
 * - both modes: Sweeper's own `sweeper_*` tables (event log, lease fences, ownership record);
 * - standalone only: the platform tables with GitLab's names, types and encodings, for a database
 *   Sweeper owns (embedded default, demos, tests). Each table is created only when absent and
 *   recorded in `sweeper_schema_ownership`; the indexes the batches' scans want are created with
 *   the table (on an empty table that blocks nobody), never added to a table that already existed.
 * In gitlab mode nothing here touches GitLab's tables: `sweeper doctor` recommends the indexes and
 * `sweeper doctor --apply-indexes` builds them concurrently, when the operator asks.
 * Run by `sweeper migrate` (`--plan` lists what is pending), `sweeper start` and `sweeper run`;
 * read-only commands only check that nothing is pending (see App.ts).
 * sweeper_events may hold tens of millions of rows by the time a release adds to it, so what reads
 * or indexes the whole table is an online step (ONLINE_STEPS), never part of a transaction that
 * holds a lock appends need; see migrateWith for when `start` runs those steps and when it refuses.
 */
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Predicate from "effect/Predicate"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import * as Migrator from "effect/sql/Migrator"
import * as SqlClient from "effect/sql/SqlClient"
import { SqlError } from "effect/sql/SqlError"
import type { DatabaseName } from "../../domain/Databases.ts"
import { detectCiSchemaMode, detectSchemaMode, MIGRATIONS_TABLE, type SchemaMode } from "./DatabaseSchema.ts"
import { platformTables } from "./migrations/0001_platform_tables.ts"
import { sweeperTables } from "./migrations/0002_sweeper_tables.ts"
import { ownershipRecord } from "./migrations/0003_schema_ownership.ts"
import { retentionIndexes } from "./migrations/0004_event_retention_indexes.ts"
import { ledgerRollup, numberField, RUN_MERGE } from "./migrations/0005_ledger_rollup.ts"
import { stuckBuildsFamily } from "./migrations/0007_stuck_builds_family.ts"
import { ciOutbox, eventRelay } from "./migrations/0008_event_relay.ts"
import { transitionTables } from "./migrations/0009_transition_tables.ts"
import { outboxKeys, relayKeys } from "./migrations/0010_relay_keys.ts"
import { shadowCandidates } from "./migrations/0011_shadow_candidates.ts"
import { STREAM_BTREE_INDEX, STREAM_HASH_DEFINITION, STREAM_HASH_INDEX } from "./migrations/0012_ledger_stream_hash.ts"
import { jobOutboxBatches } from "./migrations/0013_job_outbox_batches.ts"
import { ownTable, PlatformTablesOf } from "./migrations/Ownership.ts"

const ALL = {
  "0001_platform_tables": platformTables,
  "0002_sweeper_tables": sweeperTables,
  "0003_schema_ownership": ownershipRecord,
  "0004_event_retention_indexes": retentionIndexes,
  "0005_console_rollup": ledgerRollup,
  "0006_ledger_rollup": ledgerRollup,
  "0007_stuck_builds_family": stuckBuildsFamily,
  "0008_event_relay": eventRelay,
  "0009_transition_tables": transitionTables(ownTable),
  "0010_relay_keys": relayKeys,
  "0011_shadow_candidates": shadowCandidates,
  "0013_job_outbox_batches": jobOutboxBatches
} as const

/** A separate ci database's migrations (its own sweeper_migrations): the outbox, and ci's platform tables. */
const CI = {
  "0001_platform_tables": platformTables,
  "0007_stuck_builds_family": stuckBuildsFamily,
  "0008_ci_outbox": ciOutbox,
  "0009_transition_tables": transitionTables(ownTable),
  "0010_outbox_keys": outboxKeys,
  "0013_job_outbox_batches": jobOutboxBatches
} as const

/** Migrations of Sweeper's own platform tables: a gitlab-mode database never gets them. */
const PLATFORM_ONLY: ReadonlySet<string> = new Set(["0001_platform_tables", "0007_stuck_builds_family"])

/** The migrations of a mode: gitlab mode never gets the platform tables. */
export const migrationsFor = (mode: SchemaMode, database: DatabaseName = "main") => {
  const all = database === "main" ? ALL : CI
  return Migrator.fromRecord(
    mode === "gitlab"
      ? Object.fromEntries(Object.entries(all).filter(([name]) => !PLATFORM_ONLY.has(name)))
      : all
  )
}

const runMigrator = Migrator.make({})

/**
 * The heavy half of migrations 4–6, run outside any transaction: each step is idempotent and knows
 * whether it is still pending, so an interrupted run resumes where it stopped. None of them blocks
 * appends: indexes are built CONCURRENTLY (a leftover invalid one from an interrupted build is
 * dropped first), the backfill folds id ranges of BACKFILL_RANGE events per statement.
 */
export interface OnlineStep {
  readonly id: number
  readonly name: string
  readonly pending: Effect.Effect<boolean, SqlError, SqlClient.SqlClient>
  readonly run: Effect.Effect<void, SqlError, SqlClient.SqlClient>
}

/** Events folded per backfill statement: a fraction of a second each, so no run row waits long. */
export const BACKFILL_RANGE = 50_000

const indexState = (name: string) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql<{ valid: boolean }>`SELECT i.indisvalid AS valid FROM pg_index i
      WHERE i.indexrelid = to_regclass(${name})`
    return rows.length === 0 ? "missing" as const : rows[0]!.valid ? "valid" as const : "invalid" as const
  })

const concurrentIndex = (id: number, name: string, definition: string): OnlineStep => ({
  id,
  name: `build ${name} concurrently`,
  pending: Effect.map(indexState(name), (state) => state !== "valid"),
  run: Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    if ((yield* indexState(name)) === "invalid") yield* sql.unsafe(`DROP INDEX CONCURRENTLY IF EXISTS ${name}`)
    yield* sql.unsafe(`CREATE INDEX CONCURRENTLY IF NOT EXISTS ${name} ON sweeper_events ${definition}`)
  })
})

const backfillDone = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const found = yield* sql<{ found: boolean }>`SELECT to_regclass('sweeper_backfills') IS NOT NULL AS found`
  if (found[0]?.found !== true) return false
  const rows = yield* sql<{ done: boolean }>`SELECT through >= target AS done FROM sweeper_backfills
    WHERE name = 'sweeper_runs'`
  return rows[0]?.done === true
})

/**
 * Every run's row from the batch events already in the ledger, in id ranges up to the newest id
 * when the backfill began (later events went through the trigger). Progress is recorded with each
 * range, in the same statement.
 */
const backfillRuns: OnlineStep = {
  id: 6,
  name: "backfill sweeper_runs in id ranges",
  pending: Effect.map(backfillDone, (done) => !done),
  run: Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    yield* sql`INSERT INTO sweeper_backfills (name, through, target)
      SELECT 'sweeper_runs', 0, coalesce(max(id), 0) FROM sweeper_events ON CONFLICT (name) DO NOTHING`
    while (true) {
      const rows = yield* sql<{ through: string; target: string }>`SELECT through, target FROM sweeper_backfills
        WHERE name = 'sweeper_runs'`
      const through = Number(rows[0]!.through)
      const target = Number(rows[0]!.target)
      if (through >= target) return
      const upTo = Math.min(target, through + BACKFILL_RANGE)
      yield* sql.unsafe(
        `WITH folded AS (
        INSERT INTO sweeper_runs AS r (run_id, batch, started_at, finished_at, outcome, duration_ms, dry_run, repaired)
        SELECT run_id,
          max(substr(stream, 7)),
          min(occurred_at) FILTER (WHERE type = 'RunStarted'),
          max(occurred_at) FILTER (WHERE type = 'RunFinished'),
          max(data->>'outcome') FILTER (WHERE type = 'RunFinished'),
          max(${numberField("data", "duration_ms", "type = 'RunFinished'")}),
          bool_or(coalesce(data->'dryRun' = 'true'::jsonb, false)),
          max(${numberField("data", "repaired", "type = 'RunFinished'")})
        FROM sweeper_events
        WHERE id > $1 AND id <= $2 AND run_id IS NOT NULL AND stream LIKE 'batch:%'
          AND type IN ('RunStarted', 'RunFinished')
        GROUP BY run_id
        ON CONFLICT (run_id) DO UPDATE SET ${RUN_MERGE}
        RETURNING 1)
      UPDATE sweeper_backfills SET through = $2 WHERE name = 'sweeper_runs'`,
        [through, upTo]
      )
    }
  })
}

/** An index dropped concurrently: a step that is pending until it is gone. */
const droppedIndex = (id: number, name: string): OnlineStep => ({
  id,
  name: `drop ${name} concurrently`,
  pending: Effect.map(indexState(name), (state) => state !== "missing"),
  run: Effect.flatMap(SqlClient.SqlClient, (sql) => sql.unsafe(`DROP INDEX CONCURRENTLY IF EXISTS ${name}`))
})

export const ONLINE_STEPS: ReadonlyArray<OnlineStep> = [
  concurrentIndex(4, "index_sweeper_events_on_occurred_at", "(occurred_at)"),
  // Partial: only batch streams (a few per run), not the repair streams. Queries must say
  // `stream LIKE 'batch:%'` literally for the planner to use it.
  concurrentIndex(4, "index_sweeper_events_on_batch_streams", "(stream, id) WHERE stream LIKE 'batch:%'"),
  // A run's repairs, paged with a keyset (`run_id = $1 AND id > $after ORDER BY id LIMIT n`): the
  // index on (run_id) alone orders ties by heap position, so paging would sort the whole run.
  concurrentIndex(5, "index_sweeper_events_on_run_id_and_id", "(run_id, id) WHERE run_id IS NOT NULL"),
  backfillRuns,
  // (run_id) alone: (run_id, id) serves every read it served, and one index less on the append path.
  droppedIndex(6, "index_sweeper_events_on_run_id"),
  concurrentIndex(12, STREAM_HASH_INDEX, STREAM_HASH_DEFINITION),
  droppedIndex(12, STREAM_BTREE_INDEX)
]

const stepLabel = (step: OnlineStep) => `${String(step.id).padStart(4, "0")}_${step.name}`

/** The online steps still to run (all of them before the transactional migrations created their tables). */
export const pendingOnlineSteps = Effect.gen(function*() {
  const pending: Array<OnlineStep> = []
  for (const step of ONLINE_STEPS) if (yield* step.pending) pending.push(step)
  return pending
})

/** `<id>_<name>` of every migration of `mode` not applied yet (the Migrator runs ids above the latest). */
export const pendingMigrations = (mode: SchemaMode, database: DatabaseName = "main") =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const all = yield* migrationsFor(mode, database)
    const found = yield* sql<{ found: boolean }>`SELECT to_regclass(${MIGRATIONS_TABLE}) IS NOT NULL AS found`
    const latest = found[0]?.found === true
      ? Number(
        (yield* sql<{ latest: number | null }>`SELECT max(migration_id) AS latest FROM ${sql(MIGRATIONS_TABLE)}`)[0]
          ?.latest ?? 0
      )
      : 0
    return all.filter(([id]) => id > latest).map(([id, name]) => `${String(id).padStart(4, "0")}_${name}`)
  })

/** `migrate --plan`: the transactional migrations pending, then the online steps pending. */
export const pendingPlan = (mode: SchemaMode) =>
  Effect.gen(function*() {
    const light = yield* pendingMigrations(mode)
    const events = yield* SqlClient.SqlClient
    const ledger = yield* events<{ found: boolean }>`SELECT to_regclass('sweeper_events') IS NOT NULL AS found`
    // Before sweeper_events exists every step is pending, and costs nothing.
    const online = ledger[0]?.found === true ? (yield* pendingOnlineSteps).map(stepLabel) : ONLINE_STEPS.map(stepLabel)
    return [...light, ...online.map((step) => `${step} (online)`)]
  })

/**
 * Past this many events the online steps are left to `sweeper migrate`; below it they take a
 * second or two, so `sweeper start` runs them itself (a fresh or small ledger never needs a step).
 */
export const ONLINE_INLINE_MAX_EVENTS = 200_000

/** How long the transactional DDL waits for a lock on a table in use before backing off. */
const LOCK_TIMEOUT = "500ms"
const MIGRATION_LOCK = 7356201

/** Events in sweeper_events, counted up to `cap` + 1 (a bounded read, never the whole table). */
const ledgerSize = (cap: number) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const found = yield* sql<{ found: boolean }>`SELECT to_regclass('sweeper_events') IS NOT NULL AS found`
    if (found[0]?.found !== true) return 0
    const rows = yield* sql<{ n: string }>`SELECT count(*) AS n FROM (SELECT 1 FROM sweeper_events LIMIT ${cap + 1}) s`
    return Number(rows[0]!.n)
  })

export class HeavyMigrationPending extends Schema.TaggedError<HeavyMigrationPending>()("HeavyMigrationPending", {
  events: Schema.Number,
  steps: Schema.Array(Schema.String)
}) {
  override get message() {
    return `sweeper_events holds over ${this.events.toLocaleString("en-US")} events and ${this.steps.length} online ` +
      `migration step(s) are pending (${this.steps.join(", ")}): run \`sweeper migrate\` first ` +
      `(appends and repairs go on while it runs), then start again`
  }
}

/** A lock timeout, as the SqlError itself or as the cause the Migrator wraps it in (MigrationError). */
const isLockTimeout = (error: unknown): boolean =>
  error instanceof SqlError
    ? Predicate.isTagged(error.reason, "LockTimeoutError")
    : Predicate.hasProperty(error, "cause") && error.cause instanceof SqlError && isLockTimeout(error.cause)

/**
 * Runs what is pending of `mode`'s migrations on one connection that holds a session advisory lock
 * throughout, so concurrent processes wait instead of racing DDL, and decide the mode under it.
 * 1. The transactional migrations, with a lock timeout: their DDL on sweeper_events (the trigger
 *    swap) must never sit in the lock queue with every append queued behind it, so it gives up
 *    after LOCK_TIMEOUT, rolls back to its savepoint and tries again a moment later.
 * 2. The online steps, outside any transaction. With `heavy: "refuse"` (`sweeper start`, `run`) a
 *    ledger over ONLINE_INLINE_MAX_EVENTS with steps pending is refused before anything changes:
 *    the steps take minutes there, every replica of a deploy would queue on the lock for them past
 *    its health checks, and one operator-run `sweeper migrate` does them once, with its progress.
 * Returns the migrations and steps applied, as `[id, name]`.
 */
export const migrateWith = (mode: Option.Option<SchemaMode>, options: {
  readonly heavy?: "run" | "refuse"
  /**
   * Which of GitLab's databases this connection is: a separate ci database gets only its own
   * migrations (CI) and has no ledger, so no online steps. Default main.
   */
  readonly database?: DatabaseName
  /** Decomposed: each database gets only the platform tables GitLab keeps there (standalone mode). */
  readonly decomposed?: boolean
} = {}) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    // The "transaction" here only pins one connection (the embedded database has no other): it opens
    // with no BEGIN. The lock is polled for, in autocommit: a process waiting for it inside a
    // statement would hold a snapshot that the holder's CREATE INDEX CONCURRENTLY waits out, a
    // deadlock. The transactional migrations get a BEGIN and COMMIT of their own; the online steps
    // then run on the same connection in autocommit (CREATE INDEX CONCURRENTLY refuses a
    // transaction block), and the client's closing COMMIT or ROLLBACK, with no transaction open,
    // only draws a warning from PostgreSQL.
    return yield* sql.withTransaction(Effect.gen(function*() {
      yield* Effect.repeat(
        Effect.map(
          sql<{ got: boolean }>`SELECT pg_try_advisory_lock(${MIGRATION_LOCK}) AS got`,
          (rows) => rows[0]?.got === true
        ),
        { until: (got) => got, schedule: Schedule.spaced("100 millis") }
      )
      const database = options.database ?? "main"
      const work = Effect.gen(function*() {
        const detected = database === "main" ? yield* detectSchemaMode(mode) : yield* detectCiSchemaMode(mode)
        if (options.heavy === "refuse" && database === "main") {
          const size = yield* ledgerSize(ONLINE_INLINE_MAX_EVENTS)
          if (size > ONLINE_INLINE_MAX_EVENTS) {
            const steps = yield* pendingOnlineSteps
            if (steps.length > 0) {
              return yield* new HeavyMigrationPending({ events: ONLINE_INLINE_MAX_EVENTS, steps: steps.map(stepLabel) })
            }
          }
        }
        yield* sql`BEGIN`
        yield* sql.unsafe(`SET LOCAL lock_timeout = '${LOCK_TIMEOUT}'`)
        // The Migrator runs in a savepoint of this transaction: a lock timeout rolls back to it.
        const applied = yield* Effect.retry(
          runMigrator({ loader: migrationsFor(detected.mode, database), table: MIGRATIONS_TABLE }).pipe(
            Effect.provideService(PlatformTablesOf, options.decomposed === true ? database : "all")
          ),
          {
            while: isLockTimeout,
            schedule: Schedule.min([Schedule.exponential("200 millis"), Schedule.spaced("2 seconds")]),
            times: 30
          }
        )
        yield* sql`COMMIT`
        const online: Array<readonly [number, string]> = []
        for (const step of database === "main" ? yield* pendingOnlineSteps : []) {
          yield* Effect.logInfo(`Migration step: ${stepLabel(step)}`)
          yield* step.run
          online.push([step.id, step.name])
        }
        return [...applied, ...online]
      })
      // An online step on a large ledger takes longer than the statement timeout Sweeper's sessions
      // carry (SWEEPER_PG_STATEMENT_TIMEOUT): none on this connection while it migrates.
      yield* sql`SET statement_timeout = 0`
      return yield* work.pipe(
        Effect.ensuring(Effect.ignore(sql`SELECT pg_advisory_unlock(${MIGRATION_LOCK})`)),
        Effect.ensuring(Effect.ignore(sql`RESET statement_timeout`))
      )
    })).pipe(Effect.provideService(SqlClient.BeginTransaction, "SELECT 1"))
  })

/** Migrates with the mode detected from the database (tests, embedded). */
export const migrate = migrateWith(Option.none())
