/**
 * Shadow mode's decisions (pure): each batch's verdict from what was read back, the agreement, and
 * SWEEPER_MODE / SWEEPER_MODE_<BATCH> as configureBatches reads them.
 */
import { assert, describe, it } from "@effect/vitest"
import { ConfigProvider, Effect } from "effect"
import { configureBatches, SweeperConfig } from "../../src/config/Config.ts"
import { resumeVerdict } from "../../src/domain/ConcurrencyLimit.ts"
import { rebalanceVerdict } from "../../src/domain/Rebalancing.ts"
import {
  agreementOf,
  buildVerdict,
  exportJobVerdict,
  gitlabOnlyBuilds,
  uploadVerdict
} from "../../src/domain/Shadow.ts"
import { batches } from "../../src/programs/index.ts"

const NOW = new Date("2026-01-01T12:00:00Z")
const DUE_LATER = new Date("2026-01-01T13:00:00Z")
const DUE_PAST = new Date("2026-01-01T11:00:00Z")
const READ_AT = "2026-01-01T09:00:00.000Z"

const canceling = (dueAt: Date) => ({
  outcome: { status: "failed", failure_reason: 3 },
  facts: { status: "canceling", lock_version: 0, updated_at: READ_AT },
  dueAt
})
const build = (status: string, failureReason: number | null, updatedAt = READ_AT) => ({
  status,
  failureReason,
  updatedAt: new Date(updatedAt)
})

describe("buildVerdict", () => {
  it("the drop Sweeper would write is matched; another stuck reason, or GitLab 19's canceled end, mismatched", () => {
    assert.strictEqual(buildVerdict(canceling(DUE_LATER), NOW, build("failed", 3)), "matched")
    assert.strictEqual(buildVerdict(canceling(DUE_LATER), NOW, build("failed", 12)), "mismatched")
    assert.strictEqual(buildVerdict(canceling(DUE_LATER), NOW, build("failed", 28)), "mismatched")
    assert.strictEqual(buildVerdict(canceling(DUE_LATER), NOW, build("canceled", null)), "mismatched")
  })

  it("still stuck: waiting before GitLab's window is over, sweeperOnly after it", () => {
    assert.strictEqual(buildVerdict(canceling(DUE_LATER), NOW, build("canceling", null)), "waiting")
    assert.strictEqual(buildVerdict(canceling(DUE_PAST), NOW, build("canceling", null)), "sweeperOnly")
    assert.strictEqual(buildVerdict(canceling(NOW), NOW, build("canceling", null)), "sweeperOnly")
  })

  it("changed by something else: ignored (finished, script failure, touched, gone)", () => {
    assert.strictEqual(buildVerdict(canceling(DUE_PAST), NOW, build("success", null)), "ignored")
    assert.strictEqual(buildVerdict(canceling(DUE_PAST), NOW, build("failed", 1)), "ignored")
    assert.strictEqual(
      buildVerdict(canceling(DUE_PAST), NOW, build("canceling", null, "2026-01-01T10:00:00.000Z")),
      "ignored"
    )
    assert.strictEqual(buildVerdict(canceling(DUE_PAST), NOW, null), "ignored")
  })

  it("a pending build canceled is someone else's, not GitLab's drop", () => {
    const pending = { ...canceling(DUE_PAST), facts: { status: "pending", updated_at: READ_AT } }
    assert.strictEqual(buildVerdict(pending, NOW, build("canceled", null)), "ignored")
  })
})

describe("exportJobVerdict", () => {
  const job = (dueAt: Date) => ({ facts: { jid: "j1", status: 1 }, dueAt })
  it("failed under the same jid: matched; re-enqueued or finished: ignored; still enqueued: waiting, then sweeperOnly", () => {
    assert.strictEqual(exportJobVerdict(job(DUE_LATER), NOW, { status: 3, jid: "j1" }), "matched")
    assert.strictEqual(exportJobVerdict(job(DUE_LATER), NOW, { status: 3, jid: "j2" }), "ignored")
    assert.strictEqual(exportJobVerdict(job(DUE_LATER), NOW, { status: 2, jid: "j1" }), "ignored")
    assert.strictEqual(exportJobVerdict(job(DUE_LATER), NOW, { status: 1, jid: "j1" }), "waiting")
    assert.strictEqual(exportJobVerdict(job(DUE_PAST), NOW, { status: 0, jid: "j1" }), "sweeperOnly")
    assert.strictEqual(exportJobVerdict(job(DUE_PAST), NOW, null), "ignored")
  })
})

