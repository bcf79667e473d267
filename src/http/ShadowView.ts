/**
 * A batch's shadow view (`/batches/:name/shadow?window=`): how often GitLab's own worker did what
 * Sweeper proposed over the window, the counts per verdict, and the latest disagreements each with
 * what Sweeper would have written, what it read when it proposed, and what it found afterwards. The
 * numbers are the ledger's report, the one `sweeper shadow report` prints. Everything interpolated
 * is HTML-escaped: entities, rules and facts come from GitLab's rows and keys.
 */
import { DISAGREEMENTS, modeVariable, type ShadowBatchReport, type ShadowSample, VERDICTS } from "../domain/Shadow.ts"
import { type HistoryWindow, WINDOW_WORDS, WINDOWS } from "./Charts.ts"
import { type CardView, e, layout, time } from "./Dashboard.ts"

/** A shadow view's window when none is asked for: the CLI report's default. */
export const SHADOW_DEFAULT_WINDOW: HistoryWindow = "7d"

const VERDICT_WORDS: Record<typeof VERDICTS[number], string> = {
  matched: "GitLab repaired it the same way",
  mismatched: "GitLab repaired it another way",
  sweeperOnly: "still stuck after GitLab's worker should have run",
  gitlabOnly: "GitLab repaired it; Sweeper never proposed it",
  ignored: "changed by something else"
}

const agreementText = (agreement: number | null) =>
  agreement === null ? "no verdict yet" : `${(agreement * 100).toFixed(1)}%`

const windowLinks = (name: string, current: HistoryWindow) =>
  `<nav class="windows" aria-label="Shadow window">${
    (Object.keys(WINDOWS) as Array<HistoryWindow>).map((w) =>
      `<a href="/batches/${encodeURIComponent(name)}/shadow?window=${w}"${
        w === current ? " aria-current=\"page\"" : ""
      }>${WINDOW_WORDS[w]}</a>`
    ).join("")
  }</nav>`

const sampleRow = (sample: ShadowSample) =>
  `<tr data-verdict="${e(sample.verdict)}" data-entity="${e(sample.entity)}"><td>${
    time(sample.settledAt, "at")
  }</td><td><span class="badge verdict-${e(sample.verdict)}">${e(sample.verdict)}</span></td>
<td><a class="entity" href="/?stream=${encodeURIComponent(sample.entity)}#history">${e(sample.entity)}</a></td>
<td>${e(sample.rule)}</td><td class="data"><code>${e(sample.outcome)}</code></td><td class="data"><code>${
    e(sample.facts)
  }</code></td><td class="data"><code>${e(sample.observed)}</code></td></tr>`

export const shadowPage = (view: CardView, report: ShadowBatchReport, window: HistoryWindow) => {
  const acting = view.mode !== "shadow"
  return layout(
    `${view.name} shadow · Sweeper`,
    `<p><a href="/batches/${encodeURIComponent(view.name)}">← ${e(view.name)}</a></p>
<section class="shadow" data-shadow="${e(view.name)}" data-agreement="${report.agreement ?? ""}">
<h2>Shadow mode: ${e(view.name)} beside <code>${e(view.worker)}</code></h2>
${
      acting
        ? `<p class="muted" data-mode="act">This batch acts: it proposes nothing now. Set <code>${
          e(modeVariable(view.name))
        }=shadow</code> (or <code>SWEEPER_MODE=shadow</code>) to run it beside GitLab's worker; verdicts already in the ledger are below.</p>`
        : ""
    }
${windowLinks(view.name, window)}
<p class="agreement">Agreement over the last ${WINDOW_WORDS[window]}: <strong>${
      agreementText(report.agreement)
    }</strong> <span class="muted small">(matched ÷ matched, mismatched, sweeperOnly and gitlabOnly)</span></p>
<table class="verdicts"><thead><tr><th>Verdict</th><th>Count</th><th>Meaning</th></tr></thead><tbody>${
      VERDICTS.map((verdict) =>
        `<tr data-verdict="${verdict}" data-count="${report[verdict]}"><td>${verdict}</td><td>${
          report[verdict]
        }</td><td class="muted">${e(VERDICT_WORDS[verdict])}</td></tr>`
      ).join("")
    }<tr data-verdict="waiting" data-count="${report.waiting}"><td>waiting</td><td>${report.waiting}</td><td class="muted">proposed; GitLab's worker has not had its turn yet</td></tr></tbody></table>
<h3>Latest disagreements</h3>${
      report.samples.length === 0
        ? `<p class="muted">No ${DISAGREEMENTS.join(", ")} verdict in the window.</p>`
        : `<div class="scroll"><table class="samples"><thead><tr><th>Judged</th><th>Verdict</th><th>Entity</th><th>Rule</th><th>Sweeper would write</th><th>Read when proposed</th><th>Found afterwards</th></tr></thead><tbody>${
          report.samples.map(sampleRow).join("")
        }</tbody></table></div>`
    }
</section>`,
    " data-shadow-page"
  )
}
