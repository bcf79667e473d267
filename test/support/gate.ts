/** Helpers for tests of the health gate. */
import { Effect } from "effect"

/**
 * Lets a forked waiter reach the gate and hear back: its request goes through the gate's actor (a
 * queue, a fiber, a Deferred), a few scheduler turns that a single `yieldNow` does not cover.
 */
export const settled = Effect.repeat(Effect.yieldNow, { times: 20 })
