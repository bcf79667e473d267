/**
 * Bulk fixtures: the same GitLab formats as Seed.ts, written in bulk — one
 * `generate_series` INSERT for rows, pipelined commands for keys — for the benchmarks (bench/) and
 * the end-to-end tests that need thousands of records. Seed.ts writes one record the way GitLab
 * does; these write a million in seconds, so the benchmarks and tests seed GitLab's formats from
 * one place instead of each carrying its own copy of them.
 *
 * Redis goes through a raw client (one server, or the store the key lives in) rather than
 * SimulatorStores: only a pipeline of chunked commands is fast enough at a million entries. Builds
 * go through the ci database's client (Seed.ts's `ciClient`), the rest through main's.
 */
import { PgClient } from "@effect/sql-pg"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import { mkdir, writeFile } from "node:fs/promises"
import { join } from "node:path"
import { workerKeys } from "../domain/ConcurrencyLimit.ts"
import { PENDING_DIRECT_UPLOADS_KEY } from "../domain/DirectUpload.ts"
import { EXPORT_JOB_STATUS_TTL, jobStatusKey } from "../domain/SidekiqStatus.ts"
import type { RedisClient } from "../layers/redis/Redis.ts"
import { ciClient } from "./Seed.ts"

/**
 * `rows` builds in `ci_builds` over the 60 days before `now` − 2 h: finished ones mostly, some
 * running, every `stuckEvery`-th one stuck in `canceling` (no `finished_at`), plus canceling bridges
 * (every 5000th, never a build to drop) and the canceling builds among the last 1000, which are
 * made ten minutes old (younger than the 1 h timeout: not stuck). Ids are 1..rows, the sequence is
 * moved past them. Returns how many builds are stuck (the batch's own criteria at `now`).
 */
export const seedBuildsWithStuckCanceling = Effect.fn("Fixtures.buildsWithStuckCanceling")(function*(options: {
  readonly rows: number
  readonly stuckEvery: number
  readonly now: Date
}) {
  const sql = yield* ciClient
  const { rows, stuckEvery, now } = options
  yield* sql`
    INSERT INTO ci_builds (id, project_id, commit_id, name, type, status, failure_reason, runner_id, lock_version,
      created_at, updated_at, started_at, finished_at)
    SELECT i,
      1 + (i * 7919) % 5000,
      i / 20,
      'job ' || (i % 40),
      CASE WHEN i % 5000 = 1 THEN 'Ci::Bridge' ELSE 'Ci::Build' END,
      CASE
        WHEN i % ${stuckEvery} = 0 THEN 'canceling'
        WHEN i % 5000 = 1 THEN 'canceling'
        WHEN i % 997 = 0 THEN 'running'
        WHEN i % 10 < 7 THEN 'success'
        WHEN i % 10 < 9 THEN 'failed'
        ELSE 'canceled'
      END,
      CASE WHEN i % 10 IN (7, 8) THEN 1 ELSE NULL END,
      CASE WHEN i % 13 = 0 THEN NULL ELSE 1 + i % 300 END,
      i % 3,
      ts, ts + interval '5 minutes', ts + interval '1 minute',
      CASE WHEN i % ${stuckEvery} = 0 OR i % 997 = 0 THEN NULL ELSE ts + interval '5 minutes' END
    FROM (
      SELECT i, ${now}::timestamptz AT TIME ZONE 'UTC' - interval '2 hours' - ((${rows} - i) * (interval '60 days' / ${rows})) AS ts
      FROM generate_series(1::bigint, ${rows}::bigint) AS i
    ) AS s`
  // The newest canceling builds are younger than the timeout: not stuck.
  yield* sql`UPDATE ci_builds SET created_at = ${now}::timestamptz AT TIME ZONE 'UTC' - interval '10 minutes',
    updated_at = ${now}::timestamptz AT TIME ZONE 'UTC' - interval '10 minutes'
    WHERE id > ${rows} - 1000 AND status = 'canceling'`
  yield* sql`SELECT setval(pg_get_serial_sequence('ci_builds', 'id'), ${rows})`
  return yield* countStuckCanceling(now)
})

/** Builds stuck in canceling at `now` (`Ci::Build`, created and updated over an hour ago). */
export const countStuckCanceling = Effect.fn("Fixtures.countStuckCanceling")(function*(now: Date) {
  const sql = yield* ciClient
  const cutoff = new Date(now.getTime() - 3_600_000)
  const rows = yield* sql<{ n: string }>`SELECT count(*) AS n FROM ci_builds
    WHERE status = 'canceling' AND type = 'Ci::Build' AND created_at < ${cutoff}::timestamptz AT TIME ZONE 'UTC'
      AND updated_at < ${cutoff}::timestamptz AT TIME ZONE 'UTC'`
  return Number(rows[0]!.n)
})

