/**
 * Seeder for bench/delete-stale-direct-uploads.ts, run as a child process so that nothing of the
 * seeding (a million strings, ioredis's command buffers) stays in the benchmark process's memory and
 * its RSS reflects the batch alone. Fills `pending_direct_uploads` with pipelined HSET in chunks,
 * creates the stale objects that should exist, and prints its counts as one JSON line.
 *
 *   node bench/support/seed-pending-direct-uploads.ts '<SeedOptions as JSON>'
 */
import { Redis } from "ioredis"
import { mkdir, writeFile } from "node:fs/promises"
import { join } from "node:path"

export interface SeedOptions {
  readonly redisUrl: string
  readonly key: string
  readonly entries: number
  /** Every staleEvery-th entry is stale. */
  readonly staleEvery: number
  /** Every invalidEvery-th entry (offset 1) that is not stale has a value that is not a timestamp. */
  readonly invalidEvery: number
  readonly locations: ReadonlyArray<string>
  /** location → object storage root; the first `presentObjects` stale entries get a real (empty) file. */
  readonly roots: Readonly<Record<string, string>>
  readonly presentObjects: number
  readonly fieldsPerHset: number
  readonly hsetsPerPipeline: number
}

export interface SeedCounts {
  readonly stale: number
  readonly fresh: number
  readonly invalid: number
  readonly present: number
  /** Fields plus values, as raw bytes. */
  readonly bytes: number
  readonly seconds: number
  readonly seederPeakRss: number
}

const options = JSON.parse(process.argv[2]!) as SeedOptions

// xorshift32: random-looking hex for the paths without a crypto call per entry.
let state = 0x9e3779b9
const hex24 = () => {
  let out = ""
  for (let k = 0; k < 3; k++) {
    state ^= state << 13
    state ^= state >>> 17
    state ^= state << 5
    out += (state >>> 0).toString(16).padStart(8, "0")
  }
  return out
}

const started = performance.now()
const nowSeconds = Math.floor(Date.now() / 1000)
const counts = { stale: 0, fresh: 0, invalid: 0, present: 0, bytes: 0 }
const redis = new Redis(options.redisUrl, { maxRetriesPerRequest: 2 })
for (const root of Object.values(options.roots)) await mkdir(join(root, "tmp/uploads"), { recursive: true })

let i = 0
while (i < options.entries) {
  const pipeline = redis.pipeline()
  for (let h = 0; h < options.hsetsPerPipeline && i < options.entries; h++) {
    const args: Array<string> = []
    for (let f = 0; f < options.fieldsPerHset && i < options.entries; f++, i++) {
      // GitLab's `<location>:tmp/uploads/<random hex>`; the id prefix keeps every field unique.
      const location = options.locations[i % options.locations.length]!
      const path = `tmp/uploads/${i.toString(16).padStart(8, "0")}${hex24()}`
      const kind = i % options.staleEvery === 0 ? "stale" : i % options.invalidEvery === 1 ? "invalid" : "fresh"
      // Stale: 3 h 1 min to ~7 days old. Fresh: at most 2 h old, so none turns stale during the run.
      const value = kind === "stale"
        ? String(nowSeconds - 10_860 - (i % 604_800))
        : kind === "invalid"
        ? "not-a-timestamp"
        : String(nowSeconds - (i % 7_200))
      const field = `${location}:${path}`
      counts[kind]++
      counts.bytes += field.length + value.length
      args.push(field, value)
      if (kind === "stale" && counts.present < options.presentObjects && options.roots[location] !== undefined) {
        await writeFile(join(options.roots[location], path), "")
        counts.present++
      }
    }
    pipeline.hset(options.key, ...args)
  }
  const results = await pipeline.exec()
  const failed = results?.find(([error]) => error !== null)
  if (failed !== undefined) throw failed[0]
}
await redis.quit()

const result: SeedCounts = {
  ...counts,
  seconds: (performance.now() - started) / 1000,
  seederPeakRss: process.resourceUsage().maxRSS * 1024
}
console.log(JSON.stringify(result))
