/**
 * Sidekiq's wire format, shared by everything that enqueues jobs, so a real Sidekiq
 * consumer can run what Sweeper enqueues. Pure: the jid's randomness comes from effect's `Random`
 * (seedable in tests, like every other input) and the de-duplication digest from the caller.
 */
import * as Effect from "effect/Effect"
import * as Random from "effect/Random"

export interface SidekiqJob {
  readonly class: string
  readonly args: ReadonlyArray<unknown>
  /** 24 lowercase hex characters. */
  readonly jid: string
  readonly queue: string
  /** `true` (Sidekiq's default of 25 retries) or the worker's own count (`sidekiq_options retry: 3`). */
  readonly retry: true | number
  /** Float epoch seconds. */
  readonly created_at: number
  readonly enqueued_at: number
  readonly [extra: string]: unknown
}

/**
 * A jid as Sidekiq makes one (`SecureRandom.hex(12)`): 24 lowercase hex characters, here from six
 * 16-bit draws of effect's Random, taken synchronously — a resume move builds 5000 jids, and 30,000
 * effect steps for them showed in its profile. Also a move's batch id (the same form).
 */
export const jidFrom = (random: Random.Random): string => {
  let jid = ""
  for (let i = 0; i < 6; i++) jid += Math.floor(random.nextDoubleUnsafe() * 0x10000).toString(16).padStart(4, "0")
  return jid
}

/** A jid from the fiber's Random. */
export const newJid: Effect.Effect<string> = Effect.map(Random.Random, jidFrom)

export const queueKey = (queue: string) => `queue:${queue}`
export const QUEUES_SET = "queues"
/** Bulk pushes go to Redis in slices of at most this many jobs, one pipeline each. */
export const BULK_PUSH_SLICE = 1000

/**
 * The one Sidekiq job builder: Sidekiq's keys in Sidekiq's order, then `extra` (job options, or a
 * resumed job's stored context and markers) as further top-level keys.
 */
export const sidekiqJob = (options: {
  readonly workerClass: string
  readonly args: ReadonlyArray<unknown>
  readonly queue: string
  readonly jid: string
  readonly nowMillis: number
  readonly extra?: Readonly<Record<string, unknown>>
}): SidekiqJob => ({
  class: options.workerClass,
  args: options.args,
  jid: options.jid,
  queue: options.queue,
  retry: true,
  created_at: options.nowMillis / 1000,
  enqueued_at: options.nowMillis / 1000,
  ...options.extra
})

/** `until_executed` de-duplication: one pending job per (class, args) for this long. */
export const DUPLICATE_KEY_TTL_SECONDS = 600

/** What GitLab's duplicate-job key digests (SHA-256, hex): `<class>:<JSON args>`. */
export const duplicateDigestInput = (workerClass: string, args: ReadonlyArray<unknown>) =>
  `${workerClass}:${JSON.stringify(args)}`

/** The duplicate-job key, given the SHA-256 hex digest of `duplicateDigestInput`. */
export const duplicateKeyOf = (queue: string, sha256Hex: string) => `resque:gitlab:duplicate:${queue}:${sha256Hex}`
