/**
 * What the simulator made and saw, so an end-to-end test can hold Sweeper to account: every stuck
 * thing it left behind (each must be repaired exactly once), every healthy control it seeded beside
 * (none may be touched), and what its Sidekiq-style consumer observed (no worker above its limit,
 * every throttled job run exactly once). Plain mutable data: one simulator fiber group owns it.
 */

export interface Ledger {
  readonly exports: { readonly stuck: Array<number>; readonly healthy: Array<number> }
  readonly builds: { readonly stuck: Array<number>; readonly healthy: Array<number> }
  /**
   * Pipelines: those holding the stuck builds (GitLab can finish each once they are all dropped) and
   * those holding only healthy ones (must stay running); the stand-in pipeline worker's runs per
   * pipeline and the status it last wrote.
   */
  readonly pipelines: {
    readonly stuck: Array<number>
    readonly healthy: Array<number>
    readonly processed: Record<number, number>
    readonly status: Record<number, string>
  }
  /** The other jobs a drop pushes, as the consumer ran them: Ci::BuildFinishedWorker per build id, resource groups. */
  readonly transitionJobs: { readonly buildFinished: Record<number, number>; assignResource: number }
  /** Pending-upload fields (`<location>:<path>`), and where the stale ones' objects were written. */
  readonly uploads: { readonly stuck: Array<string>; readonly healthy: Array<string>; readonly objects: Array<string> }
  /** Running-rebalance members (`<type>/<id>`) left behind by a rebalancer that died. */
  readonly rebalances: { readonly stalled: Array<string>; readonly ran: Record<string, number> }
  readonly throttled: {
    /** Job ids (the job's single arg) pushed to Sidekiq by "GitLab". */
    readonly pushed: Array<number>
    /** How often each job id ran (each must run exactly once). */
    readonly ran: Record<number, number>
    deferred: number
    resumedRan: number
    directRan: number
    /** Most jobs of each worker seen executing at once (HLEN of its executing tracker). */
    readonly maxExecuting: Record<string, number>
    /** The limit each worker ran under, as the consumer read it. */
    readonly limits: Record<string, number>
  }
  /** Jobs the consumer popped that it does not know how to run (left out of every count). */
  unknownJobs: number
  ticks: number
}

export const emptyLedger = (): Ledger => ({
  exports: { stuck: [], healthy: [] },
  builds: { stuck: [], healthy: [] },
  pipelines: { stuck: [], healthy: [], processed: {}, status: {} },
  transitionJobs: { buildFinished: {}, assignResource: 0 },
  uploads: { stuck: [], healthy: [], objects: [] },
  rebalances: { stalled: [], ran: {} },
  throttled: { pushed: [], ran: {}, deferred: 0, resumedRan: 0, directRan: 0, maxExecuting: {}, limits: {} },
  unknownJobs: 0,
  ticks: 0
})

/** One line's worth of counts (the `simulate` command logs it every few seconds and at the end). */
export const ledgerCounts = (ledger: Ledger) => ({
  ticks: ledger.ticks,
  stuckExports: ledger.exports.stuck.length,
  healthyExports: ledger.exports.healthy.length,
  stuckBuilds: ledger.builds.stuck.length,
  healthyBuilds: ledger.builds.healthy.length,
  pipelinesFinished: Object.values(ledger.pipelines.status).filter((s) => s !== "running").length,
  buildFinishedJobs: Object.keys(ledger.transitionJobs.buildFinished).length,
  staleUploads: ledger.uploads.stuck.length,
  freshUploads: ledger.uploads.healthy.length,
  stalledRebalances: ledger.rebalances.stalled.length,
  rebalancesRun: Object.values(ledger.rebalances.ran).reduce((a, b) => a + b, 0),
  throttledPushed: ledger.throttled.pushed.length,
  throttledDeferred: ledger.throttled.deferred,
  throttledResumedRan: ledger.throttled.resumedRan,
  throttledDirectRan: ledger.throttled.directRan,
  maxExecuting: ledger.throttled.maxExecuting,
  unknownJobs: ledger.unknownJobs
})
