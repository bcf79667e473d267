/**
 * `npm run demo -- --decomposed`: GitLab's ci tables in a second embedded database, as a decomposed
 * GitLab keeps them. The dashboard names both databases and which one each batch writes; builds are
 * dropped and exports failed within a minute; after a SIGTERM the two databases on disk hold what
 * GitLab's would: every build in ci (the dropped ones failed) and none in main, the failed exports
 * and every repair event in main. The flag on a configured server needs CI_DATABASE_URL.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { join } from "node:path"
import { ExportJobStatus } from "../../src/domain/ExportJob.ts"
import { runCli } from "../support/cli.ts"
import { startDemo } from "../support/demo.ts"
import { waitFor } from "../support/processes.ts"

const BUILD_BATCHES = ["drop-canceling-builds", "drop-pending-builds", "drop-running-builds", "drop-scheduled-builds"]

/** Rows of one query on an embedded database the demo has left on disk. */
const query = async <A>(pgdata: string, text: string): Promise<ReadonlyArray<A>> => {
  const { PGlite } = await import("@electric-sql/pglite")
  const db = await PGlite.create(pgdata)
  try {
    return (await db.query<A>(text)).rows
  } finally {
    await db.close()
  }
}

/** Build rows by status; none when the database has no builds table. */
const buildsByStatus = async (pgdata: string) => {
  const [found] = await query<{ table: string | null }>(pgdata, "SELECT to_regclass('ci_builds')::text AS table")
  if (found?.table === null || found?.table === undefined) return {}
  const rows = await query<{ status: string; n: number }>(
    pgdata,
    "SELECT status, count(*)::int AS n FROM ci_builds GROUP BY 1"
  )
  return Object.fromEntries(rows.map((row) => [row.status, row.n]))
}

describe("npm run demo -- --decomposed", () => {
  it.live(
    "two embedded databases: builds in ci, exports and events in main, each batch's database on the dashboard",
    () =>
      Effect.promise(async () => {
        const demo = startDemo(["--decomposed"])
        const { dataDir } = demo
        try {
          const url = await waitFor(
            "the dashboard URL",
            async () => /Dashboard: (http:\/\/\S+)/.exec(demo.stdout())?.[1],
            120_000
          )
          assert.include(demo.stdout(), "GitLab decomposed")

          // Each batch's database: the build batches write ci, the others main.
          const views = (await (await fetch(`${url}api/batches`)).json()) as ReadonlyArray<
            { name: string; database: string; decomposed: boolean }
          >
          assert.isAtLeast(views.length, 9)
          for (const view of views) {
            assert.strictEqual(view.database, BUILD_BATCHES.includes(view.name) ? "ci" : "main", view.name)
            assert.isTrue(view.decomposed, view.name)
          }
          const page = await (await fetch(url)).text()
          assert.include(
            page,
            `GitLab decomposed: main: embedded PGlite (${join(dataDir, "pgdata")}), ci: embedded PGlite (${
              join(dataDir, "ci", "pgdata")
            })`
          )
          assert.include(page, `<dd class="database" data-database="ci">ci</dd>`)
          // `sweeper status` from another terminal (through the demo's API) has a DATABASE column.
          const status = await runCli(["status"], { SWEEPER_DATA_DIR: dataDir })
          assert.strictEqual(status.code, 0, status.stderr)
          assert.match(status.stdout, /^BATCH\s+STATE\s+DATABASE\s+SCHEDULE/m)
          assert.match(status.stdout, /^drop-canceling-builds\s+\S+\s+ci\s/m)
          assert.match(status.stdout, /^stuck-export-jobs\s+\S+\s+main\s/m)

          // Both repairs happen: builds dropped (in ci), exports failed (in main).
          await waitFor(
            "a dropped build and a failed export",
            async () => {
              const found = await Promise.all(["BuildDropped", "ExportJobFailed"].map(async (type) => {
                const events = (await (await fetch(`${url}api/events?type=${type}&limit=1`)).json()) as Array<unknown>
                return events.length > 0
              }))
              return found.every(Boolean) || undefined
            },
            90_000,
            500
          )

          const code = await demo.stop()
          assert.strictEqual(code, 0, `${demo.stdout()}\n${demo.stderr().slice(-4000)}`)

          // On disk: every build in ci, some failed by the repairs; none in main.
          const ci = await buildsByStatus(join(dataDir, "ci", "pgdata"))
          assert.isAtLeast(ci.failed ?? 0, 1, JSON.stringify(ci))
          assert.deepStrictEqual(await buildsByStatus(join(dataDir, "pgdata")), {}, "no build in main")
          const main = join(dataDir, "pgdata")
          const [exports] = await query<{ failed: number }>(
            main,
            `SELECT count(*)::int AS failed FROM project_export_jobs WHERE status = ${ExportJobStatus.failed}`
          )
          assert.isAtLeast(exports!.failed, 1)
          const events = await query<{ type: string }>(
            main,
            "SELECT DISTINCT type FROM sweeper_events WHERE type IN ('BuildDropped', 'ExportJobFailed') ORDER BY 1"
          )
          assert.deepStrictEqual(events.map((e) => e.type), ["BuildDropped", "ExportJobFailed"])
        } finally {
          await demo.cleanUp()
        }
      }),
    300_000
  )

  it.effect("on a configured server the flag needs CI_DATABASE_URL: one line, exit 2, nothing started", () =>
    Effect.gen(function*() {
      const result = yield* Effect.promise(() =>
        runCli(["demo", "--decomposed"], {
          DATABASE_URL: "postgres://postgres@127.0.0.1:1/nowhere",
          REDIS_URL: "redis://127.0.0.1:1/0"
        })
      )
      assert.strictEqual(result.code, 2, result.stderr)
      const lines = result.stderr.split("\n").filter((l) => l.startsWith("sweeper:"))
      assert.lengthOf(lines, 1, result.stderr)
      assert.include(lines[0], "CI_DATABASE_URL")
      assert.notInclude(result.stdout, "Dashboard:")
      const help = yield* Effect.promise(() => runCli(["demo", "--help"]))
      assert.include(help.stdout, "--decomposed")
    }))
})
