/**
 * Which database each batch writes, as the operator sees it: on a decomposed GitLab the build
 * batches write ci and the rest main (the batch views, `/api/batches`, the cards), the overview and
 * the start-up log name both databases; with one database every batch writes main and nothing
 * extra is drawn.
 */
import { assert, describe, it } from "@effect/vitest"
import { Cron, Option, Redacted } from "effect"
import { emptyHistory } from "../../src/domain/BatchState.ts"
import { card, dashboardPage } from "../../src/http/Dashboard.ts"
import { batches } from "../../src/programs/index.ts"
import { describePostgres } from "../../src/supervisor/App.ts"
import { batchView } from "../../src/views/BatchView.ts"

const now = new Date("2026-11-25T18:00:00Z")

const viewOf = (name: string, decomposed: boolean | undefined) => {
  const batch = batches.find((b) => b.name === name)!
  return batchView({
    batch,
    cronText: "*/5 * * * * *",
    cron: Cron.parseUnsafe("*/5 * * * * *"),
    timezone: "UTC",
    running: false,
    disabled: false,
    history: emptyHistory,
    decomposed
  }, now)
}

const BUILD_BATCHES = ["drop-canceling-builds", "drop-pending-builds", "drop-running-builds", "drop-scheduled-builds"]

describe("the database a batch writes", () => {
  it("decomposed: the build batches write ci, every other batch main", () => {
    for (const batch of batches) {
      const view = viewOf(batch.name, true)
      assert.strictEqual(view.database, BUILD_BATCHES.includes(batch.name) ? "ci" : "main", batch.name)
      assert.isTrue(view.decomposed)
    }
  })

  it("one database: every batch writes main, whether or not the view was told", () => {
    for (const batch of batches) {
      for (const decomposed of [false, undefined]) {
        const view = viewOf(batch.name, decomposed)
        assert.strictEqual(view.database, "main", batch.name)
        assert.isFalse(view.decomposed)
      }
    }
  })

  it("a card names its database only when decomposed", () => {
    const ci = card(viewOf("drop-canceling-builds", true))
    assert.include(ci, `<dd class="database" data-database="ci">ci</dd>`)
    const main = card(viewOf("stuck-export-jobs", true))
    assert.include(main, `data-database="main"`)
    for (const name of ["drop-canceling-builds", "stuck-export-jobs"]) {
      assert.notInclude(card(viewOf(name, false)), "data-database")
    }
  })

  it("the overview names both databases when decomposed, nothing with one", () => {
    const views = [viewOf("drop-canceling-builds", true)]
    const decomposed = dashboardPage(views, { stream: "", events: [], databases: "main: a, ci: b" })
    assert.include(decomposed, `<p class="databases muted small" data-databases>GitLab decomposed: main: a, ci: b</p>`)
    assert.notInclude(dashboardPage([viewOf("drop-canceling-builds", false)]), "data-databases")
  })

  it("the backends line: one database as before; main and ci when ci has its own", () => {
    const base = {
      databaseUrl: Option.none<Redacted.Redacted<string>>(),
      ciDatabaseUrl: Option.none<Redacted.Redacted<string>>(),
      embeddedCiDatabase: false,
      dataDir: "/data"
    }
    assert.strictEqual(describePostgres(base), "embedded PGlite (/data/pgdata)")
    assert.strictEqual(
      describePostgres({ ...base, embeddedCiDatabase: true }),
      "main: embedded PGlite (/data/pgdata), ci: embedded PGlite (/data/ci/pgdata)"
    )
    const main = Option.some(Redacted.make("postgres://gitlab:secret@db:5432/gitlabhq_production"))
    assert.strictEqual(
      describePostgres({ ...base, databaseUrl: main }),
      "postgres://gitlab:***@db:5432/gitlabhq_production"
    )
    const both = describePostgres({
      ...base,
      databaseUrl: main,
      ciDatabaseUrl: Option.some(Redacted.make("postgres://gitlab:secret@db-ci:5432/gitlabhq_production_ci"))
    })
    assert.match(both, /^main: postgres:\/\/gitlab:\S+@db:5432\/gitlabhq_production, ci: postgres:\/\/gitlab:\S+@db-ci/)
    assert.notInclude(both, "secret")
  })
})
