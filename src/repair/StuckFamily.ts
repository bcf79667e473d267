/**
 * One rule of the stuck-builds family walked over the repair loop: keyset pages of the builds the
 * rule matches, each page failed in one fenced statement, the rows that lost their race retried or
 * doomed one by one. The three family programs are this walk over their own rules, so what they
 * guarantee is said once: every row is read at most once per run, and a row that cannot leave the
 * scope (locked by another transaction, refused by a trigger, a zombie whose write changes nothing)
 * is counted and passed — the run ends when the keyset does, never re-reading the same head.
 */
import * as Clock from "effect/Clock"
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { BACKLOG_CAP, type BacklogPart, type BacklogReading } from "../domain/Backlog.ts"
import { CurrentRun, decisionTime } from "../domain/Batch.ts"
import { type BuildCursor, cursorOf, DropBatchSize } from "../domain/Build.ts"
import { buildProposal } from "../domain/Shadow.ts"
import { CurrentFailureReasonSet, reasonCodeOf, reasonOf, rulesInForce, type StuckRule } from "../domain/StuckBuilds.ts"
import { RunnerAckQueue } from "../services/RunnerAckQueue.ts"
import { type FamilyBuild, StuckBuilds } from "../services/StuckBuilds.ts"
import { type LockedRowTally, lockedRowTally } from "./LockedRowTally.ts"
import { type Held, keysetPages, logIds, type Stop, sumHeld } from "./RepairLoop.ts"

export interface StuckFamilySummary extends Held {
  readonly dropped: number
  readonly doomed: number
  readonly batches: number
  /** Held by another open transaction: passed over, found again by the next run. */
  readonly skippedLocked: number
  /** Whose write can never apply (a trigger refusing or swallowing it): counted, passed. */
  readonly refused: number
}

type Counts = { dropped: number; doomed: number; skippedLocked: number; refused: number }
const ZERO: Counts = { dropped: 0, doomed: 0, skippedLocked: 0, refused: 0 }

/**
 * GitLab's "Dropping <type> build" line of each build of a page, written as one line per page: the
 * rule's fields once, and each build's id, runner and status under `builds` (in page order). A line
 * per build cost a large share of a big run for nothing this line does not say.
 */
const logDropping = (rule: StuckRule, reason: string, page: ReadonlyArray<FamilyBuild>) =>
  page.length === 0 ? Effect.void : Effect.logInfo(`Dropping ${rule.stuckType} build`, {
    build_stuck_type: rule.stuckType,
    build_failure_reason: reason,
    count: page.length,
    builds: page.map((build) => ({ build_id: build.id, runner_id: build.runnerId, build_status: build.status }))
  })

/** One rule's walk; its locked rows go to the run's `locked` tally, shared by the run's walks. */
export const dropStuckRule = (batch: string, budget: Duration.Duration, rule: StuckRule, locked: LockedRowTally) =>
  Effect.gen(function*() {
    const builds = yield* StuckBuilds
    const size = yield* DropBatchSize
    const reasons = yield* CurrentFailureReasonSet
    const now = yield* decisionTime
    const reason = reasonOf(rule, reasons)
    const reasonCode = yield* reasonCodeOf(rule, reasons)
    const ackQueue = yield* RunnerAckQueue
    // Builds read whose runner may still accept them: left alone, as GitLab does. Kept beside the
    // pages (not cut from them) so the keyset still moves past them; only ever added to, since the
    // next page is read while this one is written.
    const waiting = new Set<FamilyBuild>()
    const read = (after: Option.Option<BuildCursor>) =>
      Effect.gen(function*() {
        const page = yield* builds.findStuck({ rule, now, after, limit: size })
        if (rule.skipsWaitingForAck !== true) return page
        const ids = yield* ackQueue.waitingForAck(page.map((build) => build.id))
        for (const build of page) if (ids.has(build.id)) waiting.add(build)
        yield* logIds("Skipped builds waiting for their runner's acknowledgement", "build_ids", [...ids])
        return page
      })
    const actionable = (page: ReadonlyArray<FamilyBuild>) => page.filter((build) => !waiting.has(build))

    const dropPage = (whole: ReadonlyArray<FamilyBuild>, commit: (c: Counts) => Effect.Effect<void>) =>
      Effect.gen(function*() {
        const page = actionable(whole)
        yield* logDropping(rule, reason, page)
        const written = yield* builds.dropMany(rule, reasons, page, yield* DateTime.now)
        const won = new Set(written.dropped)
        const skipped = new Set(written.locked)
        const refused: Array<number> = []
        yield* commit({ ...ZERO, dropped: won.size })
        for (const lost of page.filter((build) => !won.has(build) && !skipped.has(build))) {
          const outcome = yield* builds.retryOrDoom(rule, reasons, lost, now)
          if (outcome === "locked") skipped.add(lost)
          if (outcome === "refused") refused.push(lost.id)
          yield* commit({
            ...ZERO,
            dropped: outcome === "dropped" ? 1 : 0,
            doomed: outcome === "doomed" ? 1 : 0,
            refused: outcome === "refused" ? 1 : 0
          })
        }
        // The whole page: a build waiting for its runner was met too, and is not locked.
        const firstSkipped = yield* locked.unit(whole.map((build) => build.id), [...skipped].map((b) => b.id))
        if (firstSkipped > 0) yield* commit({ ...ZERO, skippedLocked: firstSkipped })
        yield* logIds("Skipped builds whose write was refused", "build_ids", refused)
      })

    const loop = yield* keysetPages({
      batch,
      budget,
      initial: ZERO,
      size,
      read,
      cursor: cursorOf,
      unit: {
        plan: Effect.succeed,
        target: (build) => `build:${build.id}`,
        // A build waiting for its runner's acknowledgement is left alone: nothing to propose.
        propose: (build) =>
          waiting.has(build)
            ? undefined
            : buildProposal(`${rule.status} ${rule.stuckType}`, { status: "failed", failureReason: reasonCode }, build),
        dry: (page) => ({ ...ZERO, dropped: actionable(page).length }),
        write: dropPage,
        fence: false
      }
    })
    return { ...loop.totals, batches: loop.units, heldMs: loop.heldMs, heldBy: loop.heldBy, stop: loop.stop }
  })

