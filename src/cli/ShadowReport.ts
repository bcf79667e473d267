/**
 * `sweeper shadow report [--batch B] [--since 7d] [--json]`: shadow mode's agreement per batch over
 * a window, read from Sweeper's ledger (sweeper_shadow_candidates) on the configured database. JSON:
 * one object per batch with batch, matched, mismatched, sweeperOnly, gitlabOnly, ignored, waiting,
 * agreement and samples (the latest disagreements with the facts behind them).
 */
import * as Command from "effect/cli/Command"
import * as Flag from "effect/cli/Flag"
import * as Clock from "effect/Clock"
import * as Console from "effect/Console"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import { SweeperConfig } from "../config/Config.ts"
import { SHADOW_BATCHES, type ShadowBatchReport } from "../domain/Shadow.ts"
import { ShadowLedgerSql } from "../layers/postgres/ShadowLedgerSql.ts"
import { ShadowLedger } from "../services/ShadowLedger.ts"
import { databaseLayer, reachingMain } from "../supervisor/App.ts"
import { instantFlag } from "./CliFlags.ts"

const DEFAULT_WINDOW_MS = 7 * 86_400_000

const percent = (value: number | null) => value === null ? "n/a" : `${(value * 100).toFixed(1)}%`

/** One line per batch, then its samples indented. */
export const formatShadowReport = (reports: ReadonlyArray<ShadowBatchReport>): string =>
  reports.map((r) =>
    [
      `${r.batch}: agreement ${percent(r.agreement)} — matched ${r.matched}, mismatched ${r.mismatched}, ` +
      `sweeperOnly ${r.sweeperOnly}, gitlabOnly ${r.gitlabOnly}, ignored ${r.ignored}, waiting ${r.waiting}`,
      ...r.samples.map((s) =>
        `  ${s.verdict} ${s.entity} (${s.rule}): would write ${JSON.stringify(s.outcome)}; read ${
          JSON.stringify(s.facts)
        }; found ${JSON.stringify(s.observed)}`
      )
    ].join("\n")
  ).join("\n")

const report = Command.make(
  "report",
  {
    batch: Flag.Literals("batch", SHADOW_BATCHES).pipe(
      Flag.withDescription(`Only this batch: ${SHADOW_BATCHES.join(", ")}`),
      Flag.optional
    ),
    since: instantFlag("since").pipe(
      Flag.withDescription("Verdicts from this instant on: ISO-8601, or a duration ago (7d by default)"),
      Flag.optional
    ),
    json: Flag.Boolean("json").pipe(Flag.withDescription("Print JSON on stdout"), Flag.withDefault(false))
  },
  Effect.fn("Cli.shadowReport")(function*({ batch, since, json }) {
    const settings = yield* SweeperConfig
    const now = yield* Clock.currentTimeMillis
    const window = Option.getOrElse(since, () => new Date(now - DEFAULT_WINDOW_MS))
    const batches = Option.match(batch, { onNone: () => SHADOW_BATCHES, onSome: (b) => [b] })
    const reports = yield* Effect.flatMap(ShadowLedger, (ledger) => ledger.report({ since: window, batches })).pipe(
      Effect.provide(ShadowLedgerSql.pipe(Layer.provideMerge(databaseLayer(settings, "read-only")))),
      reachingMain(settings)
    )
    yield* Console.log(json ? JSON.stringify(reports, null, 2) : formatShadowReport(reports))
  }, Effect.provide(SweeperConfig.layer))
).pipe(Command.withDescription("Shadow mode's agreement with GitLab's workers, per batch"))

export const shadowCommand = Command.make("shadow").pipe(
  Command.withDescription("Shadow mode: what Sweeper proposed beside GitLab's workers, and how GitLab did"),
  Command.withSubcommands([report])
)
