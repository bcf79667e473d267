import type { BatchView } from "./BatchView.ts"
import type { RunRecord } from "./Runs.ts"
export const dashboardPage = (_views: ReadonlyArray<BatchView>) => "<!doctype html><title>Sweeper</title>"
export const batchPage = (_view: BatchView, _runs: ReadonlyArray<RunRecord>) => "<!doctype html><title>Sweeper</title>"
