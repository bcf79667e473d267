/**
 * delete-stale-direct-uploads without an object store (the fields of a known location with no store
 * configured are removed, as GitLab does): a pending_direct_uploads hash where every fifth entry is
 * older than 3 hours.
 *   raw        HSCAN COUNT 1000, each page's stale fields removed by one pipelined HDEL
 *   per-record GitLab's loop: HSCAN, and one HDEL round trip per stale entry
 * Repaired = fields gone from the hash, whatever the summary calls them.
 */
import { Duration, Effect } from "effect"
import { PENDING_DIRECT_UPLOADS_KEY } from "../../src/domain/DirectUpload.ts"
import { DeleteStaleDirectUploads } from "../../src/programs/DeleteStaleDirectUploads.ts"
import { seedPendingUploadFields } from "../../src/simulator/Fixtures.ts"
import type { PhaseContext, Scenario } from "../support/compare.ts"
import { fmt } from "../support/harness.ts"
import { runOnce } from "./platform.ts"

interface Size {
  readonly entries: number
  readonly staleEvery: number
}

/** Real time: the entries' ages are relative to now, and the batch reads the real clock. */
const nowSeconds = () => Math.floor(Date.now() / 1000)
const STALE_BEFORE_AGE = 3 * 3600

const hlen = (context: PhaseContext) => Effect.promise(() => context.redis.hlen(PENDING_DIRECT_UPLOADS_KEY))

const seed = (size: Size, context: PhaseContext) => seedPendingUploadFields(context.redis, size)

/** Fields removed by `phase`, as HLEN before minus after. */
const removedBy = <E, R>(context: PhaseContext, phase: Effect.Effect<{ readonly seconds?: number }, E, R>) =>
  Effect.gen(function*() {
    const before = yield* hlen(context)
    const { seconds } = yield* phase
    return { repaired: before - (yield* hlen(context)), ...(seconds === undefined ? {} : { seconds }) }
  })

const isStale = (value: string, now: number) => Number(value) < now - STALE_BEFORE_AGE

export const scenario: Scenario<Size> = {
  name: "delete-stale-direct-uploads",
  description: "stale pending_direct_uploads entries removed (no object store)",
  sizes: {
    small: { entries: 20_000, staleEvery: 5 },
    full: { entries: 1_000_000, staleEvery: 5 }
  },
  describeSize: (size) => `${fmt(size.entries)} fields, ${fmt(Math.ceil(size.entries / size.staleEvery))} stale`,
  seed: (size, context) => seed(size, context),

  sweeper: () => (context) =>
    removedBy(
      context,
      Effect.map(
        runOnce(DeleteStaleDirectUploads, context, { budget: Duration.hours(1) }),
        ({ seconds }) => ({ seconds })
      )
    ),

  raw: () => (context) =>
    removedBy(
      context,
      Effect.promise(async () => {
        const now = nowSeconds()
        let cursor = "0"
        do {
          const [next, flat] = await context.redis.hscan(PENDING_DIRECT_UPLOADS_KEY, cursor, "COUNT", 1000)
          const stale: Array<string> = []
          for (let i = 0; i + 1 < flat.length; i += 2) if (isStale(flat[i + 1]!, now)) stale.push(flat[i]!)
          if (stale.length > 0) await context.redis.hdel(PENDING_DIRECT_UPLOADS_KEY, ...stale)
          cursor = next
        } while (cursor !== "0")
        return {}
      })
    ),

  perRecord: () => (context) =>
    removedBy(
      context,
      Effect.promise(async () => {
        const now = nowSeconds()
        let cursor = "0"
        do {
          const [next, flat] = await context.redis.hscan(PENDING_DIRECT_UPLOADS_KEY, cursor, "COUNT", 100)
          for (let i = 0; i + 1 < flat.length; i += 2) {
            if (isStale(flat[i + 1]!, now)) await context.redis.hdel(PENDING_DIRECT_UPLOADS_KEY, flat[i]!)
          }
          cursor = next
        } while (cursor !== "0")
        return {}
      })
    )
}
