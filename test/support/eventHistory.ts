/**
 * Random but reproducible event logs for retention tests: several batches' histories over months —
 * scheduled, manual and dry runs with every outcome, runs killed before their RunFinished (some
 * closed as abandoned later, some never), ticks missed and recorded late after an outage, pauses and
 * resumes, lease losses — interleaved with repair events of other streams. Replicas' clocks differ a
 * little, so `occurred_at` is not always in id order, as in a real cluster.
 */
import { randomUUID } from "node:crypto"
import { seeded } from "./prng.ts"

export interface SeedEvent {
  readonly stream: string
  readonly type: string
  readonly data: Record<string, unknown>
  readonly runId: string | null
  readonly occurredAt: Date
}

const OUTCOMES = ["succeeded", "succeeded", "succeeded", "failed", "failed", "timed_out", "skipped"] as const

/**
 * `steps` events or so, starting at `start`, one step every ~`stepMinutes` (jittered). Batches are
 * named `b0`…; `failingTail` makes the last batch fail from some point on (the breaker's history).
 */
export const randomHistory = (seed: number, options: {
  readonly start: Date
  readonly steps: number
  readonly stepMinutes: number
  readonly batches?: number
}): ReadonlyArray<SeedEvent> => {
  const random = seeded(seed)
  const pick = <A>(xs: ReadonlyArray<A>): A => xs[Math.floor(random() * xs.length)]!
  const batches = Array.from({ length: options.batches ?? 3 }, (_, i) => `b${i}`)
  const out: Array<SeedEvent> = []
  let clock = options.start.getTime()
  const open = new Map<string, Array<{ runId: string; dry: boolean }>>()
  const failingFrom = Math.floor(options.steps * (0.3 + random() * 0.6))
  const at = () => new Date(clock + Math.round((random() - 0.5) * 120_000)) // ±1 min of skew
  const emit = (stream: string, type: string, data: Record<string, unknown>, runId: string | null) =>
    out.push({ stream, type, data, runId, occurredAt: at() })
  for (let step = 0; step < options.steps; step++) {
    clock += Math.round(options.stepMinutes * 60_000 * (0.5 + random()))
    const batch = pick(batches)
    const stream = `batch:${batch}`
    const roll = random()
    const runs = open.get(batch) ?? []
    open.set(batch, runs)
    if (roll < 0.35) {
      const runId = randomUUID()
      const dry = random() < 0.15
      const scheduled = random() < 0.7 ? new Date(clock - (clock % 600_000)).toISOString() : null
      emit(stream, "RunStarted", {
        batch,
        run_id: runId,
        scheduled_at: scheduled,
        node: "n1",
        trigger: scheduled ? "schedule" : "manual",
        dryRun: dry,
        budget_ms: 60_000
      }, runId)
      runs.push({ runId, dry })
    } else if (roll < 0.7 && runs.length > 0) {
      // Usually the run that started last; now and then an older one (overlapping manual runs).
      const index = random() < 0.8 ? runs.length - 1 : Math.floor(random() * runs.length)
      const [run] = runs.splice(index, 1)
      const failing = batch === batches.at(-1) && step >= failingFrom
      const outcome = failing ? pick(["failed", "timed_out", "skipped"] as const) : pick(OUTCOMES)
      if (random() < 0.08) continue // killed: no RunFinished, ever (or until closed below)
      emit(
        stream,
        "RunFinished",
        { batch, outcome, summary: { n: step }, duration_ms: 10, dryRun: run!.dry },
        run!.runId
      )
    } else if (roll < 0.74) {
      // A killed run closed as abandoned by a later run (under the old run's id).
      const killed = runs.shift()
      if (killed !== undefined) {
        emit(stream, "RunFinished", {
          batch,
          outcome: "abandoned",
          summary: null,
          duration_ms: 99,
          dryRun: killed.dry,
          reason: "no RunFinished"
        }, killed.runId)
      }
    } else if (roll < 0.8) {
      // A tick missed; after an outage the record comes late, for a tick older than others recorded.
      const late = random() < 0.3 ? 3 * 86_400_000 * random() : 0
      emit(stream, "TickMissed", {
        batch,
        scheduled_at: new Date(clock - late).toISOString(),
        reason: pick(["downtime", "overlap", "breaker_open"])
      }, null)
    } else if (roll < 0.83) {
      emit(stream, pick(["BatchPaused", "BatchResumed"]), { batch, by: "cli:ops" }, null)
    } else if (roll < 0.84) {
      emit(stream, "LeaseLost", { batch, lease: `lease/${batch}`, epoch: step }, null)
    } else {
      const id = Math.floor(random() * 1000)
      emit(`build:${id}`, "BuildDropped", { id, project_id: 1, runner_id: null, failure_reason: 3 }, null)
    }
  }
  return out
}
