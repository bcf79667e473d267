/**
 * Throttled concurrency limits (`throttleLimits`): instead of holding concurrency-limit-resume, the
 * rules that throttle step each worker's effective limit down while unhealthy and back up while
 * healthy (domain/Health.ts `throttleStep`), one step per pass, with hysteresis per rule.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { CurrentRun } from "../../domain/Batch.ts"
import {
  type HealthConfig,
  judge,
  throttlesInsteadOfHolding,
  type ThrottleState,
  throttleStep
} from "../../domain/Health.ts"
import type { LimitRequest } from "../../services/HealthGate.ts"
import type { ThrottleReport } from "../../services/HealthReport.ts"
import { concurrencyLimitEffectiveLimit, type Metrics, setGauge } from "../../services/Metrics.ts"
import type { Sampler } from "./HealthSampler.ts"

export interface Throttle {
  /** The worker's limit for this pass; a dry run's leaves the throttle where the real runs put it. */
  readonly effectiveLimit: (request: LimitRequest) => Effect.Effect<number, never, Metrics>
  readonly throttleReports: () => Array<ThrottleReport>
  /** Every configured worker's effective limit gauge at its limit from start-up. */
  readonly seriesAtStart: Effect.Effect<void, never, Metrics>
}

export const makeThrottle = (
  config: HealthConfig,
  throttling: ReadonlySet<string>,
  concurrencyLimits: Readonly<Record<string, { readonly limit: number }>>,
  sampler: Sampler
): Throttle => {
  const throttles = new Map<string, { state: ThrottleState; limit: number; held: Map<string, boolean> }>()

  const effectiveLimit = ({ batch, limit, worker }: LimitRequest) =>
    Effect.gen(function*() {
      if (!config.throttleLimits || !throttling.has(batch)) return limit
      const run = yield* CurrentRun
      const asked = yield* Clock.currentTimeMillis
      if (!run.dryRun) sampler.demanded(asked)
      yield* sampler.ensureFresh(asked, undefined)
      const now = yield* Clock.currentTimeMillis
      const previous = throttles.get(worker)
      const held = new Map(previous?.held ?? [])
      let unhealthy = false
      for (const rule of config.rules.filter(throttlesInsteadOfHolding)) {
        const readings = sampler.readingsFor(rule, batch, now)
        if (readings.length === 0) continue
        const isHeld = judge(rule, held.get(rule.signal) === true, readings, sampler.baselineOf(rule, batch)).held
        held.set(rule.signal, isHeld)
        unhealthy ||= isHeld
      }
      const state = throttleStep(limit, Option.map(Option.fromUndefinedOr(previous), (p) => p.state), unhealthy)
      // A dry run says what the limit would be, and leaves the throttle where the real runs put it.
      if (run.dryRun) return state.effective
      throttles.set(worker, { state, limit, held })
      yield* setGauge(concurrencyLimitEffectiveLimit, state.effective, { worker })
      if (state.effective !== limit) {
        yield* Effect.logInfo("Concurrency limit throttled", { worker, limit, effective: state.effective })
      }
      return state.effective
    })

  const seriesAtStart = Effect.gen(function*() {
    for (const [worker, setting] of Object.entries(concurrencyLimits)) {
      yield* setGauge(concurrencyLimitEffectiveLimit, setting.limit, { worker })
    }
  })

  return {
    effectiveLimit,
    throttleReports: () =>
      [...throttles].map(([worker, t]) => ({ worker, limit: t.limit, effective: t.state.effective })),
    seriesAtStart
  }
}
