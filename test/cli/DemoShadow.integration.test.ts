/**
 * `npm run demo -- --shadow` as a newcomer runs it: within a couple of minutes drop-canceling-builds'
 * shadow view has matched builds (GitLab's played worker dropped them the same way) and sweeperOnly
 * ones (the refused build GitLab's loop never gets past, and those behind it), stuck-export-jobs
 * has matched exports, and every other batch that has a shadow mode is in it beside its played
 * GitLab worker; prune-events acts.
 */
import { assert, describe, it } from "@effect/vitest"
import { SHADOW_BATCHES } from "../../src/domain/Shadow.ts"
import { startDemo } from "../support/demo.ts"
import { waitFor } from "../support/processes.ts"

interface ShadowJson {
  readonly matched: number
  readonly sweeperOnly: number
}

describe("the demo in shadow mode", () => {
  it("shows matched and a sweeperOnly disagreement beside the simulated GitLab's workers", async () => {
    const demo = startDemo(["--shadow"])
    try {
      const url = await waitFor(
        "the dashboard URL",
        async () => /Dashboard: (http:\/\/\S+)/.exec(demo.stdout())?.[1],
        90_000
      )
      const shadow = (batch: string) =>
        fetch(`${url}api/batches/${batch}/shadow?window=1h`).then((r) => r.json() as Promise<ShadowJson>)
      const drops = await waitFor(
        "matched and sweeperOnly builds",
        async () => {
          const report = await shadow("drop-canceling-builds")
          return report.matched > 0 && report.sweeperOnly > 0 ? report : undefined
        },
        150_000,
        2000
      )
      assert.isAbove(drops.sweeperOnly, 0)
      assert.isAbove((await shadow("stuck-export-jobs")).matched, 0)
      const listed = await fetch(`${url}api/batches`).then((r) =>
        r.json() as Promise<Array<{ name: string; mode: string }>>
      )
      assert.deepStrictEqual(
        listed.filter((b) => b.mode === "shadow").map((b) => b.name).sort(),
        [...SHADOW_BATCHES].sort()
      )
      // GitLab's played RescheduleStuckIssueRebalancesWorker re-enqueues the demo's stalled rebalances.
      await waitFor(
        "a rebalance GitLab re-enqueued as Sweeper proposed",
        async () => ((await shadow("reschedule-stuck-issue-rebalances")).matched > 0 ? true : undefined),
        120_000,
        2000
      )
    } finally {
      await demo.cleanUp()
    }
  })
})
