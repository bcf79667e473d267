/**
 * Shadow mode against the simulated GitLab's own workers (real PostgreSQL, the embedded Redis):
 * drop-canceling-builds and stuck-export-jobs run in shadow beside GitLab's DropCancelingWorker and
 * StuckExportJobsWorker as the simulator plays them. GitLab's canceling loop drops the builds ahead
 * of one whose drop it is refused every time and never gets past that one (https://gitlab.com/gitlab-org/gitlab/-/issues/590004), so
 * the report has the builds GitLab dropped as matched and the refused one and those behind it as
 * sweeperOnly; the export GitLab failed is matched, the one still running is not proposed at all.
 * The other shadow batches beside the rest of GitLab's played workers (StuckCiJobsWorker's drops,
 * DeleteStaleDirectUploadsWorker, RescheduleStuckIssueRebalancesWorker, ConcurrencyLimit::ResumeWorker):
 * each repair GitLab makes the way Sweeper proposed is matched.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, layer } from "@effect/vitest"
import { Duration, Effect, Layer } from "effect"
import { SweeperConfig, TuningFromConfig } from "../../src/config/Config.ts"
import type { Batch } from "../../src/domain/Batch.ts"
import { workerKeys } from "../../src/domain/ConcurrencyLimit.ts"
import { PENDING_DIRECT_UPLOADS_KEY } from "../../src/domain/DirectUpload.ts"
import { RebalanceContainer } from "../../src/domain/Rebalancing.ts"
import { ObjectStorageMemory } from "../../src/layers/memory/ObjectStorageMemory.ts"
import { MainDatabaseLive, SingleDatabase } from "../../src/layers/postgres/Databases.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { ConcurrencyLimitResume } from "../../src/programs/ConcurrencyLimitResume.ts"
import { DeleteStaleDirectUploads } from "../../src/programs/DeleteStaleDirectUploads.ts"
import { DropCancelingBuilds } from "../../src/programs/DropCancelingBuilds.ts"
import { DropRunningBuilds } from "../../src/programs/DropRunningBuilds.ts"
import { RescheduleStuckIssueRebalances } from "../../src/programs/RescheduleStuckIssueRebalances.ts"
import { StuckExportJobs } from "../../src/programs/StuckExportJobs.ts"
import { ShadowLedger } from "../../src/services/ShadowLedger.ts"
import {
  gitlabConcurrencyLimitResume,
  gitlabDeleteStaleDirectUploads,
  gitlabDropCanceling,
  gitlabRescheduleStuckIssueRebalances,
  gitlabStuckCiJobs,
  gitlabStuckExportJobs,
  RefusedDrops
} from "../../src/simulator/GitLabWorkers.ts"
import {
  AGES,
  buildsTable,
  deferJob,
  killExportJob,
  seedBuild,
  seedExportJob,
  seedProject,
  stallRebalance
} from "../../src/simulator/Seed.ts"
import { SimulatorStores, SimulatorStoresLive } from "../../src/simulator/Stores.ts"
import { MemoryBackends, RepairSteps, ShadowLayers, SqlBackends } from "../../src/supervisor/App.ts"
import { runBatch } from "../../src/supervisor/RunGuard.ts"
import { PgTest } from "../support/postgres.ts"

const Platform = Layer.mergeAll(ShadowLayers, RepairSteps, SimulatorStoresLive).pipe(
  Layer.provideMerge(Layer.mergeAll(SqlBackends, ObjectStorageMemory(), TuningFromConfig)),
  Layer.provideMerge(MemoryBackends),
  Layer.provideMerge(MetricsPrometheus),
  Layer.provideMerge(Layer.mergeAll(SingleDatabase, MainDatabaseLive)),
  Layer.provideMerge(SweeperConfig.layerWith({})),
  Layer.provideMerge(PgTest)
)

const shadow = <S, E, R>(batch: Batch<S, E, R>): Batch<S, E, R> => ({ ...batch, mode: "shadow" })

/** A tick of both batches in shadow mode. */
const shadowRuns = Effect.gen(function*() {
  for (
    const run of [
      yield* runBatch(shadow(DropCancelingBuilds), { trigger: "manual" }),
      yield* runBatch(shadow(StuckExportJobs), { trigger: "manual" })
    ]
  ) assert.strictEqual(run.outcome, "succeeded", run.error)
})