describe("uploadVerdict", () => {
  const upload = (path: string, dueAt: Date) => ({ facts: { path, value: "MTIz" }, dueAt })
  it("entry gone: matched, or mismatched when GitLab cut the path at a second colon", () => {
    assert.strictEqual(uploadVerdict(upload("tmp/a", DUE_LATER), NOW, null), "matched")
    assert.strictEqual(uploadVerdict(upload("tmp/b:c", DUE_LATER), NOW, null), "mismatched")
  })
  it("a new value is a new upload (ignored); the same one waits, then is sweeperOnly", () => {
    assert.strictEqual(uploadVerdict(upload("tmp/a", DUE_PAST), NOW, "NDU2"), "ignored")
    assert.strictEqual(uploadVerdict(upload("tmp/a", DUE_LATER), NOW, "MTIz"), "waiting")
    assert.strictEqual(uploadVerdict(upload("tmp/a", DUE_PAST), NOW, "MTIz"), "sweeperOnly")
  })
})

describe("agreement and gitlabOnly", () => {
  it("agreement is matched over every verdict but ignored; none: null", () => {
    assert.strictEqual(agreementOf({ matched: 3, mismatched: 1, sweeperOnly: 0, gitlabOnly: 0 }), 0.75)
    assert.isNull(agreementOf({ matched: 0, mismatched: 0, sweeperOnly: 0, gitlabOnly: 0 }))
  })
  it("a started build failed as stuck under legacy reasons counts for drop-running-builds, not drop-canceling-builds", () => {
    assert.deepStrictEqual(gitlabOnlyBuilds("drop-running-builds", "legacy"), { reasons: [3], started: true })
    assert.isNull(gitlabOnlyBuilds("drop-canceling-builds", "legacy"))
    assert.deepStrictEqual(gitlabOnlyBuilds("drop-pending-builds", "gitlab-19"), { reasons: [25, 26], started: false })
  })
})

describe("rebalanceVerdict", () => {
  const reading = { running: true, finished: false, job: null, legacyJob: null }
  const proposal = (dueAt: Date, finishedBefore = false) => ({ dueAt, facts: { finished_before: finishedBefore } })

  it("GitLab's job pending, or the rebalance finished since: matched; the legacy job: mismatched", () => {
    assert.strictEqual(rebalanceVerdict(proposal(DUE_LATER), NOW, { ...reading, job: "abc" }), "matched")
    assert.strictEqual(
      rebalanceVerdict(proposal(DUE_LATER), NOW, { ...reading, running: false, finished: true }),
      "matched"
    )
    assert.strictEqual(rebalanceVerdict(proposal(DUE_LATER), NOW, { ...reading, legacyJob: "abc" }), "mismatched")
  })

  it("still running: waiting, then sweeperOnly; gone without a mark, or a mark older than the proposal: ignored", () => {
    assert.strictEqual(rebalanceVerdict(proposal(DUE_LATER), NOW, reading), "waiting")
    assert.strictEqual(rebalanceVerdict(proposal(DUE_PAST), NOW, reading), "sweeperOnly")
    assert.strictEqual(rebalanceVerdict(proposal(DUE_PAST), NOW, { ...reading, running: false }), "ignored")
    assert.strictEqual(
      rebalanceVerdict(proposal(DUE_PAST, true), NOW, { ...reading, running: false, finished: true }),
      "ignored"
    )
  })
})

