/**
 * The whole platform in memory, for program specs under TestClock: memory implementations of every
 * service, the in-memory Redis (`MemoryRedis`) and event store (`MemoryEvents`) exposed for seeding
 * and inspection. Build it inside the test (Effect.provide) so expiry follows the TestClock.
 */
import { Layer } from "effect"
import { SweeperConfig, type SweeperSettings, TuningFromConfig } from "../../src/config/Config.ts"
import { BuildsMemory } from "../../src/layers/memory/BuildsMemory.ts"
import { EventLogMemory } from "../../src/layers/memory/EventLogMemory.ts"
import { EventRetentionMemory } from "../../src/layers/memory/EventRetentionMemory.ts"
import { ExportJobsMemory } from "../../src/layers/memory/ExportJobsMemory.ts"
import { ObjectStorageMemory } from "../../src/layers/memory/ObjectStorageMemory.ts"
import { PlatformRecordsMemory } from "../../src/layers/memory/PlatformRecordsMemory.ts"
import { StuckBuildsMemory } from "../../src/layers/memory/StuckBuildsMemory.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { MemoryBackends, RepairSteps } from "../../src/supervisor/App.ts"

export const MemoryPlatform = (settings: Partial<SweeperSettings> = {}) =>
  RepairSteps.pipe(
    Layer.provideMerge(
      Layer.mergeAll(
        BuildsMemory,
        StuckBuildsMemory,
        ExportJobsMemory,
        ObjectStorageMemory(),
        PlatformRecordsMemory,
        EventRetentionMemory,
        MemoryBackends,
        TuningFromConfig,
        MetricsPrometheus
      )
    ),
    // Backends that read configuration (e.g. concurrency limits) get the spec's settings.
    Layer.provideMerge(SweeperConfig.layerWith(settings)),
    Layer.provideMerge(EventLogMemory)
  )
