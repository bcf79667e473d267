/**
 * GitLab's exclusive lease: `gitlab:exclusive_lease:<name>` set NX EX to a uuid. Renew
 * and release only touch the key while it still holds our uuid. Each successful acquisition takes a
 * new fencing epoch (monotonic per name), which guarded writes compare so a holder that lost its
 * lease cannot write after a newer holder has.
 *
 * The epoch is `max(stored + 1, Redis TIME in ms)`, kept under a key with a long TTL refreshed on
 * every acquisition (every key Sweeper creates expires). If the key does expire, the
 * clock floor still puts the next epoch above every one handed out before, which is what
 * `sweeper_lease_fences` (the highest epoch written) relies on.
 *
 * A tick claim (`claim`) is the same SET NX EX without an epoch: it is never renewed or fenced, only
 * held until it expires, so it leaves no counter behind.
 */
import * as Context from "effect/Context"
import type * as Duration from "effect/Duration"
import type * as Effect from "effect/Effect"
import type * as Option from "effect/Option"
import type { RedisError } from "../domain/Errors.ts"

// The key forms (`leaseKey`, `epochKey`) are pure rules: domain/Lease.ts.

export interface LeaseHandle {
  readonly name: string
  readonly token: string
  readonly epoch: number
  readonly ttl: Duration.Duration
}

export class Lease extends Context.Service<Lease, {
  /** None when somebody else holds it: an outcome, not an error. */
  tryAcquire(name: string, ttl: Duration.Duration): Effect.Effect<Option.Option<LeaseHandle>, RedisError>
  /** Extends the TTL; false when the lease is no longer ours. */
  renew(handle: LeaseHandle): Effect.Effect<boolean, RedisError>
  /** Deletes the key if it is still ours; false otherwise. */
  release(handle: LeaseHandle): Effect.Effect<boolean, RedisError>
  isHeld(handle: LeaseHandle): Effect.Effect<boolean, RedisError>
  /**
   * A claim that is only ever left to expire (one replica per scheduled tick): SET NX EX under the
   * same key format, no fencing epoch. False when it is already claimed.
   */
  claim(name: string, ttl: Duration.Duration): Effect.Effect<boolean, RedisError>
}>()("sweeper/services/Lease") {}
