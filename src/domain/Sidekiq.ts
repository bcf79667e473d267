/**
 * Sidekiq's wire format, shared by everything that enqueues jobs (SPEC §0.3), so a real Sidekiq
 * consumer can run what Sweeper enqueues.
 */
import { createHash, randomBytes } from "node:crypto"

export interface SidekiqJob {
  readonly class: string
  readonly args: ReadonlyArray<unknown>
  /** 24 lowercase hex characters. */
  readonly jid: string
  readonly queue: string
  readonly retry: true
  /** Float epoch seconds. */
  readonly created_at: number
  readonly enqueued_at: number
  readonly [extra: string]: unknown
}

export const newJid = (): string => randomBytes(12).toString("hex")

export const queueKey = (queue: string) => `queue:${queue}`
export const QUEUES_SET = "queues"
/** Bulk pushes go to Redis in slices of at most this many jobs, one pipeline each. */
export const BULK_PUSH_SLICE = 1000

export const makeJob = (options: {
  readonly workerClass: string
  readonly args: ReadonlyArray<unknown>
  readonly queue: string
  readonly nowMillis: number
  readonly extra?: Readonly<Record<string, unknown>>
}): SidekiqJob => ({
  class: options.workerClass,
  args: options.args,
  jid: newJid(),
  queue: options.queue,
  retry: true,
  created_at: options.nowMillis / 1000,
  enqueued_at: options.nowMillis / 1000,
  ...options.extra
})

/** `until_executed` de-duplication: one pending job per (class, args) for this long. */
export const DUPLICATE_KEY_TTL_SECONDS = 600

export const duplicateKey = (queue: string, workerClass: string, args: ReadonlyArray<unknown>) =>
  `resque:gitlab:duplicate:${queue}:${createHash("sha256").update(`${workerClass}:${JSON.stringify(args)}`).digest("hex")}`
