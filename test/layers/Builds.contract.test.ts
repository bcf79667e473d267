/**
 * One contract for Builds' writes against rows another open transaction holds (a page
 * never waits for them), run on the memory layer and on a real PostgreSQL, where the row is held `FOR UPDATE`
 * by a second connection: a page write skips it at once and says so (`locked`), drops the rest, and
 * leaves it untouched with no event; a single-row drop/doom fails with RowLocked; once the lock is
 * gone the same writes go through.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Context, DateTime, Duration, Effect, Layer, Option } from "effect"
import { type CancelingBuild, cancelingCutoff } from "../../src/domain/Build.ts"
import { RowLocked } from "../../src/domain/Errors.ts"
import { BuildsMemory, MemoryBuilds } from "../../src/layers/memory/BuildsMemory.ts"
import { EventLogMemory } from "../../src/layers/memory/EventLogMemory.ts"
import { BuildsSql } from "../../src/layers/postgres/BuildsSql.ts"
import { EventLogSql } from "../../src/layers/postgres/EventLogSql.ts"
import { Builds } from "../../src/services/Builds.ts"
import { EventLog } from "../../src/services/EventLog.ts"
import { holdLocks, PgTest, TestDatabaseUrl } from "../support/postgres.ts"

const NOW = DateTime.makeUnsafe("2026-01-01T05:00:00Z")
const CUTOFF = cancelingCutoff(NOW)
/** Far longer than any write here takes, far shorter than a wait for the holder would be. */
const NO_WAIT = Duration.seconds(5)

/** The rows behind the service's back: seeding, reading, and holding them as another transaction. */
class Rows extends Context.Service<Rows, {
  /** Stuck canceling builds with these ids (project = id, lock_version 0, created 02:00). */
  seed(ids: ReadonlyArray<number>): Effect.Effect<void>
  statusOf(id: number): Effect.Effect<{ readonly status: string; readonly lockVersion: number }>
  /** Holds the rows as an open transaction would until the returned release runs. */
  hold(ids: ReadonlyArray<number>): Effect.Effect<Effect.Effect<void>>
}>()("test/layers/Builds.contract/Rows") {}

const memory = Layer.effect(
  Rows,
  Effect.gen(function*() {
    const state = yield* MemoryBuilds
    const created = DateTime.makeUnsafe("2026-01-01T02:00:00Z")
    return Rows.of({
      seed: (ids) =>
        Effect.sync(() => {
          for (const id of ids) {
            state.rows.set(id, {
              id,
              projectId: id,
              runnerId: 7,
              type: "Ci::Build",
              status: "canceling",
              failureReason: null,
              lockVersion: 0,
              createdAt: created,
              updatedAt: created,
              finishedAt: null
            })
          }
        }),
      statusOf: (id) =>
        Effect.sync(() => ({ status: state.rows.get(id)!.status, lockVersion: state.rows.get(id)!.lockVersion })),
      hold: (ids) =>
        Effect.sync(() => {
          for (const id of ids) state.locked.add(id)
          return Effect.sync(() => {
            for (const id of ids) state.locked.delete(id)
          })
        })
    })
  })
).pipe(Layer.provideMerge(BuildsMemory), Layer.provideMerge(EventLogMemory))

const postgres = Layer.effect(
  Rows,
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const url = yield* TestDatabaseUrl
    return Rows.of({
      seed: (ids) =>
        Effect.orDie(
          sql`INSERT INTO ci_builds (id, project_id, runner_id, type, status, lock_version, created_at, updated_at)
      SELECT i, i, 7, 'Ci::Build', 'canceling', 0, '2026-01-01 02:00:00', '2026-01-01 02:00:00' FROM unnest(${ids}::bigint[]) AS i`
        ),
      statusOf: (id) =>
        Effect.orDie(Effect.map(
          sql<{ status: string; lock_version: number }>`SELECT status, lock_version FROM ci_builds WHERE id = ${id}`,
          (rows) => ({ status: rows[0]!.status, lockVersion: rows[0]!.lock_version })
        )),
      hold: (ids) =>
        holdLocks((other) => other`SELECT 1 FROM ci_builds WHERE id = ANY(${ids}::bigint[]) FOR UPDATE`).pipe(
          Effect.provideService(TestDatabaseUrl, url)
        )
    })
  })
).pipe(Layer.provideMerge(BuildsSql), Layer.provideMerge(EventLogSql), Layer.provideMerge(PgTest))

const backends: Record<string, Layer.Layer<Rows | Builds | EventLog>> = { memory, postgres: Layer.orDie(postgres) }

