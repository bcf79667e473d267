/**
 * The whole platform in memory, for program specs under TestClock: memory implementations of every
 * service, the in-memory Redis (`MemoryRedis`) and event store (`MemoryEvents`) exposed for seeding
 * and inspection. Build it inside the test (Effect.provide) so expiry follows the TestClock.
 */
import { Layer } from "effect"
import { MemoryBackends } from "../../src/layers/App.ts"
import { SweeperConfig, type SweeperSettings } from "../../src/layers/Config.ts"
import { BuildsMemory } from "../../src/layers/memory/BuildsMemory.ts"
import { EventLogMemory } from "../../src/layers/memory/EventLogMemory.ts"

export const MemoryPlatform = (settings: Partial<SweeperSettings> = {}) =>
  Layer.mergeAll(BuildsMemory, MemoryBackends, SweeperConfig.layerWith(settings)).pipe(
    Layer.provideMerge(EventLogMemory)
  )