/**
 * `count` builds stuck in canceling since 2026-01-01 (a millisecond apart by creation, spread over
 * 50 projects and 5 runners, `lock_version` 0) and nothing else: the end-to-end tests' shape, where
 * every build is to be dropped exactly once.
 */
export const seedStuckCancelingBuilds = Effect.fn("Fixtures.stuckCancelingBuilds")(function*(count: number) {
  const sql = yield* ciClient
  yield* sql`INSERT INTO ci_builds (project_id, status, runner_id, created_at, updated_at)
    SELECT g % 50, 'canceling', g % 5, '2026-01-01 00:00:00'::timestamp + g * interval '1 millisecond', '2026-01-01 00:00:00'
    FROM generate_series(1, ${count}) g`
})

/**
 * `active` export jobs (queued and started alternately, ids 1..active, jid `export-<id>`, a day
 * before `now`) in 100 projects of one namespace, plus as many finished and failed ones; the odd
 * ones still run, so their Sidekiq status key is set. Returns how many completed without
 * finishing (the even ones): the jobs to fail.
 */
export const seedExportJobsWithStatuses = Effect.fn("Fixtures.exportJobsWithStatuses")(
  function*(redis: RedisClient, options: {
    readonly active: number
    readonly now: Date
  }) {
    const sql = yield* PgClient.PgClient
    const { active, now } = options
    yield* sql`INSERT INTO namespaces (id) VALUES (1)`
    yield* sql`INSERT INTO projects (id, namespace_id) SELECT p, 1 FROM generate_series(1, 100) AS p`
    // Plus as many finished and failed jobs, which the batch never reads.
    yield* sql`
    INSERT INTO project_export_jobs (id, project_id, jid, status, created_at, updated_at)
    SELECT i, 1 + i % 100, 'export-' || i, CASE WHEN i <= ${active} THEN i % 2 ELSE 2 + i % 2 END,
      ${now}::timestamptz - interval '1 day', ${now}::timestamptz - interval '1 day'
    FROM generate_series(1, ${active * 2}) AS i`
    const ttl = Duration.toSeconds(EXPORT_JOB_STATUS_TTL)
    for (let start = 1; start <= active; start += PIPELINE_CHUNK) {
      const pipeline = redis.pipeline()
      for (let i = start; i < start + PIPELINE_CHUNK && i <= active; i++) {
        if (i % 2 === 1) pipeline.set(jobStatusKey(`export-${i}`), "1", "EX", ttl)
      }
      yield* Effect.promise(() => pipeline.exec())
    }
    return Math.floor(active / 2)
  }
)

const PIPELINE_CHUNK = 10_000

/**
 * `entries` pending_direct_uploads fields `uploads:tmp/uploads/<i base 36>-x…x` (no object), every
 * `staleEvery`-th one 4 h old (stale), the others 1 h (fresh), spread over ten minutes; one HSET
 * of 10 000 fields per round trip. Ages are from the real clock, as the batch reads it. Returns how
 * many are stale.
 */
export const seedPendingUploadFields = (
  redis: RedisClient,
  options: { readonly entries: number; readonly staleEvery: number }
) =>
  Effect.promise(async () => {
    const now = Math.floor(Date.now() / 1000)
    for (let start = 0; start < options.entries; start += PIPELINE_CHUNK) {
      const fields: Record<string, string> = {}
      for (let i = start; i < start + PIPELINE_CHUNK && i < options.entries; i++) {
        const age = i % options.staleEvery === 0 ? 4 * 3600 : 3600
        fields[`uploads:tmp/uploads/${i.toString(36)}-${"x".repeat(40)}`] = String(now - age - (i % 600))
      }
      await redis.hset(PENDING_DIRECT_UPLOADS_KEY, fields)
    }
    return Math.ceil(options.entries / options.staleEvery)
  })

export interface PendingUploadsAtScale {
  readonly key: string
  readonly entries: number
  /** Every staleEvery-th entry is stale. */
  readonly staleEvery: number
  /** Every invalidEvery-th entry (offset 1) that is not stale has a value that is not a timestamp. */
  readonly invalidEvery: number
  readonly locations: ReadonlyArray<string>
  /** location → object storage root; the first `presentObjects` stale entries get a real (empty) file. */
  readonly roots: Readonly<Record<string, string>>
  readonly presentObjects: number
  readonly fieldsPerHset: number
  readonly hsetsPerPipeline: number
}