const stuckPage = Effect.flatMap(
  Builds,
  (builds) => builds.findStuckCanceling({ cutoff: CUTOFF, after: Option.none(), limit: 100 })
)
const ids = (builds: ReadonlyArray<CancelingBuild>) => builds.map((build) => build.id)
const droppedStreams = Effect.map(
  Effect.flatMap(EventLog, (log) => log.query({ type: "BuildDropped" })),
  (events) => events.map((event) => event.stream)
)
/** Fails the test instead of hanging when a write waits for the holder. */
const noWait = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  effect.pipe(
    Effect.timeoutOrElse({
      duration: NO_WAIT,
      orElse: () => Effect.die(new Error("the write waited for a locked row"))
    })
  )

for (const [name, backend] of Object.entries(backends)) {
  describe(`Builds contract (${name}): rows held by another transaction`, () => {
    it.live("dropMany skips a held row at once, drops the rest, and drops it once the lock is gone", () =>
      Effect.gen(function*() {
        const rows = yield* Rows
        const builds = yield* Builds
        yield* rows.seed([1, 2, 3, 4, 5])
        const page = yield* stuckPage
        assert.deepStrictEqual(ids(page), [1, 2, 3, 4, 5])
        const release = yield* rows.hold([2, 4])
        const first = yield* noWait(builds.dropMany(page, NOW))
        assert.deepStrictEqual(ids(first.dropped), [1, 3, 5])
        assert.deepStrictEqual(ids(first.locked), [2, 4])
        assert.deepStrictEqual(yield* rows.statusOf(2), { status: "canceling", lockVersion: 0 })
        assert.deepStrictEqual(yield* rows.statusOf(4), { status: "canceling", lockVersion: 0 })
        assert.deepStrictEqual(yield* droppedStreams, ["build:1", "build:3", "build:5"])
        // Still held: the next read finds them again and the write skips them again.
        const again = yield* stuckPage
        assert.deepStrictEqual(ids(again), [2, 4])
        assert.deepStrictEqual(ids((yield* noWait(builds.dropMany(again, NOW))).locked), [2, 4])
        yield* release
        const last = yield* noWait(builds.dropMany(yield* stuckPage, NOW))
        assert.deepStrictEqual({ dropped: ids(last.dropped), locked: ids(last.locked) }, {
          dropped: [2, 4],
          locked: []
        })
        assert.deepStrictEqual(yield* droppedStreams, ["build:1", "build:3", "build:5", "build:2", "build:4"])
      }).pipe(Effect.provide(backend)))

    it.live("a held row that also changed is a lost race, not locked", () =>
      Effect.gen(function*() {
        const rows = yield* Rows
        const builds = yield* Builds
        yield* rows.seed([1, 2])
        const page = yield* stuckPage
        // The read is stale for 2 (lock_version 0 read, 1 now), and 2 is held as well.
        const stale = page.map((build) => build.id === 2 ? { ...build, lockVersion: build.lockVersion - 1 } : build)
        const release = yield* rows.hold([2])
        const result = yield* noWait(builds.dropMany(stale, NOW))
        assert.deepStrictEqual({ dropped: ids(result.dropped), locked: ids(result.locked) }, {
          dropped: [1],
          locked: []
        })
        yield* release
      }).pipe(Effect.provide(backend)))

    it.live("drop and doom fail with RowLocked on a held row, nothing written; succeed once it is released", () =>
      Effect.gen(function*() {
        const rows = yield* Rows
        const builds = yield* Builds
        yield* rows.seed([7, 8])
        const [seven, eight] = yield* stuckPage
        const release = yield* rows.hold([7, 8])
        const dropError = yield* noWait(Effect.flip(builds.drop(seven!, NOW)))
        assert.instanceOf(dropError, RowLocked)
        assert.strictEqual(dropError.key, "build:7")
        assert.instanceOf(yield* noWait(Effect.flip(builds.doom(eight!, NOW))), RowLocked)
        assert.deepStrictEqual(yield* rows.statusOf(7), { status: "canceling", lockVersion: 0 })
        assert.deepStrictEqual(yield* rows.statusOf(8), { status: "canceling", lockVersion: 0 })
        assert.deepStrictEqual(yield* droppedStreams, [])
        // A stale read of a held row is a plain lost race (false), as without the lock.
        assert.isFalse(yield* noWait(builds.drop({ ...seven!, lockVersion: 9 }, NOW)))
        yield* release
        assert.isTrue(yield* builds.drop(seven!, NOW))
        assert.isTrue(yield* builds.doom(eight!, NOW))
        assert.deepStrictEqual(yield* rows.statusOf(7), { status: "failed", lockVersion: 1 })
      }).pipe(Effect.provide(backend)))
  })
}
