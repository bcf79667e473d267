/**
 * A batch's recent runs, read back from its events: each RunFinished joined with its RunStarted
 * (trigger, node, when it started). Shared by the API, the dashboard and the CLI.
 */
import * as Effect from "effect/Effect"
import type { StoredEvent } from "../domain/Events.ts"
import { redact } from "../domain/Redaction.ts"
import { EventLog } from "../services/EventLog.ts"

export interface RunRecord {
  readonly runId: string | null
  readonly batch: string
  readonly trigger: string | null
  readonly node: string | null
  readonly dryRun: boolean
  readonly startedAt: string | null
  readonly finishedAt: string
  readonly durationMs: number
  readonly outcome: string
  readonly summary: unknown
  readonly reason: string | null
  readonly error: string | null
  readonly targets: ReadonlyArray<string> | null
  readonly targetsTotal: number | null
}

const text = (value: unknown) => typeof value === "string" ? value : null
/** An error text as shown: redacted as read too, for a ledger written before a form was known. */
const redactedText = (value: unknown) => typeof value === "string" ? redact(value) : null

export const MAX_RUNS = 500

/** The newest `limit` runs (newest first), of one batch or of all. */
export const recentRuns = Effect.fnUntraced(
  function*(options: { readonly batch?: string | undefined; readonly limit: number }) {
    const events = yield* EventLog
    const limit = Math.max(1, Math.min(MAX_RUNS, options.limit))
    const where = options.batch === undefined ? { streamPrefix: "batch:" } : { stream: `batch:${options.batch}` }
    const finished = yield* events.query({ ...where, type: "RunFinished", newestFirst: true, limit })
    const oldest = finished.at(-1)?.occurredAt
    const started = oldest === undefined
      ? []
      : yield* events.query({
        ...where,
        type: "RunStarted",
        since: new Date(oldest.getTime() - 24 * 3600_000),
        newestFirst: true,
        limit: limit * 2
      })
    const startedByRun = new Map<string, StoredEvent>()
    for (const event of started) if (event.runId !== null) startedByRun.set(event.runId, event)
    return finished.map((event): RunRecord => {
      const start = event.runId === null ? undefined : startedByRun.get(event.runId)
      const data = event.data
      return {
        runId: event.runId,
        batch: text(data.batch) ?? event.stream.replace(/^batch:/, ""),
        trigger: text(start?.data.trigger),
        node: text(start?.data.node),
        dryRun: data.dryRun === true,
        startedAt: start?.occurredAt.toISOString() ?? null,
        finishedAt: event.occurredAt.toISOString(),
        durationMs: Number(data.duration_ms ?? 0),
        outcome: text(data.outcome) ?? "unknown",
        summary: data.summary ?? null,
        reason: text(data.reason),
        error: redactedText(data.error),
        targets: Array.isArray(data.targets) ? data.targets.filter((t): t is string => typeof t === "string") : null,
        targetsTotal: typeof data.targetsTotal === "number" ? data.targetsTotal : null
      }
    })
  }
)