layer(Platform, { excludeTestServices: true, timeout: 60_000 })("shadow beside the simulated GitLab", (it) => {
  it.effect("GitLab's canceling loop stuck behind a refused drop: matched and sweeperOnly; exports matched", () =>
    Effect.gen(function*() {
      const sql = yield* PgClient.PgClient
      const now = Date.now()
      const home = yield* seedProject("shadow-sim")
      const table = yield* buildsTable()
      const canceling = () =>
        seedBuild({
          projectId: home.projectId,
          status: "canceling",
          nowMillis: now,
          ageMillis: Duration.toMillis(AGES.stuckBuild),
          table
        })
      const builds = [yield* canceling(), yield* canceling(), yield* canceling(), yield* canceling()]
      const refused = builds[1]!
      const dead = yield* seedExportJob({ projectId: home.projectId, createdAtMillis: now - 60_000 })
      yield* killExportJob(dead)
      const running = yield* seedExportJob({ projectId: home.projectId, createdAtMillis: now - 60_000 })

      // Sweeper proposes first (its tick), writing nothing of GitLab's.
      yield* shadowRuns
      const stillCanceling = yield* sql<{ n: string }>`SELECT count(*) AS n FROM ${
        sql(table)
      } WHERE status = 'canceling'`
      assert.strictEqual(Number(stillCanceling[0]!.n), 4, "the shadow run dropped nothing")

      // GitLab's own workers take their turn.
      const dropped = yield* gitlabDropCanceling(Date.now()).pipe(
        Effect.provideService(RefusedDrops, new Set([refused]))
      )
      assert.deepStrictEqual(dropped, [builds[0]], "GitLab's loop never gets past the refused build")
      assert.deepStrictEqual(yield* gitlabStuckExportJobs(Date.now()), [dead.id])

      // GitLab's window has passed (what an hour and a quarter would do), and Sweeper's next tick judges.
      yield* sql`UPDATE sweeper_shadow_candidates SET due_at = now() - interval '1 second' WHERE verdict IS NULL`
      yield* shadowRuns

      const [drops, exports] = yield* (yield* ShadowLedger).report({
        since: new Date(now - 3_600_000),
        batches: ["drop-canceling-builds", "stuck-export-jobs"]
      })
      assert.include(drops, { matched: 1, mismatched: 0, sweeperOnly: 3, gitlabOnly: 0, ignored: 0 })
      assert.deepStrictEqual(
        drops!.samples.map((s) => s.entity).sort(),
        builds.slice(1).map((id) => `build:${id}`).sort(),
        "the refused build and the two behind it"
      )
      assert.include(exports, { matched: 1, sweeperOnly: 0, gitlabOnly: 0 })
      const [job] = yield* sql<{ status: number }>`SELECT status FROM project_export_jobs WHERE id = ${running.id}`
      assert.strictEqual(job!.status, 1, "the running export is left alone by both")
    }))

  it.effect("the other played workers repair what Sweeper proposed the same way: matched for each batch", () =>
    Effect.gen(function*() {
      const sql = yield* PgClient.PgClient
      const stores = yield* SimulatorStores
      const now = Date.now()
      yield* sql`TRUNCATE sweeper_shadow_candidates`
      const home = yield* seedProject("shadow-sim-others")
      const table = yield* buildsTable()
      yield* seedBuild({
        projectId: home.projectId,
        status: "running",
        nowMillis: now,
        ageMillis: Duration.toMillis(AGES.stuckBuild),
        table
      })
      const preparedAt = Math.floor((now - Duration.toMillis(AGES.staleUpload)) / 1000)
      yield* stores.hset("sharedState", PENDING_DIRECT_UPLOADS_KEY, { "uploads:tmp/shadow-sim": String(preparedAt) })
      yield* stallRebalance(RebalanceContainer.project, home.projectId)
      const worker = "Releases::CreateEvidenceWorker"
      yield* stores.set("queuesMetadata", workerKeys(worker).currentLimit, "2")
      for (const i of [1, 2, 3]) yield* deferJob(worker, [i], now + i)
      const batches = [
        DropRunningBuilds,
        DeleteStaleDirectUploads,
        RescheduleStuckIssueRebalances,
        ConcurrencyLimitResume
      ]
      const shadowTick = Effect.gen(function*() {
        for (
          const run of [
            yield* runBatch(shadow(DropRunningBuilds), { trigger: "manual" }),
            yield* runBatch(shadow(DeleteStaleDirectUploads), { trigger: "manual" }),
            yield* runBatch(shadow(RescheduleStuckIssueRebalances), { trigger: "manual" }),
            yield* runBatch(shadow(ConcurrencyLimitResume), { trigger: "manual" })
          ]
        ) assert.strictEqual(run.outcome, "succeeded", run.error)
      })

      yield* shadowTick
      // GitLab's own workers take their turn.
      assert.lengthOf(yield* gitlabStuckCiJobs(Date.now()), 1)
      assert.strictEqual(yield* gitlabDeleteStaleDirectUploads(Date.now()), 1)
      assert.strictEqual(yield* gitlabRescheduleStuckIssueRebalances(), 1)
      assert.strictEqual(
        yield* gitlabConcurrencyLimitResume({ [worker]: { limit: 2, queue: "default" } }, Date.now()),
        2
      )
      yield* sql`UPDATE sweeper_shadow_candidates SET due_at = now() - interval '1 second' WHERE verdict IS NULL`
      yield* shadowTick

      const reports = yield* (yield* ShadowLedger).report({
        since: new Date(now - 3_600_000),
        batches: batches.map((batch) => batch.name)
      })
      for (const report of reports) {
        assert.include(report, { matched: 1, mismatched: 0, sweeperOnly: 0, gitlabOnly: 0 }, report.batch)
      }
      assert.lengthOf(reports, 4)
    }))
})