describe("resumeVerdict", () => {
  // Two jobs proposed (a, b) of five; c is the first the move would leave.
  const proposal = (dueAt: Date) => ({
    dueAt,
    proposedAt: new Date(NOW.getTime() - 10_000),
    facts: { limit: 2, queue_size: 5, taken: 2, first: "a", last: "b", next: "c" }
  })
  const reading = (head: ReadonlyArray<string>, length: number, limit: number | null = 2) => ({ head, length, limit })

  it("both gone, FIFO: matched (further ones gone too still is); one of them gone: mismatched", () => {
    assert.strictEqual(resumeVerdict(proposal(DUE_LATER), NOW, reading(["c", "d", "e"], 3)), "matched")
    assert.strictEqual(resumeVerdict(proposal(DUE_LATER), NOW, reading(["d", "e"], 2)), "matched")
    assert.strictEqual(resumeVerdict(proposal(DUE_LATER), NOW, reading(["b", "c", "d"], 4)), "mismatched")
  })

  it("still at the head: waiting, then sweeperOnly", () => {
    assert.strictEqual(resumeVerdict(proposal(DUE_LATER), NOW, reading(["a", "b", "c"], 5)), "waiting")
    assert.strictEqual(resumeVerdict(proposal(DUE_PAST), NOW, reading(["a", "b", "c"], 5)), "sweeperOnly")
  })

  it("the limit changed, jobs put back ahead, or more gone than ResumeWorker moves in the time: ignored", () => {
    assert.strictEqual(resumeVerdict(proposal(DUE_PAST), NOW, reading(["a", "b", "c"], 5, -1)), "ignored")
    assert.strictEqual(resumeVerdict(proposal(DUE_PAST), NOW, reading(["a", "b", "c"], 5, null)), "ignored")
    assert.strictEqual(resumeVerdict(proposal(DUE_PAST), NOW, reading(["x", "a", "b"], 6)), "ignored")
    // 10 s since the proposal: at most 11 passes of 2 jobs each.
    const big = { ...proposal(DUE_PAST), facts: { ...proposal(DUE_PAST).facts, queue_size: 100 } }
    assert.strictEqual(resumeVerdict(big, NOW, reading([], 0)), "ignored")
    assert.strictEqual(resumeVerdict(big, NOW, reading(["z"], 78)), "matched")
  })
})

describe("SWEEPER_MODE and SWEEPER_MODE_<BATCH>", () => {
  const modes = (env: Record<string, string>) =>
    configureBatches(batches).pipe(
      Effect.map((configured) => Object.fromEntries(configured.map((c) => [c.batch.name, c.batch.mode ?? "act"]))),
      Effect.provide(SweeperConfig.layerWith({})),
      Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromEnv({ env }))
    )

  it.effect("act by default; SWEEPER_MODE=shadow shadows only the batches that have a shadow mode", () =>
    Effect.gen(function*() {
      assert.isTrue(Object.values(yield* modes({})).every((mode) => mode === "act"))
      const all = yield* modes({ SWEEPER_MODE: "shadow" })
      assert.strictEqual(all["drop-canceling-builds"], "shadow")
      assert.strictEqual(all["delete-stale-direct-uploads"], "shadow")
      assert.strictEqual(all["concurrency-limit-resume"], "shadow")
      assert.strictEqual(all["reschedule-stuck-issue-rebalances"], "shadow")
      assert.strictEqual(all["prune-events"], "act")
    }))

  it.effect("a batch's own variable wins over SWEEPER_MODE", () =>
    Effect.gen(function*() {
      const one = yield* modes({ SWEEPER_MODE: "shadow", SWEEPER_MODE_STUCK_EXPORT_JOBS: "act" })
      assert.strictEqual(one["stuck-export-jobs"], "act")
      assert.strictEqual(one["drop-running-builds"], "shadow")
      assert.strictEqual(
        (yield* modes({ SWEEPER_MODE_DROP_PENDING_BUILDS: "shadow" }))["drop-pending-builds"],
        "shadow"
      )
    }))

  it.effect("a bad value, or shadow for a batch that has none, is refused naming the variable", () =>
    Effect.gen(function*() {
      const bad = yield* Effect.flip(modes({ SWEEPER_MODE: "observe" }))
      assert.strictEqual(bad.variable, "SWEEPER_MODE")
      const none = yield* Effect.flip(modes({ SWEEPER_MODE_PRUNE_EVENTS: "shadow" }))
      assert.strictEqual(none.variable, "SWEEPER_MODE_PRUNE_EVENTS")
      assert.include(none.message, "has no shadow mode")
    }))
})
