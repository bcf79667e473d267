/**
 * Seeder for bench/delete-stale-direct-uploads.ts, run as a child process so that nothing of the
 * seeding (a million strings, ioredis's command buffers) stays in the benchmark process's memory and
 * its RSS reflects the batch alone. The fields, objects and pipelining are the simulator's bulk
 * fixture (src/simulator/Fixtures.ts); this wraps it in a process and prints its counts as one JSON line.
 *
 *   node bench/support/seed-pending-direct-uploads.ts '<SeedOptions as JSON>'
 */
import { Redis } from "ioredis"
import {
  type PendingUploadsAtScale,
  type PendingUploadsCounts,
  seedPendingUploadsAtScale
} from "../../src/simulator/Fixtures.ts"

export interface SeedOptions extends PendingUploadsAtScale {
  readonly redisUrl: string
}

export interface SeedCounts extends PendingUploadsCounts {
  readonly seconds: number
  readonly seederPeakRss: number
}

const options = JSON.parse(process.argv[2]!) as SeedOptions

const started = performance.now()
const redis = new Redis(options.redisUrl, { maxRetriesPerRequest: 2 })
const counts = await seedPendingUploadsAtScale(redis, options)
await redis.quit()

const result: SeedCounts = {
  ...counts,
  seconds: (performance.now() - started) / 1000,
  seederPeakRss: process.resourceUsage().maxRSS * 1024
}
console.log(JSON.stringify(result))
