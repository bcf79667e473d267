/**
 * Metrics over effect's own metric registry, rendered as Prometheus text by effect's
 * PrometheusMetrics. The process and runtime figures (memory, CPU, active resources, event-loop lag,
 * start time) are not updated by anyone: they are read at each scrape, which is what a scrape should
 * see. The event-loop delay histogram runs while the layer is alive and is reset at each scrape, so
 * its p99 covers the time since the previous scrape.
 */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Metric from "effect/Metric"
import * as PrometheusMetrics from "effect/observability/PrometheusMetrics"
import { monitorEventLoopDelay } from "node:perf_hooks"
import { shadowCapable, VERDICTS } from "../../domain/Shadow.ts"
import {
  directUploadsVanishedTotal,
  eventsPrunedTotal,
  Metrics,
  MISSED_REASONS,
  outboxRelayFailuresTotal,
  outboxRelayOwed,
  OUTCOMES,
  runsTotal,
  shadowOutcomesTotal,
  ticksMissedTotal
} from "../../services/Metrics.ts"

const processResidentMemoryBytes = Metric.gauge("process_resident_memory_bytes", {
  description: "Resident set size in bytes"
})
const processHeapUsedBytes = Metric.gauge("nodejs_heap_used_bytes", { description: "V8 heap in use, bytes" })
const processHeapTotalBytes = Metric.gauge("nodejs_heap_total_bytes", { description: "V8 heap allocated, bytes" })
const processCpuSecondsTotal = Metric.gauge("process_cpu_seconds_total", {
  description: "User plus system CPU time, seconds"
})
const processStartTimeSeconds = Metric.gauge("process_start_time_seconds", {
  description: "Start time of the process, epoch seconds"
})
const eventLoopLagSeconds = Metric.gauge("nodejs_eventloop_lag_p99_seconds", {
  description: "99th percentile event-loop delay since the last scrape, seconds"
})
const activeHandles = Metric.gauge("nodejs_active_resources", {
  description: "Active libuv resources (sockets, timers, …)"
})

const update = <I>(metric: Metric.Metric<I, unknown>, value: I, attributes: Readonly<Record<string, string>> = {}) =>
  Metric.update(Metric.withAttributes(metric, attributes), value)

export const MetricsPrometheus = Layer.effect(
  Metrics,
  Effect.gen(function*() {
    const loopDelay = monitorEventLoopDelay({ resolution: 20 })
    loopDelay.enable()
    yield* Effect.addFinalizer(() => Effect.sync(() => loopDelay.disable()))
    yield* update(processStartTimeSeconds, Math.round((Date.now() - process.uptime() * 1000) / 1000))

    const sampleProcess = Effect.suspend(() => {
      const memory = process.memoryUsage()
      const cpu = process.cpuUsage()
      const lag = loopDelay.percentile(99)
      loopDelay.reset()
      return Effect.all([
        update(processResidentMemoryBytes, memory.rss),
        update(processHeapUsedBytes, memory.heapUsed),
        update(processHeapTotalBytes, memory.heapTotal),
        update(processCpuSecondsTotal, (cpu.user + cpu.system) / 1e6),
        update(activeHandles, process.getActiveResourcesInfo().length),
        update(eventLoopLagSeconds, Number.isFinite(lag) ? lag / 1e9 : 0)
      ], { discard: true })
    })

    return Metrics.of({
      increment: (counter, n, attributes) => n === 0 ? Effect.void : update(counter, n, attributes),
      setGauge: (gauge, value, attributes) => update(gauge, value, attributes),
      observe: (histogram, value, attributes) => update(histogram, value, attributes),
      initialiseSeries: (batches) =>
        Effect.forEach(batches, (batch) =>
          Effect.all([
            Effect.forEach(OUTCOMES, (outcome) => update(runsTotal, 0, { batch, outcome })),
            Effect.forEach(MISSED_REASONS, (reason) => update(ticksMissedTotal, 0, { batch, reason })),
            // At 0 from start-up, so the disagreement alert's increase() sees a batch's first verdicts.
            shadowCapable(batch)
              ? Effect.forEach(VERDICTS, (outcome) => update(shadowOutcomesTotal, 0, { batch, outcome }))
              : Effect.void
          ]), { discard: true }).pipe(
            Effect.andThen(update(eventsPrunedTotal, 0)),
            Effect.andThen(update(directUploadsVanishedTotal, 0)),
            // 0 on one database too (nothing can wait in an outbox there): one alert rule for both layouts.
            Effect.andThen(update(outboxRelayOwed, 0)),
            Effect.andThen(update(outboxRelayFailuresTotal, 0))
          ),
      prometheusText: Effect.andThen(sampleProcess, PrometheusMetrics.format())
    })
  })
)
