/**
 * A shadow run's own step, after its program ran as a dry run: record what it proposed, then judge
 * the batch's open proposals against GitLab's state read back by their own keys, and record what
 * GitLab repaired that Sweeper never proposed (bounded). Writes only Sweeper's ledger.
 */
import * as Data from "effect/Data"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { resumeVerdict } from "../domain/ConcurrencyLimit.ts"
import {
  rebalanceOfEntity,
  rebalanceVerdict,
  REBALANCING_WORKER,
  rebalancingWorkerArgs
} from "../domain/Rebalancing.ts"
import * as S from "../domain/Shadow.ts"
import { CurrentFailureReasonSet } from "../domain/StuckBuilds.ts"
import { increment, shadowOutcomesTotal } from "../services/Metrics.ts"
import { type GitLabOnly, type Settled, ShadowLedger } from "../services/ShadowLedger.ts"
import { ShadowObserver } from "../services/ShadowObserver.ts"

/** Shadow mode needs the ledger and the observer; a composition without them cannot shadow. */
export class ShadowUnavailable extends Data.TaggedError("ShadowUnavailable")<{ readonly batch: string }> {
  override get message() {
    return `batch ${this.batch} is in shadow mode, but this process has no shadow ledger`
  }
}

export interface ShadowTally extends S.VerdictCounts {
  readonly proposed: number
  /** A gitlabOnly read stopped at its bound: its count is a sample. */
  readonly gitlabOnlyBounded: boolean
}

const idOf = (entity: string) => Number(entity.slice(entity.indexOf(":") + 1))

/** Each open proposal's verdict (or still waiting), from what is read back now. */
const judge = (batch: string, open: ReadonlyArray<S.ShadowCandidate>, now: Date) =>
  Effect.gen(function*() {
    const observer = yield* ShadowObserver
    const verdicts: Array<[S.ShadowCandidate, S.Verdict | S.Pending, Record<string, unknown> | null]> = []
    if (S.BUILD_BATCHES.includes(batch)) {
      const builds = yield* observer.builds(open.map((c) => idOf(c.entity)))
      for (const c of open) {
        const build = builds.get(idOf(c.entity)) ?? null
        const observed = build === null
          ? null
          : { status: build.status, failure_reason: build.failureReason, updated_at: build.updatedAt.toISOString() }
        verdicts.push([c, S.buildVerdict(c, now, build), observed])
      }
    } else if (batch === "stuck-export-jobs") {
      const jobs = yield* observer.exportJobs(open.map((c) => idOf(c.entity)))
      for (const c of open) {
        const job = jobs.get(idOf(c.entity)) ?? null
        verdicts.push([c, S.exportJobVerdict(c, now, job), job === null ? null : { ...job }])
      }
    } else if (batch === "delete-stale-direct-uploads") {
      const values = yield* observer.uploadValues(open.map((c) => String(c.facts.field)))
      open.forEach((c, i) => {
        const value = values[i] ?? null
        verdicts.push([c, S.uploadVerdict(c, now, value), { value }])
      })
    } else if (batch === "reschedule-stuck-issue-rebalances") {
      const readings = yield* observer.rebalances(open.map((c) => rebalanceOfEntity(c.entity)))
      open.forEach((c, i) => {
        const reading = readings[i]!
        verdicts.push([c, rebalanceVerdict(c, now, reading), { ...reading }])
      })
    } else if (batch === "concurrency-limit-resume") {
      // As many elements as the proposal would take, and the one after: bounded by the move's size.
      const readings = yield* observer.deferredHeads(open.map((c) => ({
        worker: c.entity.slice("concurrency_limit:".length),
        count: Number(c.facts.taken) + 1
      })))
      open.forEach((c, i) => {
        const reading = readings[i]!
        const observed = { head: reading.head.slice(0, 3), length: reading.length, limit: reading.limit }
        verdicts.push([c, resumeVerdict(c, now, reading), observed])
      })
    }
    return verdicts
  })

