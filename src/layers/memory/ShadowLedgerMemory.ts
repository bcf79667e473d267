/** ShadowLedger in memory (specs): the SQL ledger's rules over a Ref of rows, in insertion order. */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Ref from "effect/Ref"
import {
  agreementOf,
  DISAGREEMENTS,
  SHADOW_SAMPLES,
  type ShadowBatchReport,
  type ShadowCandidate,
  type Verdict,
  VERDICTS
} from "../../domain/Shadow.ts"
import { ShadowLedger } from "../../services/ShadowLedger.ts"

interface Row extends ShadowCandidate {
  readonly id: number
  readonly verdict: Verdict | null
  readonly observed: Readonly<Record<string, unknown>> | null
  readonly settledAt: Date | null
}

export const ShadowLedgerMemory = Layer.effect(
  ShadowLedger,
  Effect.gen(function*() {
    const rows = yield* Ref.make<ReadonlyArray<Row>>([])
    const add = (list: ReadonlyArray<Row>, row: Omit<Row, "id">) => [...list, { ...row, id: list.length + 1 }]
    return ShadowLedger.of({
      record: (candidates) =>
        Ref.update(rows, (list) =>
          candidates.reduce(
            (acc, c) =>
              acc.some((r) => r.batch === c.batch && r.entity === c.entity && r.verdict === null)
                ? acc
                : add(acc, { ...c, verdict: null, observed: null, settledAt: null }),
            list
          )),
      open: (batch, limit) =>
        Effect.map(
          Ref.get(rows),
          (list) =>
            list.filter((r) => r.batch === batch && r.verdict === null)
              .sort((a, b) => a.proposedAt.getTime() - b.proposedAt.getTime() || a.id - b.id)
              .slice(0, limit)
        ),
      settle: (verdicts) =>
        Ref.update(rows, (list) =>
          list.map((r) => {
            const v = verdicts.find((s) => s.batch === r.batch && s.entity === r.entity)
            return v === undefined || r.verdict !== null
              ? r
              : { ...r, verdict: v.verdict, observed: v.observed, settledAt: v.at }
          })),
      proposed: (batches, entities) =>
        Effect.map(
          Ref.get(rows),
          (list) =>
            new Set(
              list.filter((r) => batches.includes(r.batch) && entities.includes(r.entity) && r.verdict !== "gitlabOnly")
                .map((r) => r.entity)
            )
        ),
      gitlabOnly: (found) =>
        Ref.modify(rows, (list) => {
          let added = 0
          const next = found.reduce((acc, f) => {
            if (acc.some((r) => r.batch === f.batch && r.entity === f.entity && r.verdict === "gitlabOnly")) return acc
            added++
            return add(acc, {
              ...f,
              runId: null,
              proposedAt: f.at,
              dueAt: f.at,
              verdict: "gitlabOnly",
              observed: null,
              settledAt: f.at
            })
          }, list)
          return [added, next]
        }),
      report: ({ batches, since }) =>
        Effect.map(Ref.get(rows), (list) =>
          batches.map((batch): ShadowBatchReport => {
            const mine = list.filter((r) => r.batch === batch)
            const settled = mine.filter((r) => r.settledAt !== null && r.settledAt.getTime() >= since.getTime())
            const tally = Object.fromEntries(
              VERDICTS.map((verdict) => [verdict, settled.filter((r) => r.verdict === verdict).length])
            ) as Record<Verdict, number>
            return {
              batch,
              ...tally,
              waiting: mine.filter((r) => r.verdict === null).length,
              agreement: agreementOf(tally),
              samples: settled.filter((r) => DISAGREEMENTS.includes(r.verdict!))
                .sort((a, b) => b.settledAt!.getTime() - a.settledAt!.getTime() || b.id - a.id)
                .slice(0, SHADOW_SAMPLES)
                .map((r) => ({
                  entity: r.entity,
                  verdict: r.verdict!,
                  rule: r.rule,
                  outcome: r.outcome,
                  facts: r.facts,
                  observed: r.observed,
                  settledAt: r.settledAt!.toISOString()
                }))
            }
          }))
    })
  })
)
