/**
 * Where a Sweeper phase's wall time goes, by span (`BENCH_SPANS=1`): every span the run opens
 * (Effect.fn names, and each SQL statement keyed by its first words) is timed and summed, and the
 * phase prints the top ones with their count, total and mean. Spans nest, so totals overlap; the
 * point is the per-call cost of each statement and the share of the run it takes. Off by default:
 * the tracer itself costs a little per span.
 */
import { Tracer } from "effect"

interface Tally {
  count: number
  nanos: bigint
}

const tallies = new Map<string, Tally>()

export const spansEnabled = process.env.BENCH_SPANS === "1"

/** `UPDATE ci_builds …` → the statement's first keywords and table, whitespace collapsed. */
const statementKey = (text: string) => text.replace(/\s+/g, " ").trim().replace(/\$\d+/g, "?").slice(0, 90)

class TallySpan extends Tracer.NativeSpan {
  override end(endTime: bigint, exit: Parameters<Tracer.NativeSpan["end"]>[1]) {
    if (this.status._tag === "Started") {
      const text = this.attributes.get("db.query.text")
      const key = typeof text === "string" ? `sql: ${statementKey(text)}` : this.name
      const tally = tallies.get(key) ?? { count: 0, nanos: 0n }
      tally.count++
      tally.nanos += endTime - this.status.startTime
      tallies.set(key, tally)
    }
    super.end(endTime, exit)
  }
}

/** The tracer a phase runs under when BENCH_SPANS=1. */
export const tallyTracer = Tracer.make({ span: (options) => new TallySpan(options) })

/** The top `n` spans since the last call, as lines, and a fresh tally. */
export const takeSpanReport = (n = 25): Array<string> => {
  const lines = [...tallies].sort((a, b) => Number(b[1].nanos - a[1].nanos)).slice(0, n).map(([key, t]) => {
    const ms = Number(t.nanos) / 1e6
    return `${ms.toFixed(0).padStart(8)} ms ${String(t.count).padStart(7)}× ${
      (ms / t.count).toFixed(2).padStart(8)
    } ms  ${key}`
  })
  tallies.clear()
  return lines
}