/** GitLab's repairs in the window that no proposal names. */
const gitlabOnly = (batch: string, now: Date) =>
  Effect.gen(function*() {
    const observer = yield* ShadowObserver
    const ledger = yield* ShadowLedger
    const since = new Date(now.getTime() - Duration.toMillis(S.GITLAB_ONLY_REPAIRED_WITHIN))
    let found: ReadonlyArray<GitLabOnly> = []
    let bounded = false
    if (S.BUILD_BATCHES.includes(batch)) {
      const answers = S.gitlabOnlyBuilds(batch, yield* CurrentFailureReasonSet)
      if (answers === null) return { found, bounded }
      const read = yield* observer.failedBuilds({
        reasons: answers.reasons,
        since,
        createdSince: new Date(now.getTime() - Duration.toMillis(S.GITLAB_ONLY_CREATED_WITHIN)),
        bound: S.GITLAB_ONLY_BOUND
      })
      bounded = read.bounded
      found = read.found.filter((b) => (b.startedAt !== null && b.startedAt !== undefined) === answers.started).map((
        b
      ) => ({
        batch,
        entity: `build:${b.id}`,
        rule: "failed by GitLab",
        outcome: { status: b.status, failure_reason: b.failureReason ?? null },
        facts: { started_at: b.startedAt?.toISOString() ?? null },
        at: b.at
      }))
    } else if (batch === "stuck-export-jobs") {
      const read = yield* observer.failedExportJobs({ since, bound: S.GITLAB_ONLY_BOUND })
      bounded = read.bounded
      found = read.found.map((j) => ({
        batch,
        entity: `export_job:${j.id}`,
        rule: "failed by GitLab",
        outcome: { status: j.status },
        facts: {},
        at: j.at
      }))
    } else if (batch === "reschedule-stuck-issue-rebalances") {
      const read = yield* observer.rescheduledRebalances(S.GITLAB_ONLY_QUEUE_BOUND)
      bounded = read.bounded
      found = read.found.map(({ id, type }) => ({
        batch,
        entity: `rebalance:${type}/${id}`,
        rule: "re-enqueued by GitLab",
        outcome: { job: REBALANCING_WORKER, args: rebalancingWorkerArgs(type, id) },
        facts: {},
        at: now
      }))
    } else if (batch === "concurrency-limit-resume") {
      const read = yield* observer.resumedByGitLab(S.GITLAB_ONLY_QUEUE_BOUND)
      bounded = read.bounded
      found = read.found.map(({ jobs, worker }) => ({
        batch,
        entity: `concurrency_limit:${worker}`,
        rule: "resumed by GitLab",
        outcome: { resumed: jobs },
        facts: {},
        at: now
      }))
    }
    const family = S.BUILD_BATCHES.includes(batch) ? S.BUILD_BATCHES : [batch]
    const proposed = yield* ledger.proposed(family, found.map((f) => f.entity))
    return { found: found.filter((f) => !proposed.has(f.entity)), bounded }
  })

/**
 * A rebalance whose job is already pending is not re-enqueued by Sweeper's act run (a duplicate,
 * nothing pushed): no proposal. A `recently_finished` mark already there is noted, so only a newer
 * finish counts as the rebalance having run.
 */
const rebalancesAsPushed = (proposals: Map<string, S.ShadowProposal>) =>
  Effect.gen(function*() {
    const entities = [...proposals.keys()]
    const readings = yield* (yield* ShadowObserver).rebalances(entities.map(rebalanceOfEntity))
    entities.forEach((entity, i) => {
      const reading = readings[i]!
      const proposal = proposals.get(entity)!
      if (reading.job !== null) proposals.delete(entity)
      else proposals.set(entity, { ...proposal, facts: { ...proposal.facts, finished_before: reading.finished } })
    })
  })

/**
 * Records the run's proposals, judges the batch's open ones, adds GitLab's unproposed repairs; the
 * tally goes into the run's summary and `sweeper_shadow_outcomes_total`.
 */
export const shadowStep = (
  batch: string,
  runId: string,
  proposals: ReadonlyArray<readonly [string, S.ShadowProposal]>,
  now: Date
) =>
  Effect.gen(function*() {
    const ledgerOption = yield* Effect.serviceOption(ShadowLedger)
    const observerOption = yield* Effect.serviceOption(ShadowObserver)
    if (Option.isNone(ledgerOption) || Option.isNone(observerOption)) return yield* new ShadowUnavailable({ batch })
    const ledger = ledgerOption.value
    const wait = yield* S.ShadowWaitOverride
    // A dry run walks every rule over unchanged rows, so a build two rules match is proposed twice;
    // the first rule (GitLab's order) is the one that would have dropped it.
    const first = new Map<string, S.ShadowProposal>()
    for (const [entity, proposal] of proposals) if (!first.has(entity)) first.set(entity, proposal)
    if (batch === "reschedule-stuck-issue-rebalances") {
      yield* rebalancesAsPushed(first).pipe(Effect.provideService(ShadowObserver, observerOption.value))
    }
    yield* ledger.record([...first].map(([entity, proposal]) => ({
      ...proposal,
      batch,
      entity,
      runId,
      proposedAt: now,
      dueAt: S.dueAt(batch, now, wait)
    })))
    const open = yield* ledger.open(batch, S.RECONCILE_BOUND)
    const judged = yield* judge(batch, open, now).pipe(Effect.provideService(ShadowObserver, observerOption.value))
    const settled: Array<Settled> = []
    let waiting = 0
    for (const [candidate, verdict, observed] of judged) {
      // Proposed by this very run: nothing of GitLab's can have happened since (a job already
      // pending would otherwise be judged again each run that proposes it again).
      const fresh = candidate.proposedAt.getTime() >= now.getTime()
      if (fresh || verdict === "waiting" || verdict === "gitlabOnly") waiting++
      else settled.push({ batch, entity: candidate.entity, verdict, observed, at: now })
    }
    yield* ledger.settle(settled)
    const extra = yield* gitlabOnly(batch, now).pipe(
      Effect.provideService(ShadowObserver, observerOption.value),
      Effect.provideService(ShadowLedger, ledger)
    )
    const newGitlabOnly = yield* ledger.gitlabOnly(extra.found)
    const count = (verdict: S.Verdict) => settled.filter((s) => s.verdict === verdict).length
    const tally: ShadowTally = {
      proposed: first.size,
      matched: count("matched"),
      mismatched: count("mismatched"),
      sweeperOnly: count("sweeperOnly"),
      gitlabOnly: newGitlabOnly,
      ignored: count("ignored"),
      waiting,
      gitlabOnlyBounded: extra.bounded
    }
    for (const outcome of S.VERDICTS) {
      if (tally[outcome] > 0) yield* increment(shadowOutcomesTotal, tally[outcome], { batch, outcome })
    }
    return tally
  })