/**
 * Several rules' walks, one after the other (GitLab's order), summed into one summary. They share
 * the run's one budget (each later walk gets what is left, so the run stays inside its lease and
 * the guard's hard timeout), and a walk stopped by the budget or the gate ends the run there.
 */
export const dropStuckRules = (batch: string, budget: Duration.Duration, rules: ReadonlyArray<StuckRule>) =>
  Effect.gen(function*() {
    const run = yield* CurrentRun
    const budgetMs = Duration.toMillis(Option.getOrElse(run.budget, () => budget))
    const started = yield* Clock.currentTimeMillis
    const walks: Array<StuckFamilySummary & { readonly stop: Stop }> = []
    // One tally for the run's walks: a row's count is the batch's, whichever rule met it.
    const locked = yield* lockedRowTally(batch, "build_ids", "Skipped builds locked by another transaction")
    const inForce = yield* rulesInForce(rules)
    for (const rule of inForce) {
      const left = budgetMs - ((yield* Clock.currentTimeMillis) - started)
      if (walks.length > 0 && left <= 0) break
      const walk = yield* dropStuckRule(batch, budget, rule, locked).pipe(
        Effect.provideService(CurrentRun, { ...run, budget: Option.some(Duration.millis(Math.max(0, left))) })
      )
      walks.push(walk)
      if (walk.stop !== "done") break
    }
    if (walks.length === inForce.length && walks.every((walk) => walk.stop === "done")) yield* locked.complete
    const sum = (key: "dropped" | "doomed" | "batches" | "skippedLocked" | "refused") =>
      walks.reduce((total, walk) => total + walk[key], 0)
    return {
      dropped: sum("dropped"),
      doomed: sum("doomed"),
      batches: sum("batches"),
      skippedLocked: sum("skippedLocked"),
      refused: sum("refused"),
      ...sumHeld(walks)
    } satisfies StuckFamilySummary
  })

/**
 * What waits for the batch now, from its own decision: the rule's first page of BACKLOG_CAP + 1
 * builds at this instant, the very read a run starts with (so the card and the run never disagree on
 * what is stuck). Due since the later of created_at and updated_at plus the rule's timeout; for the
 * scheduled rule, whose clock is scheduled_at, no age (the page does not carry it).
 */
export const stuckBacklog = (rules: ReadonlyArray<StuckRule>) =>
  Effect.gen(function*() {
    const builds = yield* StuckBuilds
    const ackQueue = yield* RunnerAckQueue
    const now = yield* DateTime.now
    const parts = yield* Effect.forEach(yield* rulesInForce(rules), (rule) =>
      Effect.gen(function*() {
        const read = yield* builds.findStuck({ rule, now, after: Option.none(), limit: BACKLOG_CAP + 1 })
        const waiting = rule.skipsWaitingForAck === true
          ? yield* ackQueue.waitingForAck(read.map((build) => build.id))
          : new Set<number>()
        const page = read.filter((build) => !waiting.has(build.id))
        const due = rule.timestamps === "scheduled_at" ?
          [] :
          page.map((build) =>
            DateTime.toEpochMillis(DateTime.max(build.createdAt, build.updatedAt)) + Duration.toMillis(rule.timeout)
          )
        return {
          label: `${rule.status} builds (${rule.stuckType})`,
          count: Math.min(page.length, BACKLOG_CAP),
          capped: page.length > BACKLOG_CAP,
          oldestAt: due.length === 0 ? null : new Date(Math.min(...due))
        } satisfies BacklogPart
      }))
    return { parts } satisfies BacklogReading
  })
