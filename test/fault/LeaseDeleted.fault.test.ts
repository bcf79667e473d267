/**
 * The exclusive lease deleted under every leased batch mid-run: the old holder
 * notices at its next fence check, writes nothing more, and its run ends `failed` with reason
 * `lease lost` and a LeaseLost event. Where a second runner starts meanwhile (and takes the lease
 * with a newer epoch), the two together still repair each record once (SQL) / at least once (Redis).
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { existsSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { DROP_BATCH_SIZE } from "../../src/domain/Build.ts"
import { PENDING_DIRECT_UPLOADS_KEY } from "../../src/domain/DirectUpload.ts"
import { REBALANCING_QUEUE, RUNNING_REBALANCES_KEY } from "../../src/domain/Rebalancing.ts"
import { queueKey } from "../../src/domain/Sidekiq.ts"
import { Redis } from "../../src/layers/redis/Redis.ts"
import { seedStuckCancelingBuilds } from "../../src/simulator/Fixtures.ts"
import { PgTest, TestDatabaseUrl } from "../support/postgres.ts"
import { RedisTest, TestRedisUrl } from "../support/redis.ts"
import { deleteLease, eventsPerStream, type RunOutput, seedStaleUploads, startRun, untilEvents } from "./support.ts"

const Platform = () => Layer.mergeAll(PgTest, RedisTest)

const env = Effect.gen(function*() {
  return {
    DATABASE_URL: yield* TestDatabaseUrl,
    REDIS_URL: yield* TestRedisUrl,
    SWEEPER_DATA_DIR: join(tmpdir(), "sweeper-fault-data")
  }
})

const lastEventId = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  const rows = yield* sql<{ id: string | null }>`SELECT max(id) AS id FROM sweeper_events`
  return Number(rows[0]!.id ?? 0)
})

/**
 * The old holder's run: failed, reason `lease lost`, one LeaseLost event; and how many repair
 * events of `type` it wrote after the lease was deleted (event id > `deletedAt`).
 */
const oldHolder = (run: RunOutput, type: string, deletedAt: number) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    assert.strictEqual(run.outcome, "failed")
    const finished = yield* sql<{ reason: string | null }>`
      SELECT data->>'reason' AS reason FROM sweeper_events WHERE type = 'RunFinished' AND run_id = ${run.runId}`
    assert.deepStrictEqual(finished.map((r) => r.reason), ["lease lost"])
    const lost = yield* sql<
      { n: string }
    >`SELECT count(*) AS n FROM sweeper_events WHERE type = 'LeaseLost' AND run_id = ${run.runId}`
    assert.strictEqual(Number(lost[0]!.n), 1)
    const after = yield* sql<{ n: string }>`
      SELECT count(*) AS n FROM sweeper_events WHERE type = ${type} AND run_id = ${run.runId} AND id > ${deletedAt}`
    return Number(after[0]!.n)
  })

