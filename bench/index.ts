/**
 * `npm run bench -- <name>` runs `bench/<name>.ts` (e.g. `npm run bench -- drop-canceling-builds`).
 * Benchmarks print figures only; they assert nothing about time.
 */
import { readdirSync } from "node:fs"

const available = readdirSync(new URL(".", import.meta.url))
  .filter((file) => file.endsWith(".ts") && file !== "index.ts")
  .map((file) => file.slice(0, -3))

const name = process.argv[2]
if (name === undefined || !available.includes(name)) {
  console.error(`usage: npm run bench -- <name>; available: ${available.join(", ")}`)
  process.exit(2)
}
await import(`./${name}.ts`)