export interface PendingUploadsCounts {
  readonly stale: number
  readonly fresh: number
  readonly invalid: number
  readonly present: number
  /** Fields plus values, as raw bytes. */
  readonly bytes: number
}

/**
 * GitLab's `<location>:tmp/uploads/<random hex>` fields in the proportions of a busy instance: every
 * `staleEvery`-th stale (3 h 1 min to ~7 days old), a few values that are not timestamps, the rest
 * fresh (at most 2 h old, so none turns stale during a run); `fieldsPerHset` fields per HSET and
 * `hsetsPerPipeline` HSETs per round trip. The hex is a fixed xorshift sequence, so every call
 * writes the same bytes for the same options.
 */
export const seedPendingUploadsAtScale = async (
  redis: RedisClient,
  options: PendingUploadsAtScale
): Promise<PendingUploadsCounts> => {
  // xorshift32: random-looking hex for the paths without a crypto call per entry.
  let state = 0x9e3779b9
  const hex24 = () => {
    let out = ""
    for (let k = 0; k < 3; k++) {
      state ^= state << 13
      state ^= state >>> 17
      state ^= state << 5
      out += (state >>> 0).toString(16).padStart(8, "0")
    }
    return out
  }
  const nowSeconds = Math.floor(Date.now() / 1000)
  const counts = { stale: 0, fresh: 0, invalid: 0, present: 0, bytes: 0 }
  for (const root of Object.values(options.roots)) await mkdir(join(root, "tmp/uploads"), { recursive: true })

  let i = 0
  while (i < options.entries) {
    const pipeline = redis.pipeline()
    for (let h = 0; h < options.hsetsPerPipeline && i < options.entries; h++) {
      const args: Array<string> = []
      for (let f = 0; f < options.fieldsPerHset && i < options.entries; f++, i++) {
        // The id prefix keeps every field unique.
        const location = options.locations[i % options.locations.length]!
        const path = `tmp/uploads/${i.toString(16).padStart(8, "0")}${hex24()}`
        const kind = i % options.staleEvery === 0 ? "stale" : i % options.invalidEvery === 1 ? "invalid" : "fresh"
        const value = kind === "stale"
          ? String(nowSeconds - 10_860 - (i % 604_800))
          : kind === "invalid"
          ? "not-a-timestamp"
          : String(nowSeconds - (i % 7_200))
        const field = `${location}:${path}`
        counts[kind]++
        counts.bytes += field.length + value.length
        args.push(field, value)
        if (kind === "stale" && counts.present < options.presentObjects && options.roots[location] !== undefined) {
          await writeFile(join(options.roots[location], path), "")
          counts.present++
        }
      }
      pipeline.hset(options.key, ...args)
    }
    const results = await pipeline.exec()
    const failed = results?.find(([error]) => error !== null)
    if (failed !== undefined) throw failed[0]
  }
  return counts
}

const DEFERRED_CHUNK = 1_000

/**
 * `jobs` elements in `worker`'s concurrency-limit deferred list, as GitLab's throttling middleware
 * buffers them (`{args, context, buffered_at}`), buffered over the last ten minutes; RPUSH
 * of 1000 elements, ten per round trip. Returns `jobs`.
 */
export const seedDeferredJobs = (redis: RedisClient, options: { readonly worker: string; readonly jobs: number }) =>
  Effect.promise(async () => {
    const deferred = workerKeys(options.worker).deferred
    const now = Date.now() / 1000
    const element = (i: number) =>
      JSON.stringify({
        args: [i, `gid://gitlab/Release/${i}`],
        context: {
          "meta.user": "root",
          "meta.project": `gitlab-org/project-${i % 100}`,
          "meta.caller_id": "Releases::CreateService"
        },
        buffered_at: now - 600 + i / 1000
      })
    for (let start = 0; start < options.jobs; start += DEFERRED_CHUNK * 10) {
      const pipeline = redis.pipeline()
      for (let chunk = start; chunk < start + DEFERRED_CHUNK * 10 && chunk < options.jobs; chunk += DEFERRED_CHUNK) {
        const values: Array<string> = []
        for (let i = chunk; i < chunk + DEFERRED_CHUNK && i < options.jobs; i++) values.push(element(i))
        pipeline.rpush(deferred, ...values)
      }
      await pipeline.exec()
    }
    return options.jobs
  })