describe("lease deleted under a running batch", () => {
  it.live(
    "drop-canceling-builds: the old holder stops at its next write; with a second runner each build is dropped once",
    () =>
      Effect.gen(function*() {
        const STUCK = 1000
        const sql = yield* PgClient.PgClient
        yield* seedStuckCancelingBuilds(STUCK)
        const first = startRun("holder-1", "drop-canceling-builds", yield* env)
        yield* untilEvents("BuildDropped", 20)
        yield* deleteLease("ci/stuck_builds/drop_canceling_worker")
        const deletedAt = yield* lastEventId
        const second = startRun("holder-2", "drop-canceling-builds", yield* env)

        const old = yield* first.result
        const afterDelete = yield* oldHolder(old.output, "BuildDropped", deletedAt)
        // The pages whose lease check passed just before the DEL may still commit (two pages are
        // written at once, each of DROP_BATCH_SIZE builds in one statement, so up to 200 events);
        // nothing after them.
        assert.isAtMost(
          afterDelete,
          2 * DROP_BATCH_SIZE,
          "the old holder wrote nothing more than the pages in flight once it noticed"
        )
        const next = yield* second.result
        assert.strictEqual(next.output.outcome, "succeeded", next.log)

        const events = yield* eventsPerStream("BuildDropped")
        assert.strictEqual(events.size, STUCK)
        assert.isTrue([...events.values()].every((n) => n === 1), "exactly one BuildDropped per build")
        const once = yield* sql<
          { n: string }
        >`SELECT count(*) AS n FROM ci_builds WHERE status = 'failed' AND lock_version = 1`
        assert.strictEqual(Number(once[0]!.n), STUCK)
        console.log(
          "[fault] lease deleted: drop-canceling-builds",
          JSON.stringify({ builds: STUCK, oldHolderWritesAfterDelete: afterDelete })
        )
      }).pipe(Effect.provide(Platform())),
    120_000
  )

  it.live(
    "delete-stale-direct-uploads: the old holder stops before its next delete; with a second runner every upload is recorded",
    () =>
      Effect.gen(function*() {
        const STALE = 1000
        const { root } = yield* seedStaleUploads(STALE)
        const redis = yield* Redis
        const runEnv = { ...(yield* env), SWEEPER_OBJECT_STORAGE: JSON.stringify({ artifacts: root }) }

        const first = startRun("holder-1", "delete-stale-direct-uploads", runEnv)
        yield* untilEvents("StaleDirectUploadDeleted", 20)
        yield* deleteLease("sweeper/delete_stale_direct_uploads")
        const deletedAt = yield* lastEventId
        const second = startRun("holder-2", "delete-stale-direct-uploads", runEnv)

        const old = yield* first.result
        const afterDelete = yield* oldHolder(old.output, "StaleDirectUploadDeleted", deletedAt)
        // Repairs go in steps (objects, one event INSERT, one compare-and-delete), the fence checked
        // before each: after the lease went the old holder may finish the step in flight, no other.
        const sql = yield* PgClient.PgClient
        const steps = yield* sql<{ n: string }>`
        SELECT count(DISTINCT occurred_at) AS n FROM sweeper_events
        WHERE type = 'StaleDirectUploadDeleted' AND run_id = ${old.output.runId} AND id > ${deletedAt}`
        assert.isAtMost(
          Number(steps[0]!.n),
          1,
          `the old holder wrote at most the step in flight once the lease was gone (${afterDelete} events)`
        )
        const next = yield* second.result
        assert.strictEqual(next.output.outcome, "succeeded", next.log)

        assert.deepStrictEqual(
          yield* redis.use("test.hgetall", (client) => client.hgetall(PENDING_DIRECT_UPLOADS_KEY)),
          {}
        )
        const events = yield* eventsPerStream("StaleDirectUploadDeleted")
        for (let i = 0; i < STALE; i++) {
          assert.isAtLeast(events.get(`direct_upload:artifacts:u/${i}`) ?? 0, 1, `upload ${i}`)
          assert.isFalse(existsSync(join(root, `u/${i}`)))
        }
        console.log(
          "[fault] lease deleted: delete-stale-direct-uploads",
          JSON.stringify({ uploads: STALE, oldHolderWritesAfterDelete: afterDelete })
        )
      }).pipe(Effect.provide(Platform())),
    120_000
  )

  it.live(
    "reschedule-stuck-issue-rebalances: the old holder pushes nothing more after it notices",
    () =>
      Effect.gen(function*() {
        // Many namespaces, few projects: the namespaces' push (after their events) is the window in
        // which the lease goes; 20 000 of them keep it open for tens of milliseconds even when this
        // process is slow to see their events (under a loaded suite 1000 were pushed, and the
        // projects after them, before the DEL landed).
        const NAMESPACES = 20_000
        const PROJECTS = 1000
        const sql = yield* PgClient.PgClient
        yield* sql`INSERT INTO namespaces (id, name, path, type) SELECT g, 'n' || g, 'n' || g, 'Group' FROM generate_series(1, ${NAMESPACES}) g`
        yield* sql`INSERT INTO projects (id, namespace_id, name, path) SELECT g, 1, 'p' || g, 'p' || g FROM generate_series(1, ${PROJECTS}) g`
        const redis = yield* Redis
        const members = [
          ...Array.from({ length: NAMESPACES }, (_, i) => `1/${i + 1}`),
          ...Array.from({ length: PROJECTS }, (_, i) => `2/${i + 1}`)
        ]
        yield* redis.use("test.sadd", (client) => client.sadd(RUNNING_REBALANCES_KEY, ...members))

        // Namespaces are pushed first, then one event each; the lease goes while those are written.
        const first = startRun("holder-1", "reschedule-stuck-issue-rebalances", yield* env)
        yield* untilEvents("RebalanceRescheduled", 0)
        yield* deleteLease("sweeper/reschedule_stuck_issue_rebalances")
        const old = yield* first.result
        // Its namespace events record a push already made; what must not follow is another push.
        yield* oldHolder(old.output, "RebalanceRescheduled", 0)

        const jobs = yield* redis.use("test.lrange", (client) => client.lrange(queueKey(REBALANCING_QUEUE), 0, -1))
        const args = jobs.map((job) => (JSON.parse(job) as { args: ReadonlyArray<number | null> }).args)
        assert.lengthOf(args, NAMESPACES, "the namespaces' push happened")
        assert.isTrue(
          args.every((a) => a[0] === null && a[1] === null),
          "no project was pushed after the lease was lost"
        )
        const events = yield* eventsPerStream("RebalanceRescheduled")
        assert.isTrue([...events.keys()].every((stream) => stream.startsWith("rebalance:1/")), "no project event")
        console.log(
          "[fault] lease deleted: reschedule-stuck-issue-rebalances",
          JSON.stringify({ containers: NAMESPACES + PROJECTS, pushedBeforeLoss: args.length, events: events.size })
        )
      }).pipe(Effect.provide(Platform())),
    120_000
  )
})
