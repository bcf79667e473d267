/**
 * BuildsSql on a real PostgreSQL: the canceling walk's filters and keyset order, the optimistic-lock
 * guard, what a drop/doom writes (row and event, one transaction), fencing, and the query plan.
 * Every test gets a fresh migrated database. Timestamps are `timestamp without time zone` in UTC.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, layer } from "@effect/vitest"
import { DateTime, Duration, Effect, Fiber, Layer, Option, Schedule } from "effect"
import { randomUUID } from "node:crypto"
import { CurrentRun, type Fence } from "../../src/domain/Batch.ts"
import { type BuildCursor, type CancelingBuild, cancelingCutoff, cursorOf } from "../../src/domain/Build.ts"
import { describeError, LeaseLost } from "../../src/domain/Errors.ts"
import { BuildsSql, revisitWrittenQuery, stuckCancelingQuery } from "../../src/layers/postgres/BuildsSql.ts"
import { EventLogSql } from "../../src/layers/postgres/EventLogSql.ts"
import { FENCE_LOCK_TIMEOUT, fenceWrite } from "../../src/layers/postgres/Fencing.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { DropCancelingBuilds } from "../../src/programs/DropCancelingBuilds.ts"
import { Builds } from "../../src/services/Builds.ts"
import { EventLog } from "../../src/services/EventLog.ts"
import { at } from "../support/clock.ts"
import { holdLocks, PgTest } from "../support/postgres.ts"

const Sql = Layer.mergeAll(BuildsSql, MetricsPrometheus).pipe(
  Layer.provideMerge(EventLogSql),
  Layer.provideMerge(PgTest)
)

const NOW = DateTime.makeUnsafe("2026-01-01T05:00:00Z")
const CUTOFF = cancelingCutoff(NOW) // 04:00:00

interface Seed {
  readonly id: number
  readonly projectId?: number
  readonly runnerId?: number | null
  readonly type?: string
  readonly status?: string
  readonly lockVersion?: number
  /** UTC wall time, e.g. "2026-01-01 03:00:00". */
  readonly createdAt?: string
  readonly updatedAt?: string
}

/** Seeds in one transaction (one commit, however many rows). */
const seed = (...rows: ReadonlyArray<Seed>) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    yield* sql.withTransaction(Effect.forEach(
      rows,
      (row) =>
        sql`INSERT INTO ci_builds (id, project_id, runner_id, type, status, lock_version, created_at, updated_at)
        VALUES (${row.id}, ${row.projectId ?? 1}, ${row.runnerId === undefined ? 7 : row.runnerId}, ${
          row.type ?? "Ci::Build"
        },
          ${row.status ?? "canceling"}, ${row.lockVersion ?? 0},
          ${row.createdAt ?? "2026-01-01 02:00:00"}::timestamp, ${row.updatedAt ?? "2026-01-01 02:00:00"}::timestamp)`,
      { discard: true }
    ))
  })

interface RawRow {
  readonly id: string
  readonly status: string
  readonly failure_reason: number | null
  readonly lock_version: number
  readonly finished_at: string | null
  readonly updated_at: string
}

/** The row as text in UTC wall time, independent of any driver decoding. */
const rowOf = (id: number) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const rows = yield* sql<RawRow>`SELECT id::text AS id, status, failure_reason, lock_version,
      to_char(finished_at, 'YYYY-MM-DD HH24:MI:SS.US') AS finished_at,
      to_char(updated_at, 'YYYY-MM-DD HH24:MI:SS.US') AS updated_at
      FROM ci_builds WHERE id = ${id}`
    return rows[0]!
  })

const allEvents = Effect.flatMap(EventLog, (log) => log.query({}))

const findAll = (limit: number) =>
  Effect.gen(function*() {
    const builds = yield* Builds
    const pages: Array<ReadonlyArray<CancelingBuild>> = []
    let after = Option.none<BuildCursor>()
    while (true) {
      const page = yield* builds.findStuckCanceling({ cutoff: CUTOFF, after, limit })
      pages.push(page)
      if (pages.length > 1_000) assert.fail("the keyset walk does not advance")
      if (page.length < limit) return pages
      after = Option.some(cursorOf(page[page.length - 1]!))
    }
  })

