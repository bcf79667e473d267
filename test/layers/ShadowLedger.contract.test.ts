/**
 * ShadowLedger's contract, run against the memory and the PostgreSQL ledger: one open proposal per
 * batch and entity (a later proposal keeps the first one's due time), verdicts close only open
 * proposals, gitlabOnly counted once, `proposed` across a family, and the report's counts, agreement
 * and samples.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import type { ShadowCandidate } from "../../src/domain/Shadow.ts"
import { ShadowLedgerMemory } from "../../src/layers/memory/ShadowLedgerMemory.ts"
import { ShadowLedgerSql } from "../../src/layers/postgres/ShadowLedgerSql.ts"
import { ShadowLedger } from "../../src/services/ShadowLedger.ts"
import { PgTest } from "../support/postgres.ts"

const T0 = new Date("2026-01-01T10:00:00Z")
const later = (minutes: number) => new Date(T0.getTime() + minutes * 60_000)

const candidate = (entity: string, proposedAt = T0, batch = "drop-canceling-builds"): ShadowCandidate => ({
  batch,
  entity,
  rule: "canceling",
  outcome: { status: "failed", failure_reason: 3 },
  facts: { status: "canceling" },
  runId: null,
  proposedAt,
  dueAt: later(75 + (proposedAt.getTime() - T0.getTime()) / 60_000)
})

// The two cases touch different batches and entities: they share one store per implementation.
const contract = (name: string, ledgerLayer: Layer.Layer<ShadowLedger, unknown>) =>
  layer(ledgerLayer, { excludeTestServices: true })(name, (it) => {
    it.effect("keeps the first open proposal of an entity, closes it once, then takes a new one", () =>
      Effect.gen(function*() {
        const ledger = yield* ShadowLedger
        yield* ledger.record([candidate("build:1"), candidate("build:2")])
        yield* ledger.record([candidate("build:1", later(60))])
        const open = yield* ledger.open("drop-canceling-builds", 10)
        assert.deepStrictEqual(open.map((c) => [c.entity, c.dueAt.toISOString()]), [
          ["build:1", later(75).toISOString()],
          ["build:2", later(75).toISOString()]
        ])
        assert.lengthOf(yield* ledger.open("drop-canceling-builds", 1), 1)
        yield* ledger.settle([{
          batch: "drop-canceling-builds",
          entity: "build:1",
          verdict: "sweeperOnly",
          observed: { status: "canceling" },
          at: later(80)
        }])
        yield* ledger.settle([{
          batch: "drop-canceling-builds",
          entity: "build:1",
          verdict: "matched",
          observed: null,
          at: later(81)
        }])
        yield* ledger.record([candidate("build:1", later(90))])
        assert.deepStrictEqual((yield* ledger.open("drop-canceling-builds", 10)).map((c) => c.entity), [
          "build:2",
          "build:1"
        ])
        const [report] = yield* ledger.report({ since: T0, batches: ["drop-canceling-builds"] })
        assert.deepInclude(report!, { matched: 0, sweeperOnly: 1, waiting: 2, agreement: 0 })
        assert.deepStrictEqual(report!.samples.map((s) => [s.entity, s.verdict, s.observed]), [
          ["build:1", "sweeperOnly", { status: "canceling" }]
        ])
      }))

    it.effect("gitlabOnly once per batch and entity; what any batch of a family proposed is known", () =>
      Effect.gen(function*() {
        const ledger = yield* ShadowLedger
        yield* ledger.record([candidate("build:5", T0, "drop-pending-builds")])
        const proposed = yield* ledger.proposed(["drop-canceling-builds", "drop-pending-builds"], [
          "build:5",
          "build:6"
        ])
        assert.deepStrictEqual([...proposed], ["build:5"])
        const found = {
          batch: "drop-running-builds",
          entity: "build:6",
          rule: "failed by GitLab",
          outcome: {},
          facts: {}
        }
        assert.strictEqual(yield* ledger.gitlabOnly([{ ...found, at: later(5) }]), 1)
        assert.strictEqual(yield* ledger.gitlabOnly([{ ...found, at: later(65) }]), 0)
        const [running, pending] = yield* ledger.report({
          since: T0,
          batches: ["drop-running-builds", "drop-pending-builds"]
        })
        assert.deepInclude(running!, { gitlabOnly: 1, agreement: 0 })
        assert.deepInclude(pending!, { gitlabOnly: 0, waiting: 1, agreement: null })
        // A verdict before the window is not counted.
        const [none] = yield* ledger.report({ since: later(10), batches: ["drop-running-builds"] })
        assert.strictEqual(none!.gitlabOnly, 0)
      }))
  })

describe("ShadowLedger", () => {
  contract("in memory", ShadowLedgerMemory)
  contract("on PostgreSQL", ShadowLedgerSql.pipe(Layer.provide(PgTest)))
})
