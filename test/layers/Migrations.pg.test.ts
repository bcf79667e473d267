/**
 * Migrations on a real PostgreSQL: idempotent, the documented tables/columns/types/constraints, and safe
 * when two processes migrate the same fresh database at once (advisory lock).
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it, layer } from "@effect/vitest"
import { Effect, Redacted } from "effect"
import type { SqlClient } from "effect/sql"
import { migrate } from "../../src/layers/postgres/Migrations.ts"
import { layerServer } from "../../src/layers/postgres/Postgres.ts"
import { freshDatabase, PgTest } from "../support/postgres.ts"

interface ColumnRow {
  readonly table_name: string
  readonly column_name: string
  readonly data_type: string
  readonly is_nullable: "YES" | "NO"
  readonly character_maximum_length: number | null
  readonly column_default: string | null
}

/** table → column → [data_type, nullable, max length?]. */
const EXPECTED: Record<string, Record<string, readonly [string, boolean, number?]>> = {
  namespaces: {
    id: ["bigint", false],
    name: ["text", false],
    path: ["text", false],
    type: ["character varying", false],
    parent_id: ["bigint", true],
    created_at: ["timestamp with time zone", false],
    updated_at: ["timestamp with time zone", false]
  },
  projects: {
    id: ["bigint", false],
    namespace_id: ["bigint", false],
    name: ["text", false],
    path: ["text", false],
    created_at: ["timestamp with time zone", false],
    updated_at: ["timestamp with time zone", false]
  },
  issues: {
    id: ["bigint", false],
    project_id: ["bigint", false],
    title: ["text", false],
    relative_position: ["integer", true],
    created_at: ["timestamp with time zone", false],
    updated_at: ["timestamp with time zone", false]
  },
  project_export_jobs: {
    id: ["bigint", false],
    project_id: ["bigint", false],
    jid: ["character varying", false, 100],
    status: ["smallint", false],
    user_id: ["bigint", true],
    exported_by_admin: ["boolean", true],
    created_at: ["timestamp with time zone", false],
    updated_at: ["timestamp with time zone", false]
  },
  project_relation_exports: {
    id: ["bigint", false],
    project_export_job_id: ["bigint", false],
    project_id: ["bigint", true],
    relation: ["text", false],
    status: ["smallint", false],
    jid: ["text", true],
    export_error: ["text", true],
    created_at: ["timestamp with time zone", false],
    updated_at: ["timestamp with time zone", false]
  },
  ci_builds: {
    id: ["bigint", false],
    project_id: ["bigint", false],
    commit_id: ["bigint", true],
    name: ["character varying", true],
    type: ["character varying", true],
    status: ["character varying", false],
    failure_reason: ["integer", true],
    runner_id: ["bigint", true],
    lock_version: ["integer", false],
    created_at: ["timestamp without time zone", false],
    updated_at: ["timestamp without time zone", false],
    started_at: ["timestamp without time zone", true],
    finished_at: ["timestamp without time zone", true]
  },
  sweeper_events: {
    id: ["bigint", false],
    stream: ["text", false],
    type: ["text", false],
    data: ["jsonb", false],
    run_id: ["uuid", true],
    occurred_at: ["timestamp with time zone", false]
  }
}

const columns = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  return yield* sql<
    ColumnRow
  >`SELECT table_name, column_name, data_type, is_nullable, character_maximum_length, column_default
    FROM information_schema.columns WHERE table_schema = 'public' ORDER BY table_name, ordinal_position`
})

const constraints = (table: string, type: "UNIQUE" | "FOREIGN KEY" | "PRIMARY KEY") =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const rows = yield* sql<{ name: string; column_name: string }>`
      SELECT tc.constraint_name AS name, kcu.column_name
      FROM information_schema.table_constraints tc
      JOIN information_schema.key_column_usage kcu
        ON kcu.constraint_name = tc.constraint_name AND kcu.table_name = tc.table_name
      WHERE tc.table_schema = 'public' AND tc.table_name = ${table} AND tc.constraint_type = ${type}
      ORDER BY tc.constraint_name, kcu.ordinal_position`
    const grouped = new Map<string, Array<string>>()
    for (const row of rows) grouped.set(row.name, [...(grouped.get(row.name) ?? []), row.column_name])
    return [...grouped.values()].map((cols) => cols.join(","))
  })

const deleteRule = (table: string, column: string) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const rows = yield* sql<{ delete_rule: string; target: string }>`
      SELECT rc.delete_rule, ccu.table_name AS target
      FROM information_schema.referential_constraints rc
      JOIN information_schema.key_column_usage kcu ON kcu.constraint_name = rc.constraint_name
      JOIN information_schema.constraint_column_usage ccu ON ccu.constraint_name = rc.constraint_name
      WHERE kcu.table_name = ${table} AND kcu.column_name = ${column}`
    return rows[0]
  })