const findBuild = (id: number) => Effect.flatMap(Builds, (b) => Effect.map(b.find({ id }), Option.getOrThrow))

const LEASE = "ci/stuck_builds/drop_canceling_worker"

/** The lease's fence row as a holder's committed write at `epoch` leaves it. */
const recordFence = (epoch: number) =>
  Effect.flatMap(
    PgClient.PgClient,
    (sql) => sql`INSERT INTO sweeper_lease_fences (name, epoch) VALUES (${LEASE}, ${epoch})`
  )

const withFence = (epoch: number, check: Fence["check"] = Effect.void) => <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.provideService(effect, CurrentRun, {
    runId: randomUUID(),
    batch: "drop-canceling-builds",
    dryRun: false,
    budget: Option.none(),
    fence: Option.some({ lease: LEASE, epoch, check })
  })

/** One migrated database for the file; every test starts from empty tables. */
const reset = Effect.flatMap(
  PgClient.PgClient,
  (sql) => sql`TRUNCATE ci_builds, sweeper_events, sweeper_lease_fences RESTART IDENTITY`
)

layer(Sql, { excludeTestServices: true })("BuildsSql on PostgreSQL", (it) => {
  it.effect("findStuckCanceling: canceling Ci::Build with both timestamps strictly older than the cutoff", () =>
    Effect.gen(function*() {
      yield* reset
      yield* seed(
        { id: 1 }, // stuck
        { id: 2, type: "Ci::Bridge" },
        { id: 3, status: "running" },
        { id: 4, status: "canceled" },
        { id: 5, updatedAt: "2026-01-01 04:30:00" }, // touched recently
        { id: 6, createdAt: "2026-01-01 04:10:00", updatedAt: "2026-01-01 03:00:00" },
        { id: 7, createdAt: "2026-01-01 04:00:00", updatedAt: "2026-01-01 04:00:00" }, // exactly at the cutoff
        { id: 8, createdAt: "2026-01-01 03:59:59.999", updatedAt: "2026-01-01 03:59:59.999" }, // 1 ms older
        { id: 9, createdAt: "2026-01-01 04:00:00", updatedAt: "2026-01-01 03:00:00" },
        {
          id: 10,
          createdAt: "2025-06-01 00:00:00",
          updatedAt: "2025-06-01 00:00:00",
          runnerId: null,
          projectId: 99,
          lockVersion: 4
        }
      )
      const builds = yield* Builds
      const found = yield* builds.findStuckCanceling({ cutoff: CUTOFF, after: Option.none(), limit: 100 })
      assert.deepStrictEqual(found.map((b) => b.id), [10, 1, 8])
      const oldest = found[0]!
      assert.strictEqual(oldest.projectId, 99)
      assert.isNull(oldest.runnerId)
      assert.strictEqual(oldest.lockVersion, 4)
      assert.strictEqual(oldest.status, "canceling")
      // timestamp without time zone is read as UTC wall time.
      assert.strictEqual(DateTime.formatIso(oldest.createdAt), "2025-06-01T00:00:00.000Z")
      assert.strictEqual(DateTime.formatIso(found[2]!.updatedAt), "2026-01-01T03:59:59.999Z")
      assert.strictEqual(found[1]!.runnerId, 7)
    }))

  it.effect("keyset pages in (created_at, project_id, id) order, ties on created_at across pages, no duplicates", () =>
    Effect.gen(function*() {
      yield* reset
      // 250 rows on 3 created_at values with many (created_at, project_id) ties; ids shuffled.
      const times = ["2026-01-01 01:00:00", "2026-01-01 02:00:00", "2026-01-01 03:00:00"]
      const rows = Array.from({ length: 250 }, (_, i) => ({
        id: ((i * 7919) % 250) + 1,
        projectId: (i * 31) % 5,
        createdAt: times[i % 3]!,
        updatedAt: "2026-01-01 03:30:00"
      }))
      yield* seed(...rows)
      const pages = yield* findAll(100)
      assert.deepStrictEqual(pages.map((p) => p.length), [100, 100, 50])
      const seen = pages.flat()
      assert.strictEqual(new Set(seen.map((b) => b.id)).size, 250)
      const expected = [...rows].sort((a, b) =>
        a.createdAt.localeCompare(b.createdAt) || a.projectId - b.projectId || a.id - b.id
      )
      assert.deepStrictEqual(seen.map((b) => b.id), expected.map((r) => r.id))
      // The page boundaries fall inside a run of equal created_at values.
      assert.strictEqual(DateTime.formatIso(pages[0]!.at(-1)!.createdAt), DateTime.formatIso(pages[1]![0]!.createdAt))

      // Small pages with many ties exercise every boundary.
      const small = yield* findAll(7)
      assert.deepStrictEqual(small.flat().map((b) => b.id), expected.map((r) => r.id))
    }))

  it.effect("keyset over GitLab's microsecond timestamps: the cursor is exact, so a page never repeats", () =>
    Effect.gen(function*() {
      yield* reset
      // Rails writes microseconds; JavaScript Dates hold milliseconds. 30 builds inside one millisecond.
      const rows = Array.from({ length: 30 }, (_, i) => ({
        id: 100 + i,
        projectId: i % 4,
        createdAt: `2026-01-01 01:00:00.123${String(999 - i * 7).padStart(3, "0")}`,
        updatedAt: "2026-01-01 01:00:00.5"
      }))
      yield* seed(...rows)
      const expected = [...rows].sort((a, b) =>
        a.createdAt.localeCompare(b.createdAt) || a.projectId - b.projectId || a.id - b.id
      )
      for (const limit of [1, 7, 100]) {
        const seen = (yield* findAll(limit)).flat().map((b) => b.id)
        assert.deepStrictEqual(seen, expected.map((r) => r.id), `pages of ${limit}`)
      }
      // The dry run of the program walks the same way: every build once.
      const summary = yield* DropCancelingBuilds.run.pipe(
        at(DateTime.formatIso(NOW)),
        Effect.provideService(CurrentRun, {
          runId: null,
          batch: null,
          dryRun: true,
          budget: Option.none(),
          fence: Option.none()
        })
      )
      assert.deepStrictEqual(summary, { dropped: 30, doomed: 0, batches: 1, skippedLocked: 0, heldMs: 0, heldBy: [] })
    }))

  it.effect("drop writes failed / 3, finished_at and updated_at = now, lock_version + 1, and a BuildDropped event", () =>
    Effect.gen(function*() {
      yield* reset
      yield* seed({ id: 1, projectId: 12, runnerId: 34, lockVersion: 5 }, { id: 2 })
      const builds = yield* Builds
      const build = yield* findBuild(1)
      const runId = randomUUID()
      const ok = yield* builds.drop(build, DateTime.makeUnsafe("2026-01-01T05:00:01.250Z")).pipe(
        Effect.provideService(CurrentRun, {
          runId,
          batch: "b",
          dryRun: false,
          budget: Option.none(),
          fence: Option.none()
        })
      )
      assert.isTrue(ok)
      assert.deepStrictEqual(yield* rowOf(1), {
        id: "1",
        status: "failed",
        failure_reason: 3,
        lock_version: 6,
        finished_at: "2026-01-01 05:00:01.250000",
        updated_at: "2026-01-01 05:00:01.250000"
      })
      assert.strictEqual((yield* rowOf(2)).status, "canceling")
      const events = yield* allEvents
      assert.deepStrictEqual(events.map((e) => [e.stream, e.type, e.data, e.runId]), [
        ["build:1", "BuildDropped", { id: 1, project_id: 12, runner_id: 34, failure_reason: 3 }, runId]
      ])
      // A second drop of the same (now stale) read finds nothing to do.
      assert.isFalse(yield* builds.drop(build, NOW))
      assert.lengthOf(yield* allEvents, 1)
    }))

  it.effect("drop guard: a lock_version mismatch or a changed status → false, nothing written", () =>
    Effect.gen(function*() {
      yield* reset
      yield* seed({ id: 1, lockVersion: 2 }, { id: 2 })
      const sql = yield* PgClient.PgClient
      const builds = yield* Builds
      const read1 = yield* findBuild(1)
      const read2 = yield* findBuild(2)
      // A concurrent writer bumps row 1's lock_version and finishes row 2.
      yield* sql`UPDATE ci_builds SET lock_version = lock_version + 1 WHERE id = 1`
      yield* sql`UPDATE ci_builds SET status = 'canceled' WHERE id = 2`
      const before1 = yield* rowOf(1)
      const before2 = yield* rowOf(2)
      assert.isFalse(yield* builds.drop(read1, NOW))
      assert.isFalse(yield* builds.drop(read2, NOW))
      assert.deepStrictEqual(yield* rowOf(1), before1)
      assert.deepStrictEqual(yield* rowOf(2), before2)
      assert.strictEqual(before1.lock_version, 3)
      assert.lengthOf(yield* allEvents, 0)
      // Re-read, then it drops.
      assert.isTrue(yield* builds.drop(yield* findBuild(1), NOW))
      assert.strictEqual((yield* rowOf(1)).lock_version, 4)
    }))

  it.effect("the row change and its event are one transaction: a failing event insert leaves the row untouched", () =>
    Effect.gen(function*() {
      yield* reset
      yield* seed({ id: 1 })
      const sql = yield* PgClient.PgClient
      const builds = yield* Builds
      yield* Effect.acquireRelease(
        sql`ALTER TABLE sweeper_events ADD CONSTRAINT reject_drops CHECK (type <> 'BuildDropped')`,
        () => Effect.orDie(sql`ALTER TABLE sweeper_events DROP CONSTRAINT reject_drops`)
      )
      const before = yield* rowOf(1)
      const error = yield* builds.drop(yield* findBuild(1), NOW).pipe(Effect.flip)
      assert.strictEqual(error._tag, "SqlError")
      assert.deepStrictEqual(yield* rowOf(1), before)
      assert.strictEqual(before.status, "canceling")
    }))

  it.effect(
    "a fence row another connection holds: the page and a single drop fail with a lock timeout after FENCE_LOCK_TIMEOUT, nothing written",
    () =>
      Effect.gen(function*() {
        yield* reset
        yield* seed({ id: 1 }, { id: 2 })
        const builds = yield* Builds
        yield* recordFence(1)
        const page = (yield* findAll(10))[0]!
        // As a holder whose process stopped in the middle of its own fenced transaction would.
        const release = yield* holdLocks((other) => other`SELECT 1 FROM sweeper_lease_fences FOR UPDATE`)
        const limit = Duration.toMillis(FENCE_LOCK_TIMEOUT)
        const writes: ReadonlyArray<Effect.Effect<unknown, unknown>> = [
          builds.dropMany(page, NOW),
          builds.drop(page[0]!, NOW)
        ]
        for (const write of writes) {
          const started = Date.now()
          const error = yield* write.pipe(withFence(2), Effect.flip, Effect.timeout(Duration.millis(limit * 3)))
          const waited = Date.now() - started
          assert.isAtLeast(waited, limit - 100)
          assert.isBelow(waited, limit * 2)
          assert.match(describeError(error), /lock timeout/)
        }
        yield* release
        assert.deepStrictEqual((yield* rowOf(1)).status, "canceling")
        assert.lengthOf(yield* allEvents, 0)
        // The holder gone, the same page goes through.
        assert.lengthOf((yield* builds.dropMany(page, NOW).pipe(withFence(2))).dropped, 2)
      }),
    { timeout: 60_000 }
  )

  it.effect(
    "the same epoch's writes share the fence row: a page goes through while another write of that epoch is still open",
    () =>
      Effect.gen(function*() {
        yield* reset
        yield* seed({ id: 1 }, { id: 2 })
        const builds = yield* Builds
        const page = (yield* findAll(10))[0]!
        // The run's first write committed its epoch; another of its pages is still being written.
        yield* recordFence(2)
        const release = yield* holdLocks((other) => fenceWrite(other).pipe(withFence(2)))
        const started = Date.now()
        const dropped = yield* builds.dropMany(page, NOW).pipe(withFence(2), Effect.ensuring(release))
        assert.lengthOf(dropped.dropped, 2)
        assert.isBelow(Date.now() - started, Duration.toMillis(FENCE_LOCK_TIMEOUT) / 2)
      }),
    { timeout: 60_000 }
  )

  it.effect(
    "a newer epoch waits for the older epoch's open write, then takes the fence; the older epoch is refused after",
    () =>
      Effect.gen(function*() {
        yield* reset
        yield* seed({ id: 1 }, { id: 2 })
        const builds = yield* Builds
        yield* recordFence(2)
        const release = yield* holdLocks((other) => fenceWrite(other).pipe(withFence(2)))
        const newer = yield* builds.drop(yield* findBuild(1), NOW).pipe(withFence(3), Effect.forkChild)
        yield* Effect.sleep(Duration.millis(500))
        const waiting = newer.pollUnsafe() === undefined
        yield* release
        assert.isTrue(waiting, "the newer epoch's write waits for the open one")
        assert.isTrue(yield* Fiber.join(newer))
        const lost = yield* builds.drop(yield* findBuild(2), NOW).pipe(withFence(2), Effect.flip)
        assert.strictEqual(lost._tag, "LeaseLost")
        assert.strictEqual((yield* rowOf(2)).status, "canceling")
      }),
    { timeout: 60_000 }
  )

  it.effect("dropMany: one transaction for the page; rows changed since the read (lock_version, status) stay untouched", () =>
    Effect.gen(function*() {
      yield* reset
      yield* seed(
        { id: 1, projectId: 11, lockVersion: 4 },
        { id: 2, projectId: 12, lockVersion: 1 },
        { id: 3, projectId: 13, runnerId: null },
        { id: 4, projectId: 14 },
        { id: 5, projectId: 15, lockVersion: 7 }
      )
      const sql = yield* PgClient.PgClient
      const builds = yield* Builds
      const page = (yield* findAll(10))[0]!
      assert.deepStrictEqual(page.map((b) => b.id), [1, 2, 3, 4, 5])
      // Concurrent writers between our read and our write: 2's lock_version moves, 4 finishes.
      yield* sql`UPDATE ci_builds SET lock_version = lock_version + 1 WHERE id = 2`
      yield* sql`UPDATE ci_builds SET status = 'canceled' WHERE id = 4`
      const before2 = yield* rowOf(2)
      const before4 = yield* rowOf(4)
      const runId = randomUUID()
      const dropped = yield* builds.dropMany(page, DateTime.makeUnsafe("2026-01-01T05:00:01.250Z")).pipe(
        Effect.provideService(CurrentRun, {
          runId,
          batch: "drop-canceling-builds",
          dryRun: false,
          budget: Option.none(),
          fence: Option.some({ lease: "ci/stuck_builds/drop_canceling_worker", epoch: 1, check: Effect.void })
        })
      )
      // The builds as given, in page order; the two that changed lost a race, none was locked.
      assert.deepStrictEqual(dropped, { dropped: [page[0]!, page[2]!, page[4]!], locked: [] })
      for (const [id, lockVersion] of [[1, 5], [3, 1], [5, 8]] as const) {
        assert.deepStrictEqual(yield* rowOf(id), {
          id: String(id),
          status: "failed",
          failure_reason: 3,
          lock_version: lockVersion,
          finished_at: "2026-01-01 05:00:01.250000",
          updated_at: "2026-01-01 05:00:01.250000"
        })
      }
      assert.deepStrictEqual(yield* rowOf(2), before2)
      assert.deepStrictEqual(yield* rowOf(4), before4)
      const events = yield* allEvents
      assert.deepStrictEqual(events.map((e) => [e.stream, e.type, e.data, e.runId]), [
        ["build:1", "BuildDropped", { id: 1, project_id: 11, runner_id: 7, failure_reason: 3 }, runId],
        ["build:3", "BuildDropped", { id: 3, project_id: 13, runner_id: null, failure_reason: 3 }, runId],
        ["build:5", "BuildDropped", { id: 5, project_id: 15, runner_id: 7, failure_reason: 3 }, runId]
      ])
      // One transaction: the three rows, their events and the fence carry the same xmin.
      const xids = yield* sql<{ xid: string }>`
        SELECT xmin::text AS xid FROM ci_builds WHERE id IN (1, 3, 5)
        UNION SELECT xmin::text FROM sweeper_events UNION SELECT xmin::text FROM sweeper_lease_fences`
      assert.lengthOf(xids, 1)
      // A stale epoch: LeaseLost, nothing of the page written.
      yield* sql`UPDATE sweeper_lease_fences SET epoch = 9`
      const again = (yield* findAll(10))[0]!
      assert.deepStrictEqual(again.map((b) => b.id), [2])
      const lost = yield* builds.dropMany(again, NOW).pipe(withFence(1), Effect.flip)
      assert.instanceOf(lost, LeaseLost)
      assert.deepStrictEqual(yield* rowOf(2), before2)
      assert.lengthOf(yield* allEvents, 3)
      // An empty page writes nothing, not even the fence.
      assert.deepStrictEqual(yield* builds.dropMany([], NOW).pipe(withFence(1)), { dropped: [], locked: [] })
    }))

  it.effect("dropMany: the page's events and rows are one transaction (a failing event insert leaves every row untouched)", () =>
    Effect.gen(function*() {
      yield* reset
      yield* seed({ id: 1 }, { id: 2 })
      const sql = yield* PgClient.PgClient
      const builds = yield* Builds
      yield* Effect.acquireRelease(
        sql`ALTER TABLE sweeper_events ADD CONSTRAINT reject_drops CHECK (type <> 'BuildDropped')`,
        () => Effect.orDie(sql`ALTER TABLE sweeper_events DROP CONSTRAINT reject_drops`)
      )
      const page = (yield* findAll(10))[0]!
      const error = yield* builds.dropMany(page, NOW).pipe(Effect.flip)
      assert.strictEqual(error._tag, "SqlError")
      assert.strictEqual((yield* rowOf(1)).status, "canceling")
      assert.strictEqual((yield* rowOf(2)).status, "canceling")
    }))

  it.effect("doom writes failed / 12 guarded by status only, with a BuildDoomed event", () =>
    Effect.gen(function*() {
      yield* reset
      yield* seed({ id: 1, runnerId: null, projectId: 3 }, { id: 2 })
      const sql = yield* PgClient.PgClient
      const builds = yield* Builds
      const read = yield* findBuild(1)
      yield* sql`UPDATE ci_builds SET lock_version = 9 WHERE id = 1`
      assert.isTrue(yield* builds.doom(read, DateTime.makeUnsafe("2026-01-01T05:00:00Z")))
      assert.deepStrictEqual(yield* rowOf(1), {
        id: "1",
        status: "failed",
        failure_reason: 12,
        lock_version: 10,
        finished_at: "2026-01-01 05:00:00.000000",
        updated_at: "2026-01-01 05:00:00.000000"
      })
      const read2 = yield* findBuild(2)
      yield* sql`UPDATE ci_builds SET status = 'success' WHERE id = 2`
      assert.isFalse(yield* builds.doom(read2, NOW))
      assert.strictEqual((yield* rowOf(2)).status, "success")
      const events = yield* allEvents
      assert.deepStrictEqual(events.map((e) => [e.stream, e.type, e.data]), [
        ["build:1", "BuildDoomed", { id: 1, project_id: 3, runner_id: null, failure_reason: 12 }]
      ])
    }))

  it.effect("fencing: epoch 2 writes and is recorded; a later write with epoch 1 fails with LeaseLost and writes nothing", () =>
    Effect.gen(function*() {
      yield* reset
      yield* seed({ id: 1 }, { id: 2 }, { id: 3 })
      const sql = yield* PgClient.PgClient
      const builds = yield* Builds
      const fences = sql<{ name: string; epoch: string }>`SELECT name, epoch FROM sweeper_lease_fences`

      assert.isTrue(yield* builds.drop(yield* findBuild(1), NOW).pipe(withFence(2)))
      assert.deepStrictEqual((yield* fences).map((f) => [f.name, Number(f.epoch)]), [[
        "ci/stuck_builds/drop_canceling_worker",
        2
      ]])

      const before = yield* rowOf(2)
      const eventsBefore = yield* allEvents
      const lost = yield* builds.drop(yield* findBuild(2), NOW).pipe(withFence(1), Effect.flip)
      assert.instanceOf(lost, LeaseLost)
      assert.deepStrictEqual({ lease: (lost as LeaseLost).lease, epoch: (lost as LeaseLost).epoch }, {
        lease: "ci/stuck_builds/drop_canceling_worker",
        epoch: 1
      })
      assert.deepStrictEqual(yield* rowOf(2), before)
      assert.deepStrictEqual(yield* allEvents, eventsBefore)
      const doomLost = yield* builds.doom(yield* findBuild(2), NOW).pipe(withFence(1), Effect.flip)
      assert.instanceOf(doomLost, LeaseLost)
      assert.deepStrictEqual(yield* rowOf(2), before)
      assert.deepStrictEqual((yield* fences).map((f) => Number(f.epoch)), [2])

      // The same epoch keeps writing; a newer one takes over the fence.
      assert.isTrue(yield* builds.drop(yield* findBuild(2), NOW).pipe(withFence(2)))
      assert.isTrue(yield* builds.drop(yield* findBuild(3), NOW).pipe(withFence(3)))
      assert.deepStrictEqual((yield* fences).map((f) => Number(f.epoch)), [3])
      assert.lengthOf(yield* allEvents, 3)
    }))

  it.effect("fencing: a failing lease check stops the write before anything is written", () =>
    Effect.gen(function*() {
      yield* reset
      yield* seed({ id: 1 })
      const sql = yield* PgClient.PgClient
      const builds = yield* Builds
      const check = Effect.fail(new LeaseLost({ lease: "ci/stuck_builds/drop_canceling_worker", epoch: 5 }))
      const before = yield* rowOf(1)
      const lost = yield* builds.drop(yield* findBuild(1), NOW).pipe(withFence(5, check), Effect.flip)
      assert.instanceOf(lost, LeaseLost)
      assert.deepStrictEqual(yield* rowOf(1), before)
      assert.lengthOf(yield* allEvents, 0)
      assert.lengthOf(yield* sql`SELECT * FROM sweeper_lease_fences`, 0)
    }))

  it.effect("EXPLAIN: the canceling page query uses index_ci_builds_canceling_on_created_at_project_id_id", () =>
    Effect.gen(function*() {
      yield* reset
      const sql = yield* PgClient.PgClient
      yield* sql`INSERT INTO ci_builds (project_id, status, type, created_at, updated_at)
        SELECT i % 50, CASE WHEN i % 20 = 0 THEN 'canceling' ELSE 'success' END, 'Ci::Build',
          '2026-01-01 00:00:00'::timestamp + (i || ' seconds')::interval, '2026-01-01 00:00:00'::timestamp
        FROM generate_series(1, 5000) AS i`
      yield* sql`ANALYZE ci_builds`
      const explain = (after: Option.Option<BuildCursor>) =>
        sql.withTransaction(Effect.gen(function*() {
          yield* sql`SET LOCAL enable_seqscan = off`
          const rows = yield* sql<{ "QUERY PLAN": string }>`EXPLAIN ${
            stuckCancelingQuery(sql, { cutoff: CUTOFF, after, limit: 100 })
          }`
          return rows.map((r) => r["QUERY PLAN"]).join("\n")
        }))
      const first = yield* explain(Option.none())
      assert.include(first, "index_ci_builds_canceling_on_created_at_project_id_id")
      assert.notInclude(first, "Sort")
      // A later page, with the cursor as the walk builds it (exact created_at) and without.
      for (const createdAtExact of ["2026-01-01 00:10:00.000000", undefined]) {
        const next = yield* explain(
          Option.some({ createdAt: DateTime.makeUnsafe("2026-01-01T00:10:00Z"), projectId: 3, id: 600, createdAtExact })
        )
        assert.include(next, "index_ci_builds_canceling_on_created_at_project_id_id")
        assert.notInclude(next, "Sort")
      }
      // And the plan's rows are what findStuckCanceling returns.
      const page = yield* Effect.flatMap(
        Builds,
        (b) => b.findStuckCanceling({ cutoff: CUTOFF, after: Option.none(), limit: 100 })
      )
      assert.lengthOf(page, 100)
    }))

  it.effect(
    "revisitWritten: the page query's index scan from `after`; afterwards a scan skips the dead rows it walked past",
    () =>
      Effect.gen(function*() {
        yield* reset
        const sql = yield* PgClient.PgClient
        const builds = yield* Builds
        // An index entry is marked dead only once its row is dead to every snapshot in the database:
        // keep autovacuum's ANALYZE (which holds a snapshot) away from this table meanwhile.
        yield* Effect.acquireRelease(
          sql`ALTER TABLE ci_builds SET (autovacuum_enabled = false)`,
          () => Effect.orDie(sql`ALTER TABLE ci_builds RESET (autovacuum_enabled)`)
        )
        // created_at a permutation of id: consecutive index entries point into different heap pages,
        // so every dead row the scan fetches shows as a buffer access (a scan keeps the page it is on).
        yield* sql`INSERT INTO ci_builds (id, project_id, status, type, created_at, updated_at)
        SELECT i, i % 50, 'canceling', 'Ci::Build', '2026-01-01 00:00:00'::timestamp + ((i * 7919 % 4000) || ' seconds')::interval,
          '2026-01-01 00:00:00'::timestamp
        FROM generate_series(0, 3999) AS i`
        yield* sql`ANALYZE ci_builds`
        const [pageA, pageB] = yield* findAll(2000)
        const fromStart = { cutoff: CUTOFF, after: Option.none<BuildCursor>() }
        /** Buffers the walk from the start touches; it must be the index scan that marks entries dead. */
        const probe = Effect.gen(function*() {
          const rows = yield* sql<{ "QUERY PLAN": ReadonlyArray<{ readonly Plan: Record<string, unknown> }> }>`
          EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ${revisitWrittenQuery(sql, fromStart)}`
          const plan = JSON.stringify(rows[0]!["QUERY PLAN"])
          assert.include(plan, `"Node Type":"Index Scan"`)
          assert.include(plan, "index_ci_builds_canceling_on_created_at_project_id_id")
          assert.notInclude(plan, "Bitmap")
          const root = rows[0]!["QUERY PLAN"][0]!.Plan
          return Number(root["Shared Hit Blocks"] ?? 0) + Number(root["Shared Read Blocks"] ?? 0)
        })
        // A snapshot held by any other backend in this database (an autovacuum ANALYZE of another
        // table, under a loaded suite) keeps A's rows visible to it, and then no walk can mark them:
        // wait, at most 20 s, until no other backend here holds one, so the test measures the walk.
        const noOtherSnapshot = sql<{ n: string }>`SELECT count(*) AS n FROM pg_stat_activity
        WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_xmin IS NOT NULL`.pipe(
          Effect.flatMap(([row]) => Number(row!.n) === 0 ? Effect.void : Effect.fail("snapshot held")),
          Effect.retry({ schedule: Schedule.spaced("100 millis"), times: 200 })
        )
        // A transaction still running anywhere in the cluster (another database's, under a loaded
        // suite) that began before A's commit makes every backend's snapshot count A's xid as possibly
        // running, so no walk may mark A's rows either: wait, at most 40 s, until every transaction
        // that had begun when A committed has ended.
        const allBegunEnded = (next: string) =>
          sql<{ done: boolean }>`SELECT pg_snapshot_xmin(pg_current_snapshot()) >= ${next}::xid8 AS done`.pipe(
            Effect.flatMap(([row]) => row!.done ? Effect.void : Effect.fail("older transaction running")),
            Effect.retry({ schedule: Schedule.spaced("100 millis"), times: 400 })
          )
        // A written, then walked past (the walk stops at B's first row, still stuck); then B written.
        yield* builds.dropMany(pageA!, NOW)
        const [afterA] = yield* sql<{ next: string }>`SELECT pg_snapshot_xmax(pg_current_snapshot())::text AS next`
        yield* Effect.orDie(allBegunEnded(afterA!.next))
        yield* Effect.orDie(noOtherSnapshot)
        yield* builds.revisitWritten(fromStart)
        yield* builds.dropMany(pageB!, NOW)
        // The same wait for B: the first scan can only mark B's rows dead once no transaction that
        // began before B's commit is running anywhere (a suite running beside this one holds some).
        const [afterB] = yield* sql<{ next: string }>`SELECT pg_snapshot_xmax(pg_current_snapshot())::text AS next`
        yield* Effect.orDie(allBegunEnded(afterB!.next))
        yield* Effect.orDie(noOtherSnapshot)
        // The first scan from the start fetches B's 2000 dead rows but not A's (marked dead by the
        // walk); the second fetches neither.
        const first = yield* probe
        const second = yield* probe
        assert.isAbove(first, 1500, JSON.stringify({ first }))
        assert.isBelow(first, 3000, JSON.stringify({ first }))
        assert.isBelow(second, 300, JSON.stringify({ second }))
        // Nothing is returned or changed: every build of both pages stays failed, once.
        const counts = yield* sql<
          { n: string }
        >`SELECT count(*) AS n FROM ci_builds WHERE status = 'failed' AND lock_version = 1`
        assert.strictEqual(Number(counts[0]!.n), 4000)
      }),
    120_000
  )
})