describe("Migrations on PostgreSQL", () => {
  // One migrated database for the schema checks (they only read, apart from a few hand-made rows).
  layer(PgTest, { excludeTestServices: true })("on a migrated database", (it) => {
    it.effect("migrating an up-to-date database again is a no-op", () =>
      Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        const before = yield* columns
        const applied = yield* migrate
        assert.deepStrictEqual(applied, [])
        assert.deepStrictEqual(yield* migrate, [])
        const recorded = yield* sql<
          { migration_id: number; name: string }
        >`SELECT migration_id, name FROM sweeper_migrations ORDER BY migration_id`
        assert.deepStrictEqual(recorded.map((r) => [Number(r.migration_id), r.name]), [
          [1, "platform_tables"],
          [2, "sweeper_tables"],
          [3, "schema_ownership"],
          [4, "event_retention_indexes"],
          [5, "console_rollup"],
          [6, "ledger_rollup"],
          [7, "stuck_builds_family"],
          [8, "event_relay"],
          [9, "transition_tables"],
          [10, "relay_keys"],
          [11, "shadow_candidates"],
          [13, "job_outbox_batches"]
        ])
        assert.deepStrictEqual(yield* columns, before)
      }))

    it.effect("every Sweeper table has its columns with GitLab's types and nullability", () =>
      Effect.gen(function*() {
        const rows = yield* columns
        for (const [table, expected] of Object.entries(EXPECTED)) {
          for (const [column, [type, nullable, length]] of Object.entries(expected)) {
            const row = rows.find((r) => r.table_name === table && r.column_name === column)
            assert.isDefined(row, `${table}.${column} exists`)
            assert.strictEqual(row!.data_type, type, `${table}.${column} type`)
            assert.strictEqual(row!.is_nullable === "YES", nullable, `${table}.${column} nullable`)
            if (length !== undefined) {
              assert.strictEqual(Number(row!.character_maximum_length), length, `${table}.${column} length`)
            }
          }
        }
        const col = (table: string, column: string) =>
          rows.find((r) => r.table_name === table && r.column_name === column)!
        // Defaults GitLab relies on, and now() for timestamps so rows can be inserted by hand.
        assert.include(col("ci_builds", "type").column_default ?? "", "'Ci::Build'")
        assert.strictEqual(col("ci_builds", "lock_version").column_default, "0")
        assert.include(col("namespaces", "type").column_default ?? "", "'Group'")
        assert.strictEqual(col("project_export_jobs", "status").column_default, "0")
        assert.strictEqual(col("project_export_jobs", "exported_by_admin").column_default, "false")
        for (const table of Object.keys(EXPECTED)) {
          assert.include(col(table, "id").column_default ?? "", "nextval(", `${table}.id is bigserial`)
        }
        for (
          const [table, column] of [["ci_builds", "created_at"], ["ci_builds", "updated_at"], [
            "sweeper_events",
            "occurred_at"
          ], ["projects", "created_at"]] as const
        ) {
          assert.include(col(table, column).column_default ?? "", "now()", `${table}.${column} defaults to now()`)
        }
        assert.isTrue(
          rows.some((r) =>
            r.table_name === "sweeper_lease_fences" && r.column_name === "epoch" && r.data_type === "bigint"
          )
        )
      }))

    it.effect("keys and references: jid unique, (job, relation) unique, cascades, primary keys", () =>
      Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        assert.deepStrictEqual(yield* constraints("project_export_jobs", "UNIQUE"), ["jid"])
        assert.deepStrictEqual(yield* constraints("project_relation_exports", "UNIQUE"), [
          "project_export_job_id,relation"
        ])
        for (const table of Object.keys(EXPECTED)) {
          assert.deepStrictEqual(yield* constraints(table, "PRIMARY KEY"), ["id"], table)
        }
        assert.deepStrictEqual(yield* deleteRule("project_export_jobs", "project_id"), {
          delete_rule: "CASCADE",
          target: "projects"
        })
        assert.deepStrictEqual(yield* deleteRule("project_relation_exports", "project_export_job_id"), {
          delete_rule: "CASCADE",
          target: "project_export_jobs"
        })
        assert.strictEqual((yield* deleteRule("projects", "namespace_id"))?.target, "namespaces")
        assert.strictEqual((yield* deleteRule("issues", "project_id"))?.target, "projects")

        // Rows can be inserted by hand with explicit ids; the unique jid holds; cascades run.
        yield* sql`INSERT INTO namespaces (id, name, path) VALUES (1, 'g', 'g')`
        yield* sql`INSERT INTO projects (id, namespace_id) VALUES (5, 1)`
        yield* sql`INSERT INTO project_export_jobs (id, project_id, jid) VALUES (9, 5, 'abc')`
        yield* sql`INSERT INTO project_relation_exports (project_export_job_id, relation) VALUES (9, 'issues')`
        const duplicate = yield* sql`INSERT INTO project_export_jobs (project_id, jid) VALUES (5, 'abc')`.pipe(
          Effect.flip
        )
        assert.strictEqual(duplicate._tag, "SqlError")
        yield* sql`DELETE FROM projects WHERE id = 5`
        const left = yield* sql<
          { n: string }
        >`SELECT (SELECT count(*) FROM project_export_jobs) + (SELECT count(*) FROM project_relation_exports) AS n`
        assert.strictEqual(Number(left[0]!.n), 0)
        // The drop-canceling walk's partial index exists with its predicate.
        const index = yield* sql<{ indexdef: string }>`SELECT indexdef FROM pg_indexes
          WHERE indexname = 'index_ci_builds_canceling_on_created_at_project_id_id'`
        assert.lengthOf(index, 1)
        assert.include(index[0]!.indexdef, "(created_at, project_id, id)")
        assert.include(index[0]!.indexdef, "'canceling'")
      }))

    // Each repair appends a ledger row into every index of sweeper_events: the long, random stream
    // texts of repair streams go into a hash index, not a (stream, id) B-tree (migration 0012).
    it.effect("the ledger's indexes: stream by hash, a batch's stream through the partial B-tree in id order", () =>
      Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        const indexes = yield* sql<{ indexname: string; indexdef: string }>`SELECT indexname, indexdef
          FROM pg_indexes WHERE tablename = 'sweeper_events' ORDER BY indexname`
        assert.deepStrictEqual(
          indexes.map((i) => i.indexdef.replace(/^.* ON public\.sweeper_events /, "")),
          [
            "USING btree (stream, id) WHERE (stream ~~ 'batch:%'::text)",
            "USING btree (occurred_at)",
            "USING btree (run_id, id) WHERE (run_id IS NOT NULL)",
            "USING hash (stream)",
            "USING btree (type, occurred_at)",
            "USING btree (id)"
          ]
        )
        // EventLogSql's query for a batch's newest events, as it writes it for a `batch:` stream.
        const plan = yield* sql.withTransaction(Effect.gen(function*() {
          yield* sql`SET LOCAL enable_seqscan = off`
          return yield* sql<
            { "QUERY PLAN": string }
          >`EXPLAIN SELECT id, stream, type, data, run_id, occurred_at FROM sweeper_events
            WHERE stream = ${"batch:drop-canceling-builds"} AND stream LIKE 'batch:%' ORDER BY id DESC LIMIT 10`
        }))
        const text = plan.map((row) => row["QUERY PLAN"]).join("\n")
        assert.include(text, "Scan Backward using index_sweeper_events_on_batch_streams", text)
        assert.notInclude(text, "Sort", text)
      }))
  })

  it.live("two clients migrating the same fresh database at once both succeed (advisory lock)", () =>
    Effect.gen(function*() {
      for (let round = 0; round < 2; round++) {
        yield* Effect.scoped(Effect.gen(function*() {
          const { url } = yield* freshDatabase
          const onFresh = <A, E>(effect: Effect.Effect<A, E, PgClient.PgClient | SqlClient.SqlClient>) =>
            Effect.provide(effect, layerServer(Redacted.make(url)))
          // Each process starts using the schema as soon as its migrate returns: it must be there.
          const client = onFresh(Effect.gen(function*() {
            const applied = yield* migrate
            const sql = yield* PgClient.PgClient
            const ready = yield* sql<{ n: string }>`SELECT count(*) AS n FROM information_schema.tables
              WHERE table_schema = 'public' AND table_name IN ('ci_builds', 'sweeper_events', 'sweeper_lease_fences')`
            return { applied: applied.map(([id]) => Number(id)), ready: Number(ready[0]!.n) }
          }))
          const results = yield* Effect.all([client, client], { concurrency: "unbounded" })
          assert.deepStrictEqual(results.map((r) => r.applied).sort((a, b) => b.length - a.length), [
            // The transactional migrations, then the online steps (indexes, backfill, index drop).
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 4, 4, 5, 6, 6, 12, 12],
            []
          ])
          assert.deepStrictEqual(results.map((r) => r.ready), [3, 3])
          const check = yield* onFresh(Effect.gen(function*() {
            const sql = yield* PgClient.PgClient
            const recorded = yield* sql<{ n: string }>`SELECT count(*) AS n FROM sweeper_migrations`
            const tables = yield* sql<{ table_name: string }>`SELECT table_name FROM information_schema.tables
              WHERE table_schema = 'public' ORDER BY table_name`
            return { recorded: Number(recorded[0]!.n), tables: tables.map((t) => t.table_name) }
          }))
          assert.strictEqual(check.recorded, 12)
          for (const table of [...Object.keys(EXPECTED), "sweeper_lease_fences"]) assert.include(check.tables, table)
        }))
      }
    }))
})
